"""Regex constraints: compile time and per-step masking cost, ours against the peers.

The paper's three regexes (multiple choice, ISO date-time, IPv4) on the Gemma 3
vocabulary. Every engine is built from the same token bytes and walks the same valid
token sequence, so the rows differ only in the engine:

  compile   host compile of the regex with caches defeated: median and min of N runs,
            plus the first mask after compile (llguidance does lazy work there).
  step      per decoding step at batch B: fill B masks (one matcher per row), apply them
            to float32 logits [B, V] with the engine's own kernel, advance B matchers.
            Ours is one jitted `mask_logits + advance` on device arrays.

Regex semantics: our library reads `\\d` as ASCII [0-9]; peers get `\\d` rewritten to
`[0-9]` (llguidance and outlines-core would otherwise read Unicode Nd).

Run from the repository root (no network needed once the model package is installed):
  python benchmarks/regex_bench.py --batch-sizes 1,8,64 --repeats 10
"""

import argparse
import dataclasses
import gc
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
  from benchmarks import _gemma_vocab, _peers  # pylint: disable=g-import-not-at-top
except ImportError:
  import _gemma_vocab  # pylint: disable=g-import-not-at-top
  import _peers  # pylint: disable=g-import-not-at-top


@dataclasses.dataclass(frozen=True)
class RegexCase:
  """One benchmark constraint and a string of its language to walk through."""

  name: str
  pattern: str
  target: str


CASES = (
    RegexCase("multiple_choice", "Red|Orange|Yellow|Green|Blue|Indigo|Violet", "Indigo"),
    RegexCase("iso_datetime",
              r"\d{4}-[01]\d-[0-3]\dT[0-2]\d:[0-5]\d:[0-5]\d([+][0-2]\d:[0-5]\d|Z)",
              "2026-11-21T23:45:09+01:00"),
    RegexCase("ipv4", r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)",
              "192.168.100.254"),
)
ENGINES = ("ours",) + _peers.PEER_NAMES
REGEX_NOTE = ("\\d is ASCII [0-9] for every engine: ours by default, peers via a rewrite "
              "of \\d to [0-9] (llguidance and outlines-core read \\d as Unicode Nd otherwise).")


# ------------------------------------------------------------------------- token walk


def walk_tokens(token_bytes, target: str, eos_id: int) -> list:
  """A valid token sequence for `target`: greedy longest token at each position, then EOS.

  Any token that is a prefix of the rest of a string in the language keeps the walk on a
  viable prefix, so no engine is needed to choose. Among tokens with identical bytes the
  highest id wins (a normal piece over its byte-fallback twin, as SentencePiece would).
  """
  ids = {}
  for i, t in enumerate(token_bytes):
    if t:
      ids[t] = i  # Ascending ids: the last (highest) one wins.
  max_len = max(len(t) for t in ids)
  data, out, pos = target.encode("utf-8"), [], 0
  while pos < len(data):
    for n in range(min(max_len, len(data) - pos), 0, -1):
      if data[pos:pos + n] in ids:
        out.append(ids[data[pos:pos + n]])
        pos += n
        break
    else:
      raise ValueError(f"No token covers byte {pos} of {target!r}")
  return out + [eos_id]


# ---------------------------------------------------------------------------- timing


class _NoGc:
  """Context: garbage collection off while timing (as `timeit` does), collected before
  (unless `collect` is False: inside a longer timing, where collecting between walks
  frees the 64 MB batch-64 logits buffers and makes the next walk fault them in again)."""

  def __init__(self, collect: bool = True):
    self._collect = collect

  def __enter__(self):
    if self._collect:
      gc.collect()
    self._was = gc.isenabled()
    gc.disable()

  def __exit__(self, *exc):
    if self._was:
      gc.enable()


def _us(seconds) -> float:
  return float(seconds) * 1e6


def _summary(samples_s) -> dict:
  """Median and p99 (microseconds) of per-step samples given in seconds."""
  a = np.asarray(samples_s, dtype=np.float64) * 1e6
  return {"median_us": float(np.median(a)), "p99_us": float(np.percentile(a, 99)),
          "n": int(a.size)}


