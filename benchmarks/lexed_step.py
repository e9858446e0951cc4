"""Per-step device cost of a grammar with a lexer (issue 18, increment 3), vs JSON.

```sh
.venv/bin/python benchmarks/lexed_step.py              # prints a table and JSON
.venv/bin/python benchmarks/lexed_step.py --batch-sizes 1 --rounds 1   # smoke
.venv/bin/python benchmarks/lexed_step.py --cases python,json          # some cases
.venv/bin/python benchmarks/lexed_step.py --cases python --python-walks 2 --batch-sizes 1
# before/after: the runtime of another commit, timed interleaved in the same process
git show e9745df~1:constrained_decoding/runtime/_lexed.py > /tmp/lexed_before.py
.venv/bin/python benchmarks/lexed_step.py --cases sql,python,go,json --rounds 2 \
    --baseline-runtime /tmp/lexed_before.py --out benchmarks/results/lexed_step.json
```

`--baseline-runtime FILE` loads FILE as a second `runtime/_lexed.py` (its own
`tables_from_arrays` on the same compiled arrays; `FILE,LANES` with the
`runtime/_lexed_lanes.py` of the same commit, from 30efa83 on; `FILE,LANES,TABLES` with
its `lexed_tables.py` too, needed for commits before 6fb3b0f) and times it as case `<name>@base`
beside each grammar with a lexer, checking that both give the same masks and states on
the first batch of every size. `--out` writes the JSON report (with the command line and
the load average before and after each batch size: this machine is shared).

On an accelerator lent for a few minutes (no pynini, no GGUF: see `device_kit.py`), the
work splits in two: `--save-kit DIR` compiles the cases here and writes their arrays
(compressed), the walks' tokens and the JSON grammar's tables to DIR; `--kit DIR` times
them there with nothing but jax and numpy. Each row also reports `jit_s`, the first call
of the jitted step at that batch size (trace + compile + run), since a design that
shortens the step can lengthen the compile (see docs/lexer_runtime.md).

```sh
.venv/bin/python benchmarks/lexed_step.py --cases sql,python,go,json --save-kit .devkit/lexed
python3 benchmarks/lexed_step.py --kit .devkit/lexed --batch-sizes 1,8,64,256 --out $OUT/l.json
```

`--first-call N` measures only the first call instead: each lexed case (and `@base`)
at each batch size in a fresh process (the jit cache is per process, and in one process
the first case compiled also pays for JAX's shared helpers: 0.3-0.6 s CPU for Python at
batch 1), N interleaved repeats; CPU seconds of trace + lower, XLA compile and the run,
and the compiled HLO's instruction count (JAX's persistent compilation cache must be off).

`--decode-step` times the decode loop's form instead (`allowed_bits_and_advance`, then
its `step`), which differs in how it keeps the lanes' stacks (`_lexed.FUSED_LANES_MAX`).

`--python-walks N` also checks the Python tables with the Gemma vocabulary as the test
suite does with a small one (too slow there): N rounds of 16 random walks of 80 tokens
(closing tokens favoured in the second half), every finished text must pass
`ast.parse`, and the mask must equal the host reference on ~500 tokens at a few states.

With the Gemma 3 vocabulary (262,144 tokens):

  sql   `constraints/grammars/sql_select_lexed.lark` compiled by
        `constraints/_lexed_grammar.compile_lexed_grammar` and stepped by
        `runtime/_lexed.py` (lexer-state x token outcomes + canonical LR(1) lanes).
  python `constraints/grammars/python_lexed.lark` with `Indentation()` (newline
        lexemes per width, the indentation stack in the row's registers), same runtime.
  go    `constraints/grammars/go.lark` with `Semicolons()` (automatic semicolons),
        start `source_file`, stack depth 96 (as `tests/runtime/lexed_go_test.py`).
  json  the built-in JSON grammar (`cd.Grammar.builtin("json")`, the flat token-level
        push-down automaton of `runtime/_runtime.py`), the design's point of comparison.

Each walks valid texts by greedy longest tokens (`regex_bench.walk_tokens`); every
state of the walks is timed (row r of a batch at state (j + r) mod n), one jitted call
of `allowed_bits` + `advance` by the text's token, blocked until ready, best of
`--rounds` interleaved passes; a row reports median / p90 / max over the states (ms),
and the median of the calls' CPU time (`time.process_time`, all threads: steadier than
wall time on a shared machine).
"""

