"""Per-step device cost of register objects vs the subset automaton (issue 15, 166ebd3).

```sh
.venv/bin/python benchmarks/register_objects_step.py   # writes results/register_objects_step.json
.venv/bin/python benchmarks/register_objects_step.py --schemas tool_send_email --rounds 1 \
    --batch-sizes 1 --out /tmp/r.json                  # smoke
```

Commit 166ebd3 moved the larger any-order objects of 11 corpus schemas from a subset
automaton (keys in any order, written into the states, no register work) to register
objects (the device checks keys in int32 register words per row; tokens that complete a
key or close the object carry guards, gathered and scattered per step). It made compiling
1.2-3x faster; this measures what it costs per decoding step.

For each schema of `--schemas` (from `schema_corpus.load_corpus()`), with the Gemma 3
vocabulary and `memoize=False`, two tables are compiled in one process:

  new  the library as it is (`wide_parts` counts narrow class positions 8 to one wide
       part, `MAX_ANY_ORDER_WIDE` 6);
  old  the decision before 166ebd3, emulated by patching the two module globals it reads
       (`_json_objects.wide_parts` without the narrow positions, `MAX_ANY_ORDER_WIDE`
       12; the lowering cache is cleared between the two).

Every valid instance of the schema (compact `json.dumps`) is tokenized greedily
(`regex_bench.walk_tokens`, EOS dropped) and walked on both tables; an instance either
table rejects is skipped (and listed). The states of all walks are pooled and up to
`--max-states` evenly spaced ones are timed; at batch B row r of timed step j is at
pooled state (j + r) mod m (`step_bench.walk_states`' scheme), so a batch mixes positions
inside and outside the register objects. The reference is `[a-z]+` on letters, walked
the same way (`--regex-steps` states).

Two jitted calls are timed per state (`step_bench`): `step` = `mask_logits` on float32
logits [B, V] + argmax + `advance` (one constrained decoding step), and `own` =
`allowed_bits` + `advance` (the constraint alone). Each call is timed by CPU time of the
process (`time.process_time`, all of XLA's threads) and wall time (`perf_counter`),
blocked until ready, garbage collection off. `--rounds` rounds (after a dropped warm-up
round) interleave old / new / regex, the order reversed every other round; per state the
best of the rounds is kept, and the row reports the median (and p90) over the states,
plus new/old ratios of the medians.

`--baseline-runtime FILE` also times the new tables under another version of
`runtime/_runtime.py` (variant `base`, e.g. `git show 50d17d5:constrained_decoding/runtime/_runtime.py
> /tmp/r.py`), loaded beside the library's, interleaved with the rest: before/after of a
runtime change on the same tables. The markdown then adds new/base ratios.
"""

import argparse
import importlib.util
import json
import os
import platform
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import constrained_decoding as cd  # pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import regex_bench, step_bench  # pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks.schema_corpus import load_corpus  # pylint: disable=g-import-not-at-top,wrong-import-position

DEFAULT_OUT = os.path.join(_REPO, "benchmarks", "results", "register_objects_step.json")
SCHEMAS = ("config_package_json", "k8s_container", "openapi_paginated_users",
           "tool_send_email", "config_github_workflow")
OLD_MAX_ANY_ORDER_WIDE = 12  # `_json_object_schemas.MAX_ANY_ORDER_WIDE` before 166ebd3.


def old_wide_parts(node, memo=None):  # pylint: disable=unused-argument
  """`_json_objects.wide_parts` before 166ebd3: unbounded wide repeats and fragments
  count 1, bounded repeats multiply, narrow class positions count nothing. Its own memo
  (the lowering's memo holds the new measure's pairs)."""
  from constrained_decoding.constraints import _ir as ir  # pylint: disable=g-import-not-at-top
  from constrained_decoding.constraints import _json_objects as jo  # pylint: disable=g-import-not-at-top

  def parts(n, children):
    if isinstance(n, ir.Fragment):
      return 1
    if isinstance(n, ir.Repeat):
      if n.max is None and jo._is_wide(n.node):  # pylint: disable=protected-access
        return 1
      return children[0] * max(1, n.min if n.max is None else n.max)
    return sum(children)

  return ir.fold(node, parts, memo={})


def compile_variants(compiler, schema) -> dict:
  """{"old": (tables, info, cpu s), "new": ...}: the schema compiled with the decision
  before and after 166ebd3 (module globals patched, then restored)."""
  from constrained_decoding.constraints import _json_object_schemas as jos  # pylint: disable=g-import-not-at-top
  from constrained_decoding.constraints import _json_objects as jo  # pylint: disable=g-import-not-at-top
  from constrained_decoding.constraints import _specs_values  # pylint: disable=g-import-not-at-top
  saved = jo.wide_parts, jos.MAX_ANY_ORDER_WIDE
  out = {}
  try:
    for variant in ("old", "new"):
      jo.wide_parts, jos.MAX_ANY_ORDER_WIDE = (
          (old_wide_parts, OLD_MAX_ANY_ORDER_WIDE) if variant == "old" else saved)
      _specs_values._lowered_schema.cache_clear()  # pylint: disable=protected-access
      t = time.process_time()
      tables, info = compiler.compile_with_info(cd.JsonSchema(schema))
      out[variant] = (jax.device_put(tables), info, time.process_time() - t)
  finally:
    jo.wide_parts, jos.MAX_ANY_ORDER_WIDE = saved
    _specs_values._lowered_schema.cache_clear()  # pylint: disable=protected-access
  return out