def _allowed_count(bitmask_row: np.ndarray, vocab_size: int) -> np.ndarray:
  """Unpacks one int32 bitmask row to a bool vector of length vocab_size."""
  bits = np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")
  return bits[:vocab_size].astype(bool)


class PeerRunner:
  """Times one peer adapter (see `_peers`) on compile and on token walks."""

  def __init__(self, name, vocab):
    self.name = name
    self.peer = _peers.make_peer(name, vocab.token_bytes, vocab.eos_ids, vocab.vocab_size)
    self.info = dict(self.peer.info)

  def pattern(self, case: RegexCase) -> str:
    return _peers.ascii_digits(case.pattern)

  def compile_stats(self, case: RegexCase, repeats: int) -> dict:
    """Compile `repeats` times (caches defeated); also time the first mask after each."""
    pattern = self.pattern(case)
    bitmask, _ = self.peer.allocate(1)
    stats = _timed_compiles(lambda: self.peer.compile(pattern), repeats)
    first_fill_s = []
    for _ in range(repeats):
      compiled = self.peer.compile(pattern)
      matcher = self.peer.matcher(compiled)
      start = time.perf_counter()
      matcher.fill_mask(bitmask, 0)
      first_fill_s.append(time.perf_counter() - start)
    self._compiled = compiled
    return {"pattern_used": pattern, **stats,
            "first_fill_us_median": _us(np.median(first_fill_s))}

  def check_walk(self, tokens) -> list:
    """Walks once at batch 1, checking each token is allowed; returns allowed counts."""
    bitmask, _ = self.peer.allocate(1)
    view = self.peer.bitmask_numpy(bitmask)
    matcher, counts = self.peer.matcher(self._compiled), []
    for step, tok in enumerate(tokens):
      matcher.fill_mask(bitmask, 0)
      allowed = _allowed_count(view[0], self.peer.vocab_size)
      counts.append(int(allowed.sum()))
      if not allowed[tok]:
        raise AssertionError(f"{self.name}: token {tok} not allowed at step {step}")
      if step == len(tokens) - 1 and not matcher.is_accepting:
        raise AssertionError(f"{self.name}: not accepting before EOS")
      matcher.advance(tok)
    return counts

  def step_stats(self, tokens, batch: int, repeats: int) -> dict:
    """Per-step fill / apply / advance times over `repeats` walks at batch `batch`."""
    bitmask, logits = self.peer.allocate(batch)
    self._walk(tokens, batch, bitmask, logits)  # Warm-up (and torch.compile per shape).
    fill, apply, adv, total = [], [], [], []
    for _ in range(repeats):
      with _NoGc():
        times = self._walk(tokens, batch, bitmask, logits)
      for f, a, d in times:
        fill.append(f)
        apply.append(a)
        adv.append(d)
        total.append(f + a + d)
    return {"fill": _summary(fill), "apply": _summary(apply), "advance": _summary(adv),
            "step": _summary(total)}

  def _walk(self, tokens, batch, bitmask, logits):
    """One walk with fresh matchers (built outside the timed regions)."""
    matchers = [self.peer.matcher(self._compiled) for _ in range(batch)]
    clock, apply_fn, times = time.perf_counter, self.peer.apply, []
    for tok in tokens:
      t0 = clock()
      for row, m in enumerate(matchers):
        m.fill_mask(bitmask, row)
      t1 = clock()
      apply_fn(logits, bitmask)
      t2 = clock()
      for m in matchers:
        m.advance(tok)
      t3 = clock()
      times.append((t1 - t0, t2 - t1, t3 - t2))
    return times


def _timed_compiles(compile_fn, repeats: int) -> dict:
  """Compile times, median and min in ms: back to back (warm) and after gc.collect().

  gc.collect() walks every live object (the 262k-token vocabularies included) and
  leaves the CPU caches cold, which roughly doubles Python-heavy compiles; both
  figures are reported for every engine.
  """
  out = {}
  for label, collect in (("warm", False), ("cold", True)):
    seconds = []
    for _ in range(repeats):
      if collect:
        gc.collect()
      start = time.perf_counter()
      compile_fn()
      seconds.append(time.perf_counter() - start)
    ms = np.asarray(seconds) * 1e3
    out[f"compile_ms_{label}_median"] = float(np.median(ms))
    out[f"compile_ms_{label}_min"] = float(ms.min())
  out["compile_ms_median"] = out["compile_ms_warm_median"]
  out["compile_ms_min"] = out["compile_ms_warm_min"]
  return out