import argparse
import importlib.util
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import constrained_decoding as cd  # noqa: E402
from constrained_decoding.runtime import _lexed  # noqa: E402
from constrained_decoding.runtime import _lexed_lanes  # noqa: E402

SQL_TEXTS = [
    "SELECT name, count(*) AS n FROM users AS u LEFT JOIN orders AS o ON u.id = o.uid"
    " WHERE u.age >= 18 AND NOT (o.total IS NULL) GROUP BY name ORDER BY n DESC LIMIT 10;",
    "select distinct a.b, 'it''s', 1.5e3 * price from t where x <> 'y' or z is not null",
]
PYTHON_TEXTS = [
    "def mean(xs: list[float], default: float = 0.0) -> float:\n"
    "    \"\"\"Average of xs, or default when empty.\"\"\"\n"
    "    if not xs:\n        return default\n    total = 0.0\n"
    "    for i, x in enumerate(xs):\n        if x is None:\n            continue\n"
    "        total += x  # running sum\n    return total / len(xs)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    "    def push(self, item):\n        self.items.append(item)\n\n"
    "    def pop(self):\n        try:\n            return self.items.pop()\n"
    "        except IndexError:\n            raise ValueError('empty') from None\n",
]
GO_TEXTS = [
    "package main\n\nimport \"fmt\"\n\nfunc sum(xs []int) int {\n\ttotal := 0\n"
    "\tfor _, x := range xs {\n\t\tif x > 0 {\n\t\t\ttotal += x\n\t\t}\n\t}\n"
    "\treturn total\n}\n\nfunc main() {\n\tfmt.Println(sum([]int{1, -2, 3}))\n}\n",
]
JSON_TEXTS = [
    '{"name": "Ada", "tags": ["x", "y"], "age": 36, "ok": true, "nested": {"a": [1, 2,'
    ' {"b": null}]}}',
]


# `--decode-step`: time `allowed_bits_and_advance` and its `step` (what the decode loop
# of `sampling/_loop.py` compiles) instead of `allowed_bits` + `advance`.
_DECODE_STEP = False


def _step_of(module, tables, state, tokens):
  """The timed step of a runtime module: mask and next state."""
  if _DECODE_STEP:
    bits, step = module.allowed_bits_and_advance(tables, state)
    return bits, step(tokens)
  return module.allowed_bits(tables, state), module.advance(tables, state, tokens)


@jax.jit
def _lexed_step(tables, state, tokens):
  return _step_of(_lexed, tables, state, tokens)


@jax.jit
def _lexed_mask(tables, state, tokens):
  del tokens
  return _lexed.allowed_bits(tables, state)


@jax.jit
def _lexed_advance(tables, state, tokens):
  return _lexed.advance(tables, state, tokens)


@jax.jit
def _flat_step(tables, state, tokens):
  return cd.runtime.allowed_bits(tables, state), cd.runtime.advance(tables, state, tokens)


def _states(init, step, tables, walks):
  """Per state of the walks (single rows): (state, token)."""
  out = []
  for tokens in walks:
    state = init(tables, 1)
    for t in tokens:
      out.append((state, t))
      _, state = step(tables, state, jnp.asarray([t], jnp.int32))
    if not bool(state.done[0]) or bool(state.error[0]):  # the text must be accepted
      raise AssertionError(f"walk of {len(tokens)} tokens not accepted")
  return out