def baseline_fns(path: str) -> dict:
  """{"step": ..., "own": ...} as `step_bench`'s, jitted with the runtime module at
  `path` (another version of `runtime/_runtime.py`) in place of the library's. Its
  `ConstraintState` is the library's, so states walked here feed it."""
  spec = importlib.util.spec_from_file_location("_baseline_runtime", path)
  rt = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(rt)
  rt.ConstraintState = cd.runtime.ConstraintState

  @jax.jit
  def step(tables, state, logits, tokens):
    masked = rt.mask_logits(tables, state, logits)
    return step_bench._argmax(masked), rt.advance(tables, state, tokens)  # pylint: disable=protected-access

  @jax.jit
  def own(tables, state, tokens):
    return rt.allowed_bits(tables, state), rt.advance(tables, state, tokens)

  return {"step": step, "own": own}


def walk(tables, tokens):
  """States before each token of `tokens` (batch 1), or None if a token is rejected."""
  state, out = cd.runtime.init_state(tables, batch_size=1), []
  for tok in tokens:
    out.append((state, tok))
    state = step_bench._advance(tables, state, jnp.asarray([tok], jnp.int32))  # pylint: disable=protected-access
  return None if bool(np.asarray(state.error).any()) else out


def batches(pooled, batch: int) -> list:
  """Per timed step j, the batch's states and tokens: row r at pooled[(j + r) % m]."""
  m, out = len(pooled), []
  for j in range(m):
    rows = [pooled[(j + r) % m] for r in range(batch)]
    states = jax.tree.map(lambda *x: jnp.concatenate(x), *[s for s, _ in rows])
    out.append((states, jnp.asarray([t for _, t in rows], jnp.int32)))
  return jax.block_until_ready(out)


def spaced(items: list, most: int) -> list:
  """Up to `most` evenly spaced items of `items` (all if fewer)."""
  if len(items) <= most:
    return items
  return [items[i] for i in np.linspace(0, len(items) - 1, most).astype(int)]


def time_calls(fn, tables, states, logits) -> tuple[np.ndarray, np.ndarray]:
  """(CPU seconds, wall seconds) of one call of `fn` per (state, token)."""
  cpu, wall = [], []
  for state, tok in states:
    args = (tables, state, logits, tok) if logits is not None else (tables, state, tok)
    c0, w0 = time.process_time(), time.perf_counter()
    jax.block_until_ready(fn(*args))
    wall.append(time.perf_counter() - w0)
    cpu.append(time.process_time() - c0)
  return np.asarray(cpu), np.asarray(wall)


def meta(tables, info, seconds) -> dict:
  return {"compile_cpu_ms": round(seconds * 1e3, 1), "table_mib": info.nbytes["total"] / 2**20,
          "token_states": info.token_states, "token_edges": info.token_edges,
          "register_words": int(tables.register_init.shape[0]),
          "guarded_tokens_per_state": int(tables.guarded_slots.shape[-1])}