class OursRunner:
  """Times constrained_decoding through its public API (guarded: it may not exist yet).

  Raises ImportError from the constructor when the API is not there, so the benchmark
  prints "constrained_decoding: not available" and carries on with the peers.
  """

  name = "ours"

  def __init__(self, vocab):
    import importlib  # pylint: disable=import-outside-toplevel
    cd = importlib.import_module("constrained_decoding")
    missing = [n for n in ("Vocabulary", "Compiler", "Regex", "init_state", "mask_logits",
                           "advance") if not hasattr(cd, n)]
    if missing:
      raise ImportError(f"constrained_decoding has no {', '.join(missing)} yet")
    import jax  # pylint: disable=import-outside-toplevel
    self.cd, self.jax, self.vocab_size = cd, jax, vocab.vocab_size
    start = time.perf_counter()
    self.vocab = self._vocabulary(vocab)
    vocab_s = time.perf_counter() - start
    options, self._cache_note = self._no_cache_options()
    start = time.perf_counter()
    self.compiler = cd.Compiler(self.vocab, options) if options else cd.Compiler(self.vocab)
    self.info = {"vocab_setup_s": vocab_s, "compiler_setup_s": time.perf_counter() - start,
                 "compiler_setup_no_disk_cache_s": self._uncached_setup_s(options),
                 "vocab_source": self.vocab_source, "compile_cache": self._cache_note,
                 "jax": jax.__version__, "device": str(jax.devices()[0])}
    # Logits donated: XLA masks in place, as the peers' kernels do.
    self._step = jax.jit(self._step_fn, donate_argnums=(2,))
    self._probe()

  def _probe(self):
    """Compiles a trivial regex, so a half-landed library reads as not available."""
    try:
      self.compiler.compile(self.cd.Regex("a|b"))
    except (ImportError, NotImplementedError) as e:
      raise ImportError(f"compiling a trivial regex failed: {type(e).__name__}: {e}") from e

  def _vocabulary(self, vocab):
    """The same token bytes the peers get; from_gguf only if from_token_bytes is absent."""
    voc = self.cd.Vocabulary
    if hasattr(voc, "from_token_bytes"):
      self.vocab_source = "from_token_bytes"
      return voc.from_token_bytes(vocab.token_bytes, eos_ids=vocab.eos_ids,
                                  vocab_size=vocab.vocab_size)
    self.vocab_source = "from_gguf"
    return voc.from_gguf(vocab.path)

  def _uncached_setup_s(self, options):
    """Seconds for `Compiler(vocab)` with its per-vocabulary disk cache off (None if no option)."""
    if options is None or not hasattr(options, "cache_dir"):
      return None
    start = time.perf_counter()
    self.cd.Compiler(self.vocab, dataclasses.replace(options, cache_dir=None))
    return time.perf_counter() - start

  def _no_cache_options(self):
    """`CompileOptions` that turn off in-memory reuse of compiled tables, and a note.

    The per-vocabulary work done by `Compiler(vocab)` (and its disk cache) is setup, like
    the peers' tokenizer objects, and is timed separately.
    """
    import inspect  # pylint: disable=import-outside-toplevel
    options = getattr(self.cd, "CompileOptions", None)
    if options is None:
      return None, "no CompileOptions: repeats may hit a cache"
    params = inspect.signature(options).parameters
    for flag in ("memoize", "cache"):
      if flag in params:
        return options(**{flag: False}), f"disabled: CompileOptions({flag}=False)"
    return None, "no cache option found: repeats may hit a cache"

  def _step_fn(self, tables, state, logits, tokens):
    """One decoding step's constraint work: mask the logits, then advance the state."""
    masked = self.cd.mask_logits(tables, state, logits)
    return masked, self.cd.advance(tables, state, tokens)

  def pattern(self, case: RegexCase) -> str:
    return case.pattern  # \d is ASCII by default.

  def compile_stats(self, case: RegexCase, repeats: int) -> dict:
    """Host compile `repeats` times with the cache disabled."""
    stats = _timed_compiles(lambda: self.compiler.compile(self.cd.Regex(case.pattern)),
                            repeats)
    self.use_tables(self.compiler.compile(self.cd.Regex(case.pattern)))
    return {"pattern_used": case.pattern, **stats, "first_fill_us_median": None}

  def use_tables(self, tables) -> None:
    """The tables `check_walk` and `step_stats` run on, put on the device once, as in a
    decode loop (numpy tables would be copied into every jitted call)."""
    self._tables = self.jax.device_put(tables)

  def check_walk(self, tokens) -> list:
    """Walks once at batch 1 checking each token survives masking; returns allowed counts."""
    jnp = self.jax.numpy
    state = self.cd.init_state(self._tables, batch_size=1)
    counts = []
    for step, tok in enumerate(tokens):
      logits = jnp.zeros((1, self.vocab_size), jnp.float32)
      masked, state = self._step(self._tables, state, logits, jnp.asarray([tok], jnp.int32))
      allowed = np.isfinite(np.asarray(masked[0]))
      counts.append(int(allowed.sum()))
      if not allowed[tok]:
        raise AssertionError(f"ours: token {tok} not allowed at step {step}")
    if hasattr(state, "error") and bool(np.asarray(state.error).any()):
      raise AssertionError("ours: error flag set after the walk")
    return counts

  def step_stats(self, tokens, batch: int, repeats: int) -> dict:
    """Per-step time of the jitted mask_logits + advance, blocked until ready."""
    return {"fill": None, "apply": None, "advance": None,
            "step": _summary(self.step_times(tokens, batch, repeats))}

  def step_times(self, tokens, batch: int, repeats: int, collect: bool = True) -> list[float]:
    """Seconds per step of `repeats` walks through `tokens` (after a warm-up walk);
    `collect`: garbage-collect before each walk (see `_NoGc`)."""
    jnp, jax = self.jax.numpy, self.jax
    logits = jax.random.normal(jax.random.PRNGKey(0), (batch, self.vocab_size), jnp.float32)
    toks = [jax.device_put(np.full((batch,), t, np.int32)) for t in tokens]
    logits = self._walk(toks, batch, logits)[1]  # Warm-up: compiles for this batch size.
    total = []
    for _ in range(repeats):
      with _NoGc(collect):
        times, logits = self._walk(toks, batch, logits)
        total.extend(times)
    return total

  def _walk(self, toks, batch, logits):
    state = self.jax.block_until_ready(self.cd.init_state(self._tables, batch_size=batch))
    clock, step, tables, times = time.perf_counter, self._step, self._tables, []
    for tok in toks:
      t0 = clock()
      logits, state = step(tables, state, logits, tok)  # the masked logits, in place
      self.jax.block_until_ready((logits, state))
      times.append(clock() - t0)
    return times, logits


