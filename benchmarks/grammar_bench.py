"""Grammar constraints (push-down): compile time and per-step cost, ours against the peers.

The built-in recursive grammars (JSON of any shape, arithmetic, S-expressions) on the
Gemma 3 vocabulary. Every engine gets the same GBNF text (`constraints/grammars/*.gbnf`,
llama.cpp's format): xgrammar compiles it as is, llguidance gets its own GBNF -> Lark
translation (done once, not timed as compile); `xgrammar_builtin_json` is xgrammar on its
own JSON grammar (much faster for it). Every engine is built from the same token bytes
and walks the same token sequences, so the rows differ only in the engine:

  compile   host compile of the grammar with caches defeated: median and min of N runs
            (warm, and after gc.collect()), plus the first mask after compile.
  step      per decoding step at batch B: fill B masks (one matcher per row), apply them
            to float32 logits [B, V] with the engine's own kernel, advance B matchers.
            Ours is one jitted `mask_logits + advance` on device arrays (push-down tables:
            the stack lives in the state; tables on the device). Median, p99 and max
            per step, over `--repeats` walks (fewer when over `--step-budget-s`). Batch
            sizes > 1 run for `--big-batch-grammars` on `--big-batch-steps`-token
            prefixes, and are skipped for an engine whose batch-1 steps project a walk
            far over budget (xgrammar on json.gbnf: ~4 minutes at batch 64).
  depth     step time of the tokens at nesting depth <= 1 against those at depth >= 20
            (the same payload walked flat and 20 levels deep): a push-down step must not
            grow with the stack. "p99/med of per-token medians" takes each token's
            median over the repeated walks first: machine jitter (one slow step in
            one walk) drops out, a cost that depends on the input so far does not.
            "same, from saved states" (ours, batch 1) times the step at each position
            from the state saved before that token, positions in turn, so that the
            walk loop's own effects drop out too (its first steps are slower whatever
            the token).

Documents are tokenized by greedy longest match (`regex_bench.walk_tokens`), so tokens
cross terminal and rule boundaries (`"},`, `]]`, `((`) as a real tokenizer's would.

Run from the repository root (about 2-3 minutes on the 2-core VM):
  python benchmarks/grammar_bench.py --batch-sizes 1,64 --repeats 5
"""

import argparse
import dataclasses
import json
import os
import platform
import sys
import time

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # Run as a script from a checkout.
try:
  from benchmarks import _gemma_vocab, _peers, regex_bench  # pylint: disable=g-import-not-at-top
except ImportError:
  import _gemma_vocab  # pylint: disable=g-import-not-at-top
  import _peers  # pylint: disable=g-import-not-at-top
  import regex_bench  # pylint: disable=g-import-not-at-top

_GRAMMAR_DIR = os.path.join(_REPO, "constrained_decoding", "constraints", "grammars")
# outlines-core has no grammars; xgrammar_builtin_json is xgrammar on its own JSON grammar.
ENGINES = ("ours", "xgrammar", "xgrammar_builtin_json", "llguidance")
DEEP = 20  # Nesting depth of the deep documents.
_WARMUP_STEPS = 8  # Untimed steps before timing a walk (peers; ours warms up in full).


# -------------------------------------------------------------------------- documents


@dataclasses.dataclass(frozen=True)
class Nesting:
  """How to read nesting depth off a document's text (independent of every engine).

  Attributes:
    opens, closes: Bytes that open / close a nesting level outside strings.
    quotes: Bytes that open and close a string (a doubled quote reopens it at once).
    escape: Whether a backslash escapes the next byte inside strings.
  """

  opens: bytes
  closes: bytes
  quotes: bytes
  escape: bool

  def depths(self, data: bytes) -> np.ndarray:
    """int [len(data) + 1]: open levels before each byte offset."""
    out, depth, quote, escaped = [0], 0, None, False
    for c in data:
      if quote is not None:
        if escaped:
          escaped = False
        elif self.escape and c == 0x5C:
          escaped = True
        elif c == quote:
          quote = None
      elif c in self.quotes:
        quote = c
      elif c in self.opens:
        depth += 1
      elif c in self.closes:
        depth -= 1
      out.append(depth)
    return np.asarray(out)