def _python_walks(vocab, arrays, tables, rounds, seed=0):
  """Random walks over the Python tables' masks (see the module docstring)."""
  import ast  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top
  from constrained_decoding.constraints import _lexed_grammar  # pylint: disable=g-import-not-at-top
  reference = _lexed_grammar.LexedReference(arrays)
  allowed_fn, advance_fn = jax.jit(_lexed.allowed_tokens), jax.jit(_lexed.advance)
  eos = vocab.eos_ids[0]
  ids = {b: i for i, b in enumerate(vocab.token_bytes) if b}
  closers = np.array([ids[b] for b in (b")", b"]", b"}", b"\n", b"0", b"x", b" ", b":",
                                       b"\n    ", b" pass", b"\n\n") if b in ids])
  rng = np.random.default_rng(seed)
  batch, steps = 16, 80
  finished, mismatches, checked = [], 0, 0
  for _ in range(rounds):
    state = _lexed.init_state(tables, batch)
    texts, row0 = [b""] * batch, reference.start()
    for step in range(steps):
      allowed = np.asarray(allowed_fn(tables, state))
      done = np.asarray(state.done)
      if step % 15 == 5 and not done[0]:
        sample = np.concatenate([rng.choice(vocab.vocab_size, 400, replace=False),
                                 rng.choice(np.nonzero(allowed[0])[0], 100), [eos]])
        for t in sample.tolist():
          checked += 1
          mismatches += allowed[0, t] != (reference.advance(row0, t) is not None)
      tokens = np.full(batch, eos, np.int32)
      late = step > steps // 2
      for r in range(batch):
        if done[r]:
          continue
        live = np.nonzero(allowed[r])[0]
        if not len(live):
          raise AssertionError(f"dead end after {texts[r]!r}")
        if allowed[r, eos] and late and rng.random() < 0.5:
          finished.append(texts[r])
          continue
        good = closers[allowed[r, closers]]
        pool = good if late and len(good) and rng.random() < 0.8 else live[live != eos]
        tokens[r] = rng.choice(pool)
        texts[r] += vocab.token_bytes[tokens[r]]
      if not done[0] and tokens[0] != eos:
        row0 = reference.advance(row0, int(tokens[0]))
      state = advance_fn(tables, state, jnp.asarray(tokens))
  failures = 0
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for text in finished:
      try:
        ast.parse(text.decode("utf-8"))
      except (SyntaxError, ValueError):
        failures += 1
  out = {"finished": len(finished), "ast_failures": failures,
         "mask_checks": checked, "mask_mismatches": int(mismatches)}
  print("python walks:", out)
  return out


def _load_module(name, path):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _load_runtime(paths):
  """A second copy of `runtime/_lexed.py` (another commit's version) from `paths`:
  `_lexed.py`, or `_lexed.py,_lexed_lanes.py` for a runtime split in two (since
  30efa83), whose `_lexed.py` then imports that `_lexed_lanes.py`, not this tree's;
  a third file is that commit's `lexed_tables.py` (needed before 6fb3b0f, whose
  derived lane tables replaced `state_first_items`)."""
  lexed, *rest = paths.split(",")
  if not rest and "_lexed_lanes" in open(lexed).read():
    raise SystemExit(f"--baseline-runtime {paths}: this _lexed.py imports _lexed_lanes; "
                     "give its own as well: --baseline-runtime OLD_lexed.py,OLD_lanes.py")
  modules = dict(zip(("constrained_decoding.runtime._lexed_lanes",
                      "constrained_decoding.lexed_tables"), rest))
  saved = {name: sys.modules.get(name) for name in modules}
  try:
    for name, path in reversed(list(modules.items())):  # the tables first
      sys.modules[name] = _load_module(name.rpartition(".")[2] + "_baseline", path)
    return _load_module("lexed_baseline", lexed)
  finally:
    for name, module in saved.items():
      if module is not None:
        sys.modules[name] = module


def _same(a, b):
  return all(bool(jnp.all(x == y)) for x, y in zip(jax.tree_util.tree_leaves(a),
                                                   jax.tree_util.tree_leaves(b)))


def _batch(states, j, b):
  rows = [states[(j + r) % len(states)] for r in range(b)]
  state = jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *[s for s, _ in rows])
  return state, jnp.asarray([t for _, t in rows], jnp.int32)


_FLAT_INIT = lambda t, b: cd.runtime.init_state(t, b)  # noqa: E731