# --------------------------------------------------------------------------- driver


def make_runner(engine: str, vocab):
  """Builds the runner for `engine`; raises ImportError when it is not installed."""
  if engine == "ours":
    return OursRunner(vocab)
  return PeerRunner(engine, vocab)


def bench_engine(runner, cases, tokens_by_case, batch_sizes, repeats, compile_repeats):
  """All measurements for one engine: a list of result rows (one per regex and batch)."""
  rows = []
  for case in cases:
    tokens = tokens_by_case[case.name]
    base = {"engine": runner.name, "regex": case.name, "steps": len(tokens)}
    try:
      comp = runner.compile_stats(case, compile_repeats)
      base.update(comp, allowed_counts=runner.check_walk(tokens))
    except Exception as e:  # pylint: disable=broad-except
      rows.append(dict(base, error=f"{type(e).__name__}: {e}"))
      print(f"  {runner.name} {case.name}: FAILED {type(e).__name__}: {e}", flush=True)
      continue
    for batch in batch_sizes:
      row = dict(base, batch=batch, **runner.step_stats(tokens, batch, repeats))
      rows.append(row)
      print(f"  {runner.name} {case.name} B={batch}: compile {comp['compile_ms_median']:.2f} ms,"
            f" step {row['step']['median_us']:.1f} us", flush=True)
  return rows


def _fmt(stat, key="median_us") -> str:
  return "—" if stat is None else f"{stat[key]:.1f}"