@dataclasses.dataclass(frozen=True)
class GrammarCase:
  """A built-in grammar and documents of its language to walk through."""

  name: str
  nesting: Nesting
  documents: tuple  # ((label, text), ...)

  def gbnf(self) -> str:
    with open(os.path.join(_GRAMMAR_DIR, f"{self.name}.gbnf"), encoding="utf-8") as f:
      return f.read()


def _nest(payload: str, opener: str, closer: str, times: int) -> str:
  return opener * times + payload + closer * times


_JSON_PAYLOAD = json.dumps({
    "id": 1024, "name": "Ada Lovelace", "email": "ada@example.org", "active": True,
    "score": -12.75, "ratio": 6.02e23, "tags": ["math", "engines"], "spouse": None})
_JSON_NESTED = json.dumps({
    "user": {"id": 7, "roles": ["admin", "dev"], "profile": {
        "age": 36, "langs": [{"code": "en", "level": 5}, {"code": "fr", "level": 3}]}},
    "items": [[1, 2], [3, [4, 5.5]], []], "note": "tab\there \"quoted\" \u00e9t\u00e9",
    "ok": False}, indent=2)
# 20 levels ({"k": [ ... ]} ten times) around the same payload as the flat document.
_JSON_DEEP = _nest(_JSON_PAYLOAD, '{"k": [', "]}", DEEP // 2)

_ARITH_PAYLOAD = "12.5 * 3 + 4 - 7 / 2 * 100 - 0.25 + 8 * 9"
_ARITH_NESTED = "-(1 + 2 * (3 - (4 / (5 + 6.25)))) * (7 - -8) / (9 * (10 + 11))"
_ARITH_DEEP = _nest(_ARITH_PAYLOAD, "(", ")", DEEP)

_SEXPR_PAYLOAD = '(assert (and (>= x 0) (<= y 100) (= s "a""b") (distinct #x1F #b101 z)))'
_SEXPR_NESTED = ("((define-fun max2 ((x Int) (y Int)) Int (ite (>= x y) x y))\n"
                 " (synth-fun f ((x Int)) Int ((Start Int (x 0 1 (+ Start Start) "
                 "(ite (< Start Start) Start Start))))))")
_SEXPR_DEEP = _nest(_SEXPR_PAYLOAD, "(f ", ")", DEEP)

_C_LIKE = Nesting(opens=b"([{", closes=b")]}", quotes=b'"', escape=True)
CASES = (
    GrammarCase("json", _C_LIKE, (("flat", _JSON_PAYLOAD), ("nested", _JSON_NESTED),
                                  (f"depth{DEEP}", _JSON_DEEP))),
    GrammarCase("arithmetic", Nesting(b"(", b")", b"", False),
                (("flat", _ARITH_PAYLOAD), ("nested", _ARITH_NESTED),
                 (f"depth{DEEP}", _ARITH_DEEP))),
    GrammarCase("sexpr", Nesting(b"(", b")", b'"|', False),
                (("flat", _SEXPR_PAYLOAD), ("nested", _SEXPR_NESTED),
                 (f"depth{DEEP}", _SEXPR_DEEP))),
)


@dataclasses.dataclass(frozen=True)
class Walk:
  """One document as a token walk: ids (EOS last) and the nesting depth at each token."""

  label: str
  text: str
  tokens: tuple
  depths: tuple  # per token: open levels before its first byte (EOS: at the end)


def make_walk(token_bytes, case: GrammarCase, label: str, text: str, eos_id: int) -> Walk:
  tokens = regex_bench.walk_tokens(token_bytes, text, eos_id)
  by_offset = case.nesting.depths(text.encode("utf-8"))
  starts = np.cumsum([0] + [len(token_bytes[t]) for t in tokens[:-1]])
  return Walk(label, text, tuple(tokens), tuple(int(by_offset[s]) for s in starts))


# ---------------------------------------------------------------------------- timing


def stats(samples_s) -> dict:
  """Median, p99, max and mean (microseconds) of per-step samples given in seconds."""
  a = np.asarray(samples_s, np.float64).ravel() * 1e6
  if not a.size:
    return None
  return {"median_us": float(np.median(a)), "p99_us": float(np.percentile(a, 99)),
          "max_us": float(a.max()), "mean_us": float(a.mean()), "n": int(a.size)}


def _compile_repeats(compile_fn, wanted: int, budget_s: float) -> int:
  """How many timed compiles fit in `budget_s` (at least 3, at most `wanted`)."""
  compile_fn()  # The first call may do one-time work (imports, caches of the engine).
  start = time.perf_counter()
  compile_fn()
  once = max(time.perf_counter() - start, 1e-6)
  return int(min(wanted, max(3, budget_s / (2 * once))))


class PeerGrammarRunner(regex_bench.PeerRunner):
  """A peer adapter timed on grammar compiles (of our GBNF files) and token walks."""

  def supports(self, case: GrammarCase) -> bool:
    del case
    return True

  def _compile_fn(self, case: GrammarCase):
    """(compile function, extra facts): the peer's compile of the case's grammar."""
    start = time.perf_counter()
    source = self.peer.grammar_source(case.gbnf())
    translate_ms = (time.perf_counter() - start) * 1e3
    return (lambda: self.peer.compile_grammar(source)), {"translate_ms": translate_ms}

  def compile_stats(self, case: GrammarCase, repeats: int, budget_s: float) -> dict:
    compile_fn, facts = self._compile_fn(case)
    repeats = _compile_repeats(compile_fn, repeats, budget_s)
    out = {"compile_repeats": repeats, **facts,
           **regex_bench._timed_compiles(compile_fn, repeats)}  # pylint: disable=protected-access
    bitmask, _ = self.peer.allocate(1)
    first = []
    for _ in range(repeats):
      self._compiled = compile_fn()
      matcher = self.peer.matcher(self._compiled)
      start = time.perf_counter()
      matcher.fill_mask(bitmask, 0)
      first.append(time.perf_counter() - start)
    out["first_fill_us_median"] = float(np.median(first) * 1e6)
    return out

  def step_samples(self, tokens, batch: int, repeats: int, budget_s: float) -> dict:
    """Per-step fill / apply / advance / step seconds, each [repeats', T].

    repeats' <= repeats walks fit in `budget_s` (at least one).
    """
    bitmask, logits = self.peer.allocate(batch)
    # Warm-up on a prefix: torch.compile per shape and the engines' lazy set-up.
    self._walk(tokens[:_WARMUP_STEPS], batch, bitmask, logits)
    runs = []
    for _ in range(repeats):
      if runs and budget_s < np.sum(runs) * (len(runs) + 1) / len(runs):
        break
      with regex_bench._NoGc():  # pylint: disable=protected-access
        runs.append(self._walk(tokens, batch, bitmask, logits))
    a = np.asarray(runs, np.float64)  # [R, T, 3]
    return {"fill": a[..., 0], "apply": a[..., 1], "advance": a[..., 2],
            "step": a.sum(axis=-1)}


class XgrammarBuiltinJsonRunner(PeerGrammarRunner):
  """xgrammar with its own JSON grammar (json case only).

  The same language as `json.gbnf` except that it allows no whitespace around the top
  value (the documents have none); xgrammar is much faster on it than on the GBNF file.
  """

  def __init__(self, vocab):
    super().__init__("xgrammar", vocab)
    self.name = "xgrammar_builtin_json"

  def supports(self, case: GrammarCase) -> bool:
    return case.name == "json"

  def _compile_fn(self, case: GrammarCase):
    del case
    return self.peer.compile_builtin_json, {"grammar_source": "xgrammar builtin JSON grammar"}


class OursGrammarRunner(regex_bench.OursRunner):
  """constrained_decoding: `Compiler.compile_with_info(Grammar.builtin(name))`."""

  def compile_stats(self, case: GrammarCase, repeats: int, budget_s: float) -> dict:
    spec = self.cd.Grammar.builtin(case.name)
    compile_fn = lambda: self.compiler.compile_with_info(spec)
    repeats = _compile_repeats(compile_fn, repeats, budget_s)
    timed = regex_bench._timed_compiles(compile_fn, repeats)  # pylint: disable=protected-access
    out = {"compile_repeats": repeats, **timed}
    results = [compile_fn() for _ in range(3)]  # stage times of a few more compiles
    infos = [info for _, info in results]
    tables, info = results[-1]
    # On the device once, as in a decode loop: numpy tables would be copied in every
    # call (JSON: ~0.5 ms of a ~0.7 ms step at batch 1 here).
    self._tables = self.jax.device_put(tables)
    stages = {k: float(np.median([i.seconds[k] for i in infos]) * 1e3) for k in info.seconds}
    out["tables"] = {
        "stack_depth": int(self._tables.stack_depth), "byte_states": info.byte_states,
        "token_states": info.token_states, "token_edges": info.token_edges,
        "num_groups": info.num_groups, "num_masks": info.num_masks,
        "num_terminals": info.num_terminals, "dropped_paths": info.dropped_paths,
        "nbytes_total": info.nbytes["total"], "nbytes": info.nbytes,
        "stage_ms_median": stages,
        "max_groups_per_state": int(tables.state_groups.shape[1]),
        "before_streamlining": self._unstreamlined_sizes(spec)}
    out["first_fill_us_median"] = None
    return out

  def _unstreamlined_sizes(self, spec) -> dict:
    """Table sizes of the same grammar compiled with `CompileOptions(streamline=False)`."""
    options = dataclasses.replace(self.compiler.options, streamline=False)
    tables, info = self.cd.Compiler(self.compiler.vocab, options).compile_with_info(spec)
    return {"token_edges": info.token_edges, "num_groups": info.num_groups,
            "num_masks": info.num_masks, "nbytes_total": info.nbytes["total"],
            "max_groups_per_state": int(tables.state_groups.shape[1])}

  def first_call(self, batch: int) -> float:
    """Seconds of the first jitted step at this batch size (trace + XLA compile)."""
    jnp, jax = self.jax.numpy, self.jax
    state = self.cd.init_state(self._tables, batch_size=batch)
    logits = jnp.zeros((batch, self.vocab_size), jnp.float32)
    tokens = jnp.zeros((batch,), jnp.int32)
    start = time.perf_counter()
    jax.block_until_ready(self._step(self._tables, state, logits, tokens))
    return time.perf_counter() - start

  def step_samples(self, tokens, batch: int, repeats: int, budget_s: float) -> dict:
    """Per-step seconds of the jitted mask_logits + advance, [repeats', T] (see peers)."""
    jnp, jax = self.jax.numpy, self.jax
    logits = jax.random.normal(jax.random.PRNGKey(0), (batch, self.vocab_size), jnp.float32)
    toks = [jax.device_put(np.full((batch,), t, np.int32)) for t in tokens]
    logits = self._walk(toks, batch, logits)[1]  # Warm-up: compiles for this batch size.
    runs = []
    for _ in range(repeats):
      if runs and budget_s < np.sum(runs) * (len(runs) + 1) / len(runs):
        break
      with regex_bench._NoGc():  # pylint: disable=protected-access
        times, logits = self._walk(toks, batch, logits)
      runs.append(times)
    out = {"step": np.asarray(runs, np.float64)}
    if batch == 1:
      out["position"] = self._position_samples(toks, logits, len(runs))
    return out

  def _position_samples(self, toks, logits, repeats: int) -> np.ndarray:
    """[repeats, T] seconds of the step at each position, each run from the saved state
    before that token, positions in turn: the step's cost as a function of the input
    so far, without the walk loop's own effects (its first steps are slower, whatever
    the token)."""
    jax, jnp = self.jax, self.jax.numpy
    state = self.cd.init_state(self._tables, batch_size=1)
    states = []
    for tok in toks:
      states.append(state)
      _, state = self._step(self._tables, state, jnp.array(logits), tok)
    times = np.zeros((repeats, len(toks)))
    with regex_bench._NoGc():  # pylint: disable=protected-access
      for r in range(repeats):
        for i, (before, tok) in enumerate(zip(states, toks)):
          spare = jax.block_until_ready(jnp.array(logits))  # donated below
          start = time.perf_counter()
          jax.block_until_ready(self._step(self._tables, before, spare, tok))
          times[r, i] = time.perf_counter() - start
    return times


# --------------------------------------------------------------------------- driver


def make_runner(engine: str, vocab):
  """Builds the runner for `engine`; raises ImportError when it is not available."""
  if engine == "ours":
    return OursGrammarRunner(vocab)
  if engine == "xgrammar_builtin_json":
    return XgrammarBuiltinJsonRunner(vocab)
  return PeerGrammarRunner(engine, vocab)


def _depth_stats(walks, step_samples) -> dict:
  """Step time of tokens at depth <= 1 vs depth >= DEEP, over the walks' samples."""
  shallow, deep = [], []
  for walk, samples in zip(walks, step_samples):
    depths = np.asarray(walk.depths)[:samples.shape[1]]  # walks at B > 1 are prefixes
    shallow.append(samples[:, depths <= 1].ravel())
    deep.append(samples[:, depths >= DEEP].ravel())
  return {"depth_le_1": stats(np.concatenate(shallow)),
          f"depth_ge_{DEEP}": stats(np.concatenate(deep))}


def bench_case(runner, case: GrammarCase, walks, args) -> list:
  """Rows for one engine and grammar: compile, the check walk, and steps per batch size."""
  base = {"engine": runner.name, "grammar": case.name}
  batch_sizes = [b for b in args.batch_sizes if b == 1 or case.name in args.big_batch_grammars]
  first_calls = {}
  try:
    comp = runner.compile_stats(case, args.compile_repeats, args.compile_budget_s)
    if hasattr(runner, "first_call"):  # ours: jit compile before anything else runs
      for batch in batch_sizes:
        first_calls[batch] = runner.first_call(batch)
        print(f"  {runner.name} {case.name} B={batch}: first jitted step "
              f"{first_calls[batch]:.1f} s", flush=True)
    counts = {w.label: runner.check_walk(list(w.tokens)) for w in walks}
  except Exception as e:  # pylint: disable=broad-except
    print(f"  {runner.name} {case.name}: FAILED {type(e).__name__}: {e}", flush=True)
    return [dict(base, error=f"{type(e).__name__}: {e}")]
  print(f"  {runner.name} {case.name}: compile {comp['compile_ms_median']:.2f} ms "
        f"(x{comp['compile_repeats']})", flush=True)
  rows = []
  for batch in batch_sizes:
    repeats = args.repeats if batch == 1 else args.big_batch_repeats
    steps = None if batch == 1 else args.big_batch_steps  # a prefix of each document
    projected = _projected_s(rows, batch, sum(len(w.tokens[:steps]) for w in walks))
    if projected > 3 * args.step_budget_s:
      why = (f"skipped: one walk would take ~{projected:.0f} s (B=1 mean step x {batch} "
             f"rows), over 3x --step-budget-s")
      rows.append(dict(base, batch=batch, skipped=why))
      print(f"  {runner.name} {case.name} B={batch}: {why}", flush=True)
      continue
    per_walk = [runner.step_samples(list(w.tokens[:steps]), batch, repeats,
                                    args.step_budget_s / len(walks)) for w in walks]
    repeats = [len(p["step"]) for p in per_walk]
    parts = {k: stats(np.concatenate([p[k].ravel() for p in per_walk]))
             for k in ("fill", "apply", "advance", "step") if k in per_walk[0]}
    row = dict(base, **comp, allowed_counts=counts, batch=batch, repeats=repeats,
               first_jit_call_s=first_calls.get(batch), steps_per_document=steps,
               **{k: parts.get(k) for k in ("fill", "apply", "advance", "step")},
               per_document={w.label: stats(p["step"]) for w, p in zip(walks, per_walk)},
               # Each token's median over the repeated walks: machine jitter (one slow
               # step in one walk) drops out, a cost that depends on the input does not.
               per_token_median=stats(np.concatenate(
                   [np.median(p["step"], axis=0) for p in per_walk])),
               per_position_median=stats(np.concatenate(
                   [np.median(p["position"], axis=0) for p in per_walk]))
               if "position" in per_walk[0] else None,
               **_depth_stats(walks, [p["step"] for p in per_walk]))
    rows.append(row)
    print(f"  {runner.name} {case.name} B={batch}: step median {row['step']['median_us']:.1f}"
          f" us, p99 {row['step']['p99_us']:.1f} us", flush=True)
  return rows


def _projected_s(rows, batch: int, steps: int) -> float:
  """Seconds of one walk of `steps` tokens at `batch`, from the batch-1 mean (fill and
  advance scale with the rows; 0 when there is no batch-1 row)."""
  one = next((r for r in rows if r.get("batch") == 1 and "step" in r), None)
  if one is None or batch == 1:
    return 0.0
  return one["step"]["mean_us"] * 1e-6 * batch * steps


_f = regex_bench._fmt  # pylint: disable=protected-access  (a stat's figure, or —)


def _count_mismatches(rows) -> dict:
  """Per (engine, grammar): steps whose allowed-token count differs from ours."""
  ours = {r["grammar"]: r["allowed_counts"] for r in rows
          if r["engine"] == "ours" and "error" not in r}
  out = {}
  for r in rows:
    if "allowed_counts" not in r or r["grammar"] not in ours:
      continue
    mine = ours[r["grammar"]]
    out[(r["engine"], r["grammar"])] = sum(
        a != b for doc in mine for a, b in zip(mine[doc], r["allowed_counts"][doc]))
  return out


def markdown_tables(rows, unavailable) -> str:
  """Compile, table-size, step and depth tables."""
  mismatches = _count_mismatches(rows)
  lines = ["| engine | grammar | compile ms warm med (min) | after gc.collect med | "
           "first mask us | steps allowed count != ours |", "|---|---|---|---|---|---|"]
  first_rows = {}
  for r in rows:
    first_rows.setdefault((r["engine"], r["grammar"]), r)
  for (engine, grammar), r in first_rows.items():
    if "error" in r:
      lines.append(f"| {engine} | {grammar} | FAILED: {r['error']} | | | |")
      continue
    first = r["first_fill_us_median"]
    lines.append(f"| {engine} | {grammar} | {r['compile_ms_median']:.2f} "
                 f"({r['compile_ms_min']:.2f}) | {r['compile_ms_cold_median']:.2f} | "
                 f"{'—' if first is None else f'{first:.1f}'} | "
                 f"{mismatches.get((engine, grammar), '—')} |")
  lines += ["", "Push-down tables, before -> after streamlining (never-legal groups removed):",
            "", "| grammar | stack D | token states | token edges | groups | max groups "
            "per state | masks | terminals | dropped paths | table bytes | parse / rtn / "
            "compose / pack ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for (engine, grammar), r in first_rows.items():
    if engine != "ours" or "error" in r:
      continue
    t, s = r["tables"], r["tables"]["stage_ms_median"]
    b = t["before_streamlining"]
    lines.append(f"| {grammar} | {t['stack_depth']} | {t['token_states']} | "
                 f"{b['token_edges']} -> {t['token_edges']} | "
                 f"{b['num_groups']} -> {t['num_groups']} | "
                 f"{b['max_groups_per_state']} -> {t['max_groups_per_state']} | "
                 f"{b['num_masks']} -> {t['num_masks']} | "
                 f"{t['num_terminals']} | {t['dropped_paths']} | "
                 f"{b['nbytes_total'] / 2**20:.2f} -> {t['nbytes_total'] / 2**20:.2f} MiB | "
                 f"{s['parse']:.2f} / "
                 f"{s['byte_dfa']:.2f} / {s['compose']:.2f} / {s['pack']:.2f} |")
  lines += ["", f"| engine | grammar | B | fill us med (max) | apply us med | advance us med "
            f"| step us med | step p99 | step max | p99/med | p99/med of per-token medians "
            f"| same, from saved states | step med depth<=1 | step med depth>={DEEP} | "
            f"first jitted step s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if "error" in r:
      continue
    if "skipped" in r:
      lines.append(f"| {r['engine']} | {r['grammar']} | {r['batch']} | {r['skipped']} |"
                   + " |" * 11)
      continue
    step = r["step"]
    fill = "—" if r["fill"] is None else f"{_f(r['fill'])} ({_f(r['fill'], 'max_us')})"
    jit = r["first_jit_call_s"]
    token = r.get("per_token_median")
    token_ratio = "—" if not token else f"{token['p99_us'] / token['median_us']:.2f}"
    saved = r.get("per_position_median")
    saved_ratio = "—" if not saved else f"{saved['p99_us'] / saved['median_us']:.2f}"
    lines.append(
        f"| {r['engine']} | {r['grammar']} | {r['batch']} | {fill} | {_f(r['apply'])} | "
        f"{_f(r['advance'])} | {_f(step)} | {_f(step, 'p99_us')} | {_f(step, 'max_us')} | "
        f"{step['p99_us'] / step['median_us']:.2f} | {token_ratio} | {saved_ratio} | "
        f"{_f(r['depth_le_1'])} | "
        f"{_f(r[f'depth_ge_{DEEP}'])} | {'—' if jit is None else f'{jit:.1f}'} |")
  for name, why in unavailable.items():
    lines.append(f"\n{'constrained_decoding' if name == 'ours' else name}: not available ({why})")
  return "\n".join(lines)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch-sizes", default="1,64",
                      help="comma-separated batch sizes (default 1,64)")
  parser.add_argument("--big-batch-grammars", default="json",
                      help="grammars also timed at batch sizes > 1 (default json)")
  parser.add_argument("--repeats", type=int, default=5,
                      help="walks per (engine, document) at batch 1 (default 5)")
  parser.add_argument("--big-batch-repeats", type=int, default=1,
                      help="walks per (engine, document) at batch > 1 (default 1)")
  parser.add_argument("--big-batch-steps", type=int, default=48,
                      help="at batch > 1, walk only the first N tokens of each document "
                           "(default 48: xgrammar fills 64 masks one by one)")
  parser.add_argument("--step-budget-s", type=float, default=10.0,
                      help="seconds of timed walks per (engine, grammar, batch); fewer "
                           "repeats (at least one walk per document) for slow engines")
  parser.add_argument("--compile-repeats", type=int, default=20,
                      help="most compiles per (engine, grammar), each warm and after gc")
  parser.add_argument("--compile-budget-s", type=float, default=4.0,
                      help="seconds of compiling per (engine, grammar); fewer repeats (at "
                           "least 3) for slow compiles")
  parser.add_argument("--grammars", default=",".join(c.name for c in CASES),
                      help="comma-separated subset of the built-in grammars")
  parser.add_argument("--engines", default=",".join(ENGINES),
                      help=f"comma-separated subset of {','.join(ENGINES)}")
  parser.add_argument("--out", default=os.path.join(_REPO, "benchmarks", "results",
                                                    "grammar_bench.json"))
  args = parser.parse_args(argv)
  args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
  args.engines = [e for e in args.engines.split(",") if e]
  args.grammars = [g for g in args.grammars.split(",") if g]
  args.big_batch_grammars = [g for g in args.big_batch_grammars.split(",") if g]
  unknown = (set(args.engines) - set(ENGINES)) | (
      set(args.grammars) - {c.name for c in CASES})
  if unknown:
    parser.error(f"unknown engines or grammars {sorted(unknown)}; expected engines among "
                 f"{ENGINES} and grammars among {[c.name for c in CASES]}")
  return args


def main(argv=None):
  args = parse_args(argv)
  started = time.perf_counter()
  vocab = _gemma_vocab.gemma_token_bytes()
  cases = [c for c in CASES if c.name in args.grammars]
  walks = {c.name: [make_walk(vocab.token_bytes, c, label, text, vocab.eos_ids[0])
                    for label, text in c.documents] for c in cases}
  rows, engines, unavailable = [], {}, {}
  for engine in args.engines:
    try:
      runner = make_runner(engine, vocab)
    except ImportError as e:
      unavailable[engine] = str(e)
      print(f"{engine}: not available ({e})", flush=True)
      continue
    engines[engine] = runner.info
    print(f"{engine}: setup {runner.info}", flush=True)
    for case in cases:
      if not getattr(runner, "supports", lambda c: True)(case):
        continue
      rows += bench_case(runner, case, walks[case.name], args)
  print()
  print(markdown_tables(rows, unavailable))
  meta = {"vocabulary": "Gemma 3 (GGUF), 262144 tokens", "eos_ids": vocab.eos_ids,
          "repeats": args.repeats, "big_batch_repeats": args.big_batch_repeats,
          "compile_repeats_max": args.compile_repeats,
          "compile_budget_s": args.compile_budget_s, "batch_sizes": args.batch_sizes,
          "step_budget_s": args.step_budget_s,
          "big_batch_grammars": args.big_batch_grammars,
          "big_batch_steps": args.big_batch_steps,
          "python": platform.python_version(), "machine": platform.machine(),
          "cpu_count": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
          "load_average": os.getloadavg(),
          "threads": "peers: 1 (torch intra-op, xgrammar max_threads); ours: XLA default",
          "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
          "grammars": "constrained_decoding/constraints/grammars/<name>.gbnf for every "
                      "engine (llguidance: its own GBNF -> Lark translation)",
          "timing": "per step, for the whole batch; step = fill + apply + advance (peers), "
                    "one jitted mask_logits + advance, block_until_ready (ours)",
          "documents": {c.name: [dataclasses.asdict(w) for w in walks[c.name]] for c in cases},
          "wall_s": time.perf_counter() - started}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump({"meta": meta, "engines": engines, "unavailable": unavailable, "results": rows},
              f, indent=1)
  print(f"\nwrote {args.out} ({meta['wall_s']:.0f} s)")


if __name__ == "__main__":
  main()