def stats(us: np.ndarray) -> dict:
  return {"median_us": float(np.median(us)), "p90_us": float(np.percentile(us, 90))}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--schemas", default=",".join(SCHEMAS))
  parser.add_argument("--batch-sizes", default="1,64")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--max-states", type=int, default=64)
  parser.add_argument("--regex-steps", type=int, default=64)
  parser.add_argument("--out", default=DEFAULT_OUT)
  parser.add_argument("--baseline-runtime", default=None,
                      help="a runtime/_runtime.py to time the new tables under too")
  args = parser.parse_args(argv)
  load = {"start": os.getloadavg()}
  from benchmarks import _gemma_vocab  # pylint: disable=g-import-not-at-top
  vocab = cd.Vocabulary.from_gguf(_gemma_vocab.gemma_gguf_path())
  compiler = cd.Compiler(vocab, cd.CompileOptions(memoize=False))
  corpus, eos = load_corpus(), vocab.eos_ids[0]
  work = {}  # name -> {variant: (tables, pooled states)}
  metas, skipped = {}, {}
  for name in args.schemas.split(","):
    entry = corpus[name]
    tabs = compile_variants(compiler, entry["schema"])
    pooled = {v: [] for v in tabs}
    skipped[name] = []
    for k, inst in enumerate(entry["valid"]):
      text = json.dumps(inst, separators=(",", ":"))
      tokens = regex_bench.walk_tokens(vocab.token_bytes, text, eos)[:-1]
      walks = {v: walk(tabs[v][0], tokens) for v in tabs}
      if any(w is None for w in walks.values()):
        skipped[name].append(k)
        continue
      for v in tabs:
        pooled[v] += walks[v]
    metas[name] = {v: meta(*tabs[v]) for v in tabs}
    metas[name]["states_walked"] = len(pooled["new"])
    work[name] = {v: (tabs[v][0], spaced(pooled[v], args.max_states)) for v in tabs}
    print(f"{name}: {len(pooled['new'])} states walked, skipped instances {skipped[name]}; "
          + "; ".join(f"{v} {m['register_words']} register words, {m['token_states']} states, "
                      f"{m['table_mib']:.1f} MiB, compile {m['compile_cpu_ms']:.0f} ms"
                      for v, m in metas[name].items() if isinstance(m, dict)), flush=True)
  rx_tables = jax.device_put(compiler.compile(cd.Regex("[a-z]+")))
  rx_tokens = regex_bench.walk_tokens(vocab.token_bytes,
                                      step_bench._text(step_bench._LETTERS, 1990), eos)[:-1]  # pylint: disable=protected-access
  rx_states = spaced(walk(rx_tables, rx_tokens), args.regex_steps)

  fns = {"step": step_bench._step, "own": step_bench._constraint_step}  # pylint: disable=protected-access
  variants = ("old", "new")
  base = None
  if args.baseline_runtime:
    base, variants = baseline_fns(args.baseline_runtime), ("old", "new", "base")
    for vs in work.values():
      vs["base"] = vs["new"]
  rows = []
  for batch in [int(b) for b in args.batch_sizes.split(",")]:
    logits = jax.random.normal(jax.random.PRNGKey(0), (batch, vocab.vocab_size), jnp.float32)
    subjects = {("regex", "regex"): (rx_tables, batches(rx_states, batch))}
    for name, vs in work.items():
      for v, (tab, states) in vs.items():
        subjects[name, v] = (tab, batches(states, batch))
    order = [("regex", "regex")] + [(n, v) for n in work for v in variants]
    best = {}
    with regex_bench._NoGc():  # pylint: disable=protected-access
      for rnd in range(args.rounds + 1):  # Round 0 warms up (compiles) and is dropped.
        for key in (order if rnd % 2 else order[::-1]):
          tab, states = subjects[key]
          for f, fn in (base if key[1] == "base" else fns).items():
            cpu, wall = time_calls(fn, tab, states, logits if f == "step" else None)
            if rnd:
              for clock, t in (("cpu", cpu), ("wall", wall)):
                b = best.get((key, f, clock))
                best[key, f, clock] = t if b is None else np.minimum(b, t)
    for key in order:
      row = {"schema": key[0], "variant": key[1], "batch": batch,
             "steps_timed": len(subjects[key][1])}
      for f in fns:
        for clock in ("cpu", "wall"):
          row[f"{f}_{clock}"] = stats(best[key, f, clock] * 1e6)
      rows.append(row)
    print(markdown([r for r in rows if r["batch"] == batch]), flush=True)
  load["end"] = os.getloadavg()
  table = markdown(rows)
  print("\n" + table + "\nload average (1, 5, 15 min):", load)
  report = {"benchmark": "register_objects_step",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "environment": {"python": platform.python_version(), "jax": jax.__version__,
                            "device": str(jax.devices()[0]), "cpus": os.cpu_count(),
                            "load_average_1_5_15": load},
            "rounds": args.rounds, "max_states": args.max_states,
            "baseline_runtime": args.baseline_runtime,
            "timing": "per state best of rounds (CPU: process_time, wall: perf_counter); "
                      "median / p90 over the timed states",
            "tables": metas, "skipped_instances": skipped, "rows": rows,
            "table_markdown": table}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  print(f"wrote {args.out}")


def markdown(rows) -> str:
  """Per schema and batch: median µs of old / new / regex for the step and own work, CPU
  and wall, with new/old."""
  rx = {r["batch"]: r for r in rows if r["variant"] == "regex"}
  cols = [(f, c) for f in ("step", "own") for c in ("cpu", "wall")]
  lines = ["| schema | B | " + " | ".join(
      f"{f} {c} old / new / regex µs (new/old)" for f, c in cols) + " |",
           "|---|---|" + "---|" * len(cols)]
  for r in rows:
    if r["variant"] != "new":
      continue
    o = next(x for x in rows if x["schema"] == r["schema"] and x["batch"] == r["batch"]
             and x["variant"] == "old")
    g = rx[r["batch"]]
    b = next((x for x in rows if x["schema"] == r["schema"] and x["batch"] == r["batch"]
              and x["variant"] == "base"), None)
    cell = lambda f, c: (f"{o[f'{f}_{c}']['median_us']:.0f} / {r[f'{f}_{c}']['median_us']:.0f}"
                         f" / {g[f'{f}_{c}']['median_us']:.0f} "
                         f"({r[f'{f}_{c}']['median_us'] / o[f'{f}_{c}']['median_us']:.2f})"
                         + ("" if b is None else
                            f"; base {b[f'{f}_{c}']['median_us']:.0f} (new/base "
                            f"{r[f'{f}_{c}']['median_us'] / b[f'{f}_{c}']['median_us']:.2f})"))
    lines.append(f"| {r['schema']} | {r['batch']} | "
                 + " | ".join(cell(f, c) for f, c in cols) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