def markdown_tables(rows, unavailable) -> str:
  """Compile table (one row per engine x regex) and step table (per batch size)."""
  lines = ["| engine | regex | compile ms warm med (min) | compile ms after gc.collect med | first mask us | allowed per step |",
           "|---|---|---|---|---|---|"]
  seen = set()
  for r in rows:
    key = (r["engine"], r["regex"])
    if key in seen:
      continue
    seen.add(key)
    if "error" in r:
      lines.append(f"| {r['engine']} | {r['regex']} | FAILED: {r['error']} | | | |")
      continue
    first = r["first_fill_us_median"]
    lines.append(f"| {r['engine']} | {r['regex']} | {r['compile_ms_median']:.2f} "
                 f"({r['compile_ms_min']:.2f}) | {r['compile_ms_cold_median']:.2f} | "
                 f"{'—' if first is None else f'{first:.1f}'} | {r['allowed_counts']} |")
  lines += ["", "| engine | regex | B | fill us med | advance us med | apply us med | "
            "step us med | step us p99 |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if "error" not in r:
      lines.append(f"| {r['engine']} | {r['regex']} | {r['batch']} | {_fmt(r['fill'])} | "
                   f"{_fmt(r['advance'])} | {_fmt(r['apply'])} | {_fmt(r['step'])} | "
                   f"{_fmt(r['step'], 'p99_us')} |")
  for name, why in unavailable.items():
    lines.append(f"\n{'constrained_decoding' if name == 'ours' else name}: not available ({why})")
  return "\n".join(lines)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch-sizes", default="1,8,64",
                      help="comma-separated batch sizes (default 1,8,64)")
  parser.add_argument("--repeats", type=int, default=10,
                      help="token walks per (engine, regex, batch) (default 10)")
  parser.add_argument("--compile-repeats", type=int, default=10,
                      help="compiles per (engine, regex), at least 10 for reported figures")
  parser.add_argument("--engines", default=",".join(ENGINES),
                      help=f"comma-separated subset of {','.join(ENGINES)}")
  parser.add_argument("--out", default=os.path.join(_REPO, "benchmarks", "results",
                                                    "regex_bench.json"))
  args = parser.parse_args(argv)
  args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
  args.engines = [e for e in args.engines.split(",") if e]
  unknown = set(args.engines) - set(ENGINES)
  if unknown:
    parser.error(f"unknown engines {sorted(unknown)}; expected a subset of {ENGINES}")
  return args


def main(argv=None):
  args = parse_args(argv)
  vocab = _gemma_vocab.gemma_token_bytes()
  tokens_by_case = {c.name: walk_tokens(vocab.token_bytes, c.target, vocab.eos_ids[0])
                    for c in CASES}
  print(REGEX_NOTE, flush=True)
  rows, engines, unavailable = [], {}, {}
  for engine in args.engines:
    try:
      runner = make_runner(engine, vocab)
    except ImportError as e:
      unavailable[engine] = str(e)
      label = "constrained_decoding" if engine == "ours" else engine
      print(f"{label}: not available ({e})", flush=True)
      continue
    engines[engine] = runner.info
    print(f"{engine}: setup {runner.info}", flush=True)
    rows += bench_engine(runner, CASES, tokens_by_case, args.batch_sizes, args.repeats,
                         args.compile_repeats)
  print()
  print(markdown_tables(rows, unavailable))
  meta = {"regex_semantics": REGEX_NOTE, "vocabulary": "Gemma 3 (GGUF), 262144 tokens",
          "eos_ids": vocab.eos_ids, "repeats": args.repeats,
          "compile_repeats": args.compile_repeats, "batch_sizes": args.batch_sizes,
          "python": platform.python_version(), "machine": platform.machine(),
          "cpu_count": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
          "threads": "peers: 1 (torch intra-op, xgrammar max_threads); ours: XLA default",
          "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
          "timing": "per step, for the whole batch; step = fill + apply + advance (peers), "
                    "one jitted mask_logits + advance, block_until_ready (ours)",
          "cases": [dict(dataclasses.asdict(c), tokens=tokens_by_case[c.name]) for c in CASES]}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump({"meta": meta, "engines": engines, "unavailable": unavailable, "results": rows},
              f, indent=1)
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
