"""Counted repetitions at scale: compile time, table bytes and step time against n.

```sh
.venv/bin/python benchmarks/scale_bench.py            # writes benchmarks/results/scale_bench.json
.venv/bin/python benchmarks/scale_bench.py --sizes 10,100,1000,10000 --batch-sizes 1,64
```

For `[^"]{0,n}`, `\\w{1,n}`, `.{0,n}`, `[a-z]{1,n}`, JSON Schema `{"type": "string",
"maxLength": n}`, the unbounded `{"type": "string", "minLength": n}` and `[a-z]{n,}`,
and chains inside larger constraints (a string property with `maxLength` n in an
object, one with `minLength` n, an array of such strings, a GSM-style answer
`[^#\\n]{0,n}\\n#### -?\\d{1,6}`) with the Gemma 3 vocabulary: compile ms (median of 5, caches warm as
in a serving process: the per-vocabulary trie and class counts are set-up; in
parentheses, the first compile of a new chain shape, its compressed automaton not yet
cached), table bytes, whether the counted path (`automata/_counting.py`) was taken, and the device
step (mask fill + `mask_logits` on [B, V] float32 + `advance`, one jitted call) against
the plain regex `[a-z]+` as the baseline. Rows marked "(plain)" compile the same spec
with `CompileOptions(counted_chains=False)` (plain composition: the "before"), for
n <= --max-plain-n. A constraint that exceeds a budget is reported with its error.

CPU time of a new shape (`shape_cpu_ms`: best of 5 in this process, the per-vocabulary
and per-class caches warm, the compressed chain not) is less noisy than wall time on a
shared machine; `--fresh-processes K` also measures the first compile of each spec in K
fresh processes (disk caches warm, nothing in memory: `first_cpu_ms`, the best).
`--digests OUT.json` only writes the sha256 of every table field per spec (a before /
after check that a change keeps the tables: `--compare A.json B.json`).
"""

import argparse
import json
import os
import dataclasses
import hashlib
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import constrained_decoding as cd  # pylint: disable=g-import-not-at-top,wrong-import-position
from constrained_decoding.automata import _counting  # pylint: disable=g-import-not-at-top,wrong-import-position
from constrained_decoding.models import default_gguf_path  # pylint: disable=g-import-not-at-top,wrong-import-position


def _specs(n: int):
  return {
      "maxLength": cd.JsonSchema({"type": "string", "maxLength": n}),
      '[^"]{0,n}': cd.Regex('[^"]{0,%d}' % n),
      r"\w{1,n}": cd.Regex(r"\w{1,%d}" % n),
      ".{0,n}": cd.Regex(".{0,%d}" % n),
      "[a-z]{1,n}": cd.Regex("[a-z]{1,%d}" % n),
      # Unbounded chains (`X{n,}`): counted up to n, then the strip.
      "minLength": cd.JsonSchema({"type": "string", "minLength": n}),
      "[a-z]{n,}": cd.Regex("[a-z]{%d,}" % n),
      # Chains inside larger constraints (`automata/_embedded_chains.py`).
      "object {name: maxLength}": cd.JsonSchema({
          "type": "object", "required": ["name"],
          "properties": {"name": {"type": "string", "maxLength": n},
                         "id": {"type": "integer"}}}),
      "object {password: minLength}": cd.JsonSchema({
          "type": "object", "required": ["user", "password"],
          "properties": {"user": {"type": "string"},
                         "password": {"type": "string", "minLength": n}}}),
      "array of maxLength": cd.JsonSchema({"type": "array",
                                           "items": {"type": "string", "maxLength": n}}),
      # Counted in a register word (`maxItems` of items that are themselves chains).
      "maxItems": cd.JsonSchema({"type": "array", "maxItems": n,
                                 "items": {"type": "string", "maxLength": 10}}),
      r"[^#\n]{0,n}\n#### -?\d{1,6}": cd.Regex(r"[^#\n]{0,%d}\n#### -?\d{1,6}" % n),
  }


@jax.jit
def _step(tables, state, logits, tokens):
  masked = cd.mask_logits(tables, state, logits)
  return masked, cd.advance(tables, state, tokens)