def _compile_cases(wanted, report, python_walks, base):
  """Compiles the wanted cases here: {name: (init, step, tables)}, their walks, and
  per lexed case its `LexedArrays` (for `--save-kit`)."""
  from constrained_decoding import models  # pylint: disable=g-import-not-at-top
  from constrained_decoding.constraints import _lexed_grammar  # pylint: disable=g-import-not-at-top
  from benchmarks import regex_bench  # pylint: disable=g-import-not-at-top
  vocab = cd.Vocabulary.from_gguf(models.default_gguf_path())
  eos = vocab.eos_ids[0]
  if base is not None:
    base_step = _base_step(base)
  grammars = os.path.join(os.path.dirname(HERE), "constrained_decoding", "constraints",
                          "grammars")
  cases, walks, compiled = {}, {}, {}
  lexed = {"sql": ("sql_select_lexed.lark", SQL_TEXTS, {}),
           "python": ("python_lexed.lark", PYTHON_TEXTS,
                      dict(start="file_input", indentation=_lexed_grammar.Indentation())),
           "go": ("go.lark", GO_TEXTS,
                  dict(start="source_file", stack_depth=96,
                       semicolons=_lexed_grammar.Semicolons()))}
  for name, (file, texts, options) in lexed.items():
    if name not in wanted:
      continue
    source = open(os.path.join(grammars, file)).read()
    t0 = time.perf_counter()
    arrays = _lexed_grammar.compile_lexed_grammar(source, vocab, **options)
    compile_s = time.perf_counter() - t0
    report[f"{name}_tables"] = {"compile_s": round(compile_s, 2), "bytes": arrays.nbytes,
                                "shapes": arrays.shapes}
    print(f"{name}: compile {compile_s:.2f} s, {arrays.nbytes['total'] / 2**20:.1f} MiB")
    compiled[name] = arrays
    cases[name] = (_lexed.init_state, _lexed_step, _lexed.tables_from_arrays(arrays))
    if name == "python" and python_walks:
      report["python_walks"] = _python_walks(vocab, arrays, cases[name][2], python_walks)
    walks[name] = [regex_bench.walk_tokens(vocab.token_bytes, t, eos) for t in texts]
    if base is not None:
      cases[name + "@base"] = (base.init_state, base_step, base.tables_from_arrays(arrays))
      walks[name + "@base"] = walks[name]
  if "json" in wanted:
    t0 = time.perf_counter()
    flat = cd.Compiler(vocab).compile(cd.Grammar.builtin("json"))
    report["json_tables"] = {"compile_s": round(time.perf_counter() - t0, 2)}
    cases["json"] = (_FLAT_INIT, _flat_step, flat)
    walks["json"] = [regex_bench.walk_tokens(vocab.token_bytes, t, eos) for t in JSON_TEXTS]
  return cases, walks, compiled, vocab


def _save_kit(kit, cases, walks, compiled, vocab, report):
  """Writes what `--kit` needs: per lexed case its arrays (npz, compressed), the JSON
  grammar's tables file, the walks, and the compile report."""
  os.makedirs(kit, exist_ok=True)
  for name, arrays in compiled.items():
    np.savez_compressed(
        os.path.join(kit, f"{name}.npz"),
        **{f: getattr(arrays, f) for f in arrays.ARRAY_FIELDS},
        vocab_size=arrays.vocab_size, stack_depth=arrays.stack_depth,
        indent_depth=arrays.indent_depth)
  if "json" in cases:
    cases["json"][2].save(os.path.join(kit, "json.cdt"), vocab=vocab)
  with open(os.path.join(kit, "kit.json"), "w") as f:
    json.dump({"walks": {k: walks[k] for k in cases}, "compiled_here": report}, f,
              default=str)
  total = sum(os.path.getsize(os.path.join(kit, n)) for n in os.listdir(kit))
  print(f"kit {kit}: {total / 2**20:.1f} MiB")


def _load_kit(kit, report, names, base=None):
  """The cases `names` (None: all) of a kit written by `--save-kit`, with nothing but jax and numpy
  (and each lexed case again as `<name>@base` under the runtime module `base`)."""
  with open(os.path.join(kit, "kit.json")) as f:
    saved = json.load(f)
  report["compiled_elsewhere"] = saved["compiled_here"]
  cases = {}
  for name in saved["walks"]:
    if names is not None and name not in names:
      continue
    if name == "json":
      # On the device once: numpy tables would be copied to it at every call.
      cases[name] = (_FLAT_INIT, _flat_step, jax.device_put(
          cd.load_tables(os.path.join(kit, "json.cdt"), vocab=None)))
      continue
    with np.load(os.path.join(kit, f"{name}.npz")) as z:
      sizes = {f: int(z[f]) for f in ("vocab_size", "stack_depth", "indent_depth")}
      fields = {f: jnp.asarray(z[f]) for f in z.files if f not in sizes}
    # On the device once, the derived tables (numpy) included: numpy leaves would be
    # copied at every call (Python's lane prefixes: ~0.1 ms a step at batch 1).
    cases[name] = (_lexed.init_state, _lexed_step,
                   jax.device_put(_lexed.LexedTables(**sizes, **fields)))
    if base is not None:
      cases[name + "@base"] = (base.init_state, _base_step(base),
                               jax.device_put(base.LexedTables(**sizes, **fields)))
  walks = saved["walks"]
  walks.update({k: walks[k[:-5]] for k in cases if k.endswith("@base")})
  return cases, walks