def _step_us(tables, batch: int, repeats: int = 30) -> float:
  tables = jax.device_put(tables)
  state = cd.init_state(tables, batch_size=batch)
  logits = jnp.zeros((batch, tables.vocab_size), jnp.float32)
  allowed = np.asarray(cd.allowed_tokens(tables, state))[0]
  token = int(np.flatnonzero(allowed)[0])
  tokens = jnp.full((batch,), token, jnp.int32)
  jax.block_until_ready(_step(tables, state, logits, tokens))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(_step(tables, state, logits, tokens))
    times.append(time.perf_counter() - t)
  return statistics.median(times) * 1e6


def _digest(tables) -> str:
  """sha256 of every field of `tables` (name, dtype, shape and bytes of arrays)."""
  h = hashlib.sha256()
  for field in dataclasses.fields(tables):
    a = np.asarray(getattr(tables, field.name))
    h.update(f"{field.name}:{a.dtype}:{a.shape}".encode())
    h.update(a.tobytes() if a.dtype != object else repr(a).encode())
  return h.hexdigest()


def _new_shape_cpu_ms(compiler, spec, repeats: int = 5) -> float:
  """Best CPU ms of compiling `spec` with no compressed chain cached."""
  best = float("inf")
  for _ in range(repeats):
    _counting._COMPRESSED_CACHE.clear()  # pylint: disable=protected-access
    t = time.process_time()
    compiler.compile_with_info(spec)
    best = min(best, time.process_time() - t)
  return best * 1e3


def _first_cpu_ms(name: str, n: int, processes: int) -> float | None:
  """Best CPU ms of the first compile of spec `name` at `n` over fresh processes."""
  times = []
  for _ in range(processes):
    out = subprocess.run([sys.executable, __file__, "--first-compile", f"{name}={n}"],
                         capture_output=True, text=True, check=False)
    if out.returncode == 0 and out.stdout.strip():
      times.append(float(out.stdout.split()[-1]))
  return min(times) if times else None


def _first_compile(arg: str) -> None:
  """In this fresh process: load the vocabulary, then print the CPU ms of one compile."""
  name, n = arg.rsplit("=", 1)
  vocab = cd.Vocabulary.from_gguf(default_gguf_path())
  compiler = cd.Compiler(vocab, cd.CompileOptions(memoize=False, max_seconds=30))
  spec = _specs(int(n))[name]
  t = time.process_time()
  compiler.compile(spec)
  print(f"{(time.process_time() - t) * 1e3:.2f}")


def _digests(sizes, out: str) -> None:
  vocab = cd.Vocabulary.from_gguf(default_gguf_path())
  compiler = cd.Compiler(vocab, cd.CompileOptions(memoize=False, max_seconds=30))
  result = {}
  for n in sizes:
    for name, spec in _specs(n).items():
      try:
        result[f"{name} n={n}"] = _digest(compiler.compile(spec))
      except cd.ConstraintError as e:
        result[f"{name} n={n}"] = type(e).__name__
      print(f"{name} n={n} {result[f'{name} n={n}'][:16]}", flush=True)
  with open(out, "w") as f:
    json.dump(result, f, indent=1)