def _first_call(cases, walks, name, b):
  """CPU seconds of the first call of case `name`'s jitted step at batch `b` (in this
  process, which must have compiled nothing else): trace + lower, compile, run; and the
  compiled HLO's instruction count."""
  init, step, tables = cases[name]
  state = init(tables, b)
  tokens = jnp.full((b,), walks[name][0][0], jnp.int32)
  jax.block_until_ready((tables, state, tokens))
  c0 = time.process_time()
  lowered = step.lower(tables, state, tokens)
  c1 = time.process_time()
  compiled = lowered.compile()
  c2 = time.process_time()
  jax.block_until_ready(compiled(tables, state, tokens))
  c3 = time.process_time()
  instructions = sum(1 for line in compiled.as_text().splitlines() if " = " in line)
  return {"lower_cpu_s": round(c1 - c0, 3), "compile_cpu_s": round(c2 - c1, 3),
          "run_cpu_s": round(c3 - c2, 4), "first_cpu_s": round(c3 - c0, 3),
          "hlo_instructions": instructions}


def _first_calls(args, argv, names, report):
  """`--first-call N`: each case's first call at each batch size, in fresh processes
  (`--first-call-child`), N rounds interleaved over the cases, every other round in
  reverse order (the order of a pair moved the difference between them by a few %
  here); the median per row."""
  import subprocess  # pylint: disable=g-import-not-at-top
  own = list(sys.argv[1:] if argv is None else argv)
  keep = []
  skip = False
  for a in own:  # this command line without --first-call N, --batch-sizes B, --cases C
    if skip:
      skip = False
    elif a in ("--first-call", "--batch-sizes", "--cases", "--out"):
      skip = True
    elif not a.startswith(("--first-call=", "--batch-sizes=", "--cases=", "--out=")):
      keep.append(a)
  runs = {}
  for r in range(args.first_call):
    for b in [int(x) for x in args.batch_sizes.split(",")]:
      for name in names if r % 2 == 0 else names[::-1]:  # a fresh process drifts too
        cmd = [sys.executable, os.path.abspath(__file__), *keep,
               "--cases", name.removesuffix("@base"), "--first-call-child", f"{name}:{b}"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        row["load"] = round(os.getloadavg()[0], 2)
        runs.setdefault(f"{name}/B={b}", []).append(row)
        print(f"{name:11s} B={b:3d}  " + "  ".join(f"{k} {v}" for k, v in row.items()),
              flush=True)
  for key, rows in runs.items():
    report["cases"][key] = {
        "first_call_runs": rows,
        **{f"median_{k}": float(np.median([r[k] for r in rows])) for k in rows[0]}}
  return report


def _base_step(base):
  return jax.jit(lambda t, s, k: _step_of(base, t, s, k))


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch-sizes", default="1,8,64")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--cases", default=None,
                      help="comma-separated (default sql,python,json; with --kit, every case of the kit)")
  parser.add_argument("--python-walks", type=int, default=0)
  parser.add_argument("--baseline-runtime", default=None)
  parser.add_argument("--save-kit", default=None,
                      help="compile the cases, write them to this folder and stop")
  parser.add_argument("--kit", default=None,
                      help="time the cases of a folder written by --save-kit")
  parser.add_argument("--parts", action="store_true",
                      help="also time allowed_bits and advance of lexed cases apart")
  parser.add_argument("--lane-unroll", type=int, default=None,
                      help="micro-steps per lane-loop iteration off CPU (runtime default: "
                           "_lexed_lanes.LANE_UNROLL)")
  parser.add_argument("--lane-pool", default=None,
                      help="lane schedule: 0 = every lane in one loop, n = a work queue of "
                           "n x ceil(sqrt(B)) slots; 'cpu:N' or 'default:N' (off CPU) or "
                           "N for both (runtime default: _lexed_lanes.LANE_POOL)")
  parser.add_argument("--decode-step", action="store_true",
                      help="time allowed_bits_and_advance + its step (the decode loop's "
                           "form) instead of allowed_bits + advance")
  parser.add_argument("--first-call", type=int, default=0,
                      help="measure only the first call (trace, compile, run: CPU s) of "
                           "each case in fresh processes, this many rounds (needs --kit)")
  parser.add_argument("--first-call-child", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  if (args.first_call or args.first_call_child) and not args.kit:
    raise SystemExit("--first-call needs --kit")
  if jax.config.jax_compilation_cache_dir and (args.first_call or args.first_call_child):
    raise SystemExit("--first-call: JAX's persistent compilation cache is on "
                     f"({jax.config.jax_compilation_cache_dir}): the compile would be read")
  global _DECODE_STEP
  _DECODE_STEP = args.decode_step
  if args.lane_unroll is not None:
    _lexed_lanes.LANE_UNROLL = {**_lexed_lanes.LANE_UNROLL, "default": args.lane_unroll}
  if args.lane_pool is not None:
    platform, _, value = args.lane_pool.rpartition(":")
    platforms = [platform] if platform else list(_lexed_lanes.LANE_POOL)
    _lexed_lanes.LANE_POOL = {**_lexed_lanes.LANE_POOL, **{p: int(value) for p in platforms}}
  report = {"device": str(jax.devices()[0]),
            "command": " ".join(["benchmarks/lexed_step.py"] + list(
                sys.argv[1:] if argv is None else argv)),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "jax": jax.__version__, "lane_unroll": _lexed_lanes.LANE_UNROLL,
            "lane_pool": _lexed_lanes.LANE_POOL,
            "cases": {}, "load_average": {}}
  base = _load_runtime(args.baseline_runtime) if args.baseline_runtime else None
  if args.kit:
    cases, walks = _load_kit(args.kit, report,
                             None if args.cases is None else set(args.cases.split(",")), base)
    if args.first_call_child:
      name, b = args.first_call_child.split(":")
      print(json.dumps(_first_call(cases, walks, name, int(b))))
      return
    if args.first_call:
      report = _first_calls(args, argv, [k for k in cases if cases[k][1] is not _flat_step],
                            report)
      print(json.dumps(report, indent=1, default=str))
      if args.out:
        with open(args.out, "w") as f:
          json.dump(report, f, indent=1, default=str)
      return
  else:
    names = (args.cases or "sql,python,json").split(",")
    cases, walks, compiled, vocab = _compile_cases(names, report, args.python_walks, base)
    if args.save_kit:
      _save_kit(args.save_kit, cases, walks, compiled, vocab, report)
      return
  states = {k: _states(init, step, tables, walks[k])
            for k, (init, step, tables) in cases.items()}
  if args.parts:  # the two halves of each lexed step, timed apart on the same states
    for k, (init, step, tables) in list(cases.items()):
      if step is _lexed_step:
        for part, fn in ((":mask", _lexed_mask), (":advance", _lexed_advance)):
          cases[k + part], states[k + part] = (init, fn, tables), states[k]
  for b in [int(x) for x in args.batch_sizes.split(",")]:
    load_before = os.getloadavg()
    best = {k: np.full(len(states[k]), np.inf) for k in cases}
    best_cpu = {k: np.full(len(states[k]), np.inf) for k in cases}
    batches = {k: [_batch(states[k], j, b) for j in range(len(states[k]))] for k in cases}
    outs = {}
    jit_s = {}
    jax.clear_caches()  # the walks already compiled batch 1
    for k, (_, step, tables) in cases.items():  # trace, compile and run once
      t0 = time.perf_counter()
      outs[k] = jax.block_until_ready(step(tables, *batches[k][0]))
      jit_s[k] = time.perf_counter() - t0
    for k in cases:
      if k.endswith("@base") and not _same(outs[k], outs[k[:-5]]):
        raise AssertionError(f"{k} and {k[:-5]} differ at batch {b}")
    for _ in range(args.rounds):
      for k, (_, step, tables) in cases.items():
        for j, (state, tokens) in enumerate(batches[k]):
          t0, c0 = time.perf_counter(), time.process_time()
          jax.block_until_ready(step(tables, state, tokens))
          best[k][j] = min(best[k][j], time.perf_counter() - t0)
          best_cpu[k][j] = min(best_cpu[k][j], time.process_time() - c0)
    for k in cases:
      ms = best[k] * 1e3
      report["cases"][f"{k}/B={b}"] = {
          "states": len(ms), "median_ms": round(float(np.median(ms)), 3),
          "p90_ms": round(float(np.percentile(ms, 90)), 3), "max_ms": round(float(ms.max()), 3),
          "cpu_median_ms": round(float(np.median(best_cpu[k])) * 1e3, 3),
          "jit_s": round(jit_s[k], 2)}
      print(f"{k:11s} B={b:3d}  median {np.median(ms):7.3f} ms  p90 "
            f"{np.percentile(ms, 90):7.3f}  max {ms.max():7.3f}  cpu median "
            f"{np.median(best_cpu[k]) * 1e3:7.3f}  ({len(ms)} states, "
            f"first call {jit_s[k]:.2f} s)")
    report["load_average"][f"B={b}"] = {"before": [round(x, 2) for x in load_before],
                                        "after": [round(x, 2) for x in os.getloadavg()]}
    print(f"load average {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}")
  print(json.dumps(report, indent=1, default=str))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
  main()