def _compare(a: str, b: str) -> None:
  with open(a) as f:
    first = json.load(f)
  with open(b) as f:
    second = json.load(f)
  differ = sorted(k for k in first.keys() | second.keys() if first.get(k) != second.get(k))
  print(f"{len(first.keys() & second.keys()) - len(differ)} of {len(first.keys() | second.keys())}"
        " identical")
  for k in differ:
    print(f"  differs: {k}")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--sizes", default="2,5,10,20,40,80,100,1000,10000")
  parser.add_argument("--fresh-processes", type=int, default=0,
                      help="also time each spec's first compile in this many fresh processes")
  parser.add_argument("--digests", metavar="OUT.json",
                      help="only write the sha256 of every table field per spec")
  parser.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                      help="compare two --digests files")
  parser.add_argument("--first-compile", help=argparse.SUPPRESS)
  parser.add_argument("--batch-sizes", default="1,64")
  parser.add_argument("--max-plain-n", type=int, default=20,
                      help="also compile n up to this with counted_chains=False (before)")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                     "scale_bench.json"))
  args = parser.parse_args(argv)
  sizes = [int(x) for x in args.sizes.split(",")]
  if args.first_compile:
    return _first_compile(args.first_compile)
  if args.compare:
    return _compare(*args.compare)
  if args.digests:
    return _digests(sizes, args.digests)
  batches = [int(x) for x in args.batch_sizes.split(",")]
  vocab = cd.Vocabulary.from_gguf(default_gguf_path())
  compiler = cd.Compiler(vocab, cd.CompileOptions(memoize=False, max_seconds=30))
  plain = cd.Compiler(vocab, cd.CompileOptions(memoize=False, max_seconds=30,
                                               counted_chains=False))
  baseline = compiler.compile(cd.Regex("[a-z]+"))
  rows = [dict(name="[a-z]+ (baseline)", n=None, compile_ms=None, counted=False,
               nbytes=cd.tables_nbytes(baseline)["total"] if hasattr(cd, "tables_nbytes")
               else None, step_us={b: _step_us(baseline, b) for b in batches})]
  for n in sizes:
    for name, spec in _specs(n).items():
      row = dict(name=name, n=n)
      try:
        compiler.compile_with_info(spec)  # Warm the per-class caches.
        _counting._COMPRESSED_CACHE.clear()  # pylint: disable=protected-access
        t = time.perf_counter()
        compiler.compile_with_info(spec)  # A new shape (per-vocabulary caches warm).
        row["shape_ms"] = (time.perf_counter() - t) * 1e3
        row["shape_cpu_ms"] = _new_shape_cpu_ms(compiler, spec)
        if args.fresh_processes:
          row["first_cpu_ms"] = _first_cpu_ms(name, n, args.fresh_processes)
        times = []
        for _ in range(5):
          t = time.perf_counter()
          tables, info = compiler.compile_with_info(spec)
          times.append(time.perf_counter() - t)
        row.update(compile_ms=statistics.median(times) * 1e3, nbytes=info.nbytes["total"],
                   states=info.token_states, edges=info.token_edges,
                   counted=bool(tables.token_counts.shape[0]),
                   step_us={b: _step_us(tables, b) for b in batches})
      except cd.ConstraintError as e:  # Budgets: reported, not fatal.
        row.update(error=f"{type(e).__name__}: {str(e)[:120]}")
      rows.append(row)
      print(_line(row, batches), flush=True)
      if n <= args.max_plain_n and row.get("counted"):  # Before: plain composition.
        before = dict(name=name + " (plain)", n=n)
        try:
          t = time.perf_counter()
          tables, info = plain.compile_with_info(spec)
          before.update(compile_ms=(time.perf_counter() - t) * 1e3,
                        nbytes=info.nbytes["total"], states=info.token_states,
                        edges=info.token_edges, counted=False,
                        step_us={b: _step_us(tables, b) for b in batches})
        except cd.ConstraintError as e:
          before.update(error=f"{type(e).__name__}: {str(e)[:120]}")
        rows.append(before)
        print(_line(before, batches), flush=True)
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(dict(device=str(jax.devices()[0]), date=time.strftime("%Y-%m-%d %H:%M UTC",
                                                                    time.gmtime()),
                   rows=rows), f, indent=1)
  print("\n| constraint | n | compile ms (new shape; CPU) | table MiB | counted | "
        + " | ".join(f"step us B={b}" for b in batches) + " |")
  print("|---|---|---|---|---|" + "---|" * len(batches))
  for row in rows:
    print(_line(row, batches))


def _line(row, batches) -> str:
  if "error" in row:
    return f"| {row['name']} | {row['n']} | {row['error']} |"
  ms = "—" if row.get("compile_ms") is None else f"{row['compile_ms']:.1f}"
  if row.get("shape_ms") is not None:
    ms += f" ({row['shape_ms']:.1f}; CPU {row['shape_cpu_ms']:.1f}"
    if row.get("first_cpu_ms") is not None:
      ms += f", fresh process {row['first_cpu_ms']:.0f}"
    ms += ")"
  mib = "—" if row.get("nbytes") is None else f"{row['nbytes'] / 2**20:.2f}"
  steps = " | ".join(f"{row['step_us'][b]:.0f}" for b in batches)
  return f"| {row['name']} | {row['n']} | {ms} | {mib} | {row.get('counted')} | {steps} |"


if __name__ == "__main__":
  main()
