"""Per-step device cost of counted repetitions (issue 15), against a plain regex.

```sh
.venv/bin/python benchmarks/step_bench.py     # writes benchmarks/results/step_counted.json
.venv/bin/python benchmarks/step_bench.py --batch-sizes 1 --rounds 1 --out /tmp/s.json  # smoke
```

With the Gemma 3 vocabulary, one jitted constrained step -- `mask_logits` on float32
logits [B, V], `argmax` of the masked logits, `advance` -- at batch 1, 8 and 64, for:

  a  `[a-z]+`, the baseline: same shape of text, no counting (no counting terminals, so
     `advance` skips the character-count lookup statically).
  b  `[a-z]{0,2000}`: a counted chain (`automata/_counting.py`).
  c  `{"type": "string", "maxLength": 200}`.
  d  an object with a `maxLength` 100 string and an integer (`automata/_embedded_chains.py`).
  e  `{"type": "string", "format": "email"}` (counted labels).
  f  an object of 20 integer and 6 string properties, any order: past the subset
     automaton's budget, so its keys are checked in register words on the device
     (`automata/_registers.py`: guarded tokens gathered and scattered per step).
  g  the same object with `property_order="schema"` (no registers), on the same text.
  j  the object of f with a free-form member (nested JSON) under `free_form_depth=None`:
     push-down tables whose guards work beside the stack (issue 14; the free-form value
     is a call of the JSON-value rule, which touches no register).
  k  the same with `property_order="schema"`: push-down tables without registers.

Each constraint walks a valid text (`regex_bench.walk_tokens`: greedy longest tokens),
chosen so that almost every state of the walk is inside the counted chain, up to its
end where the "at most r characters" filters apply (b's text is 1,990 letters, c's
string 195 characters). The states before the timed steps are computed once (a walk
of more than `--spread + --tail` tokens times `--spread` evenly spaced steps and its
last `--tail`); the rows of a batch are at different timed steps (row r at the
(j + r)-th, cyclically: `walk_states`). The step is a pure function, so each is timed
by one call from its states with the text's tokens, blocked until ready.
Two calls are timed: `step` = `mask_logits` + argmax (returned; a first-index-of-max
of two reductions, see `_argmax`) + `advance` by the text's token, and `own work` =
`allowed_bits` + `advance` (the constraint alone, without the [B, V] logits pass). As
in `json_compile_bench.bench_steps`, `--rounds` passes interleave the constraints so
the machine's drift falls on all alike (garbage collection off, `regex_bench._NoGc`);
per state the best of the rounds is kept (the machine is shared) and a row reports
the median (p90, max) over its states, and the ratio to (a)'s median at the same
batch size. Table bytes: `CompileInfo.nbytes["total"]`; R: terminal entries per state
row (padded, static: `advance` gathers one bitmap word for each of them; the mask row
already holds them, `tables.py`).

`--profile-iters` (0: off) splits the step at the middle timed step of each walk,
best of `--profile-iters` calls (`decode_bench._best_ms`): `jnp.argmax` alone
(`decode_bench._greedy_step`), the two-reduction argmax alone, `allowed_bits` (one
mask row per batch row, counting entries included), mask + argmax, and `advance`.
"""

import argparse
import json
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # Run as a script from a checkout.

import constrained_decoding as cd  # pylint: disable=g-import-not-at-top,wrong-import-position
from constrained_decoding.models import default_gguf_path  # pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import decode_bench, regex_bench  # pylint: disable=g-import-not-at-top,wrong-import-position

DEFAULT_OUT = os.path.join(_REPO, "benchmarks", "results", "step_counted.json")

_WORDS = ("the quick brown fox jumps over the lazy dog while seven wizards quietly judge "
          "boxing matches and a young engineer measures every decoding step on a shared "
          "machine before writing down the numbers ")
_LETTERS = _WORDS.replace(" ", "")


def _text(source: str, n: int) -> str:
  return (source * (n // len(source) + 1))[:n]


NAME_100 = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 100},
                                             "id": {"type": "integer"}},
            "required": ["name", "id"]}
WIDE_OBJECT = {"type": "object", "required": ["field_0", "text_0"], "properties": {
    **{f"field_{i}": {"type": "integer"} for i in range(20)},
    **{f"text_{i}": {"type": "string"} for i in range(6)}}}
_WIDE_TEXT = json.dumps({**{f"field_{i}": 1000 + i for i in range(20)},
                         **{f"text_{i}": _text(_WORDS, 30) for i in range(6)}},
                        separators=(",", ":"))
LIST_20 = {"type": "array", "maxItems": 20, "items": {
    "type": "object", "required": ["id"], "additionalProperties": False,
    "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"},
                   "label": {"type": "string"}, "kind": {"enum": ["a", "b", "c"]}}}}
_LIST_TEXT = json.dumps([{"id": 1000 + i, "ok": True, "label": _text(_WORDS, 12), "kind": "b"}
                         for i in range(20)], separators=(",", ":"))
_FREE_TEXT = _WIDE_TEXT[:-1] + ',"meta":' + json.dumps(
    {"tags": ["a", "b"], "nested": [{"x": 1, "y": [True, None, 2.5]}, {"z": "w"}]},
    separators=(",", ":")) + "}"


def cases() -> tuple:
  """(key, label, spec, text walked) per constraint. A function, not a constant: specs
  import the compiler (pynini), which `device_kit run` must not need."""
  return (
      ("a", "[a-z]+ (baseline)", cd.Regex("[a-z]+"), _text(_LETTERS, 1990)),
      ("b", "[a-z]{0,2000}", cd.Regex("[a-z]{0,2000}"), _text(_LETTERS, 1990)),
      ("c", '{"type":"string","maxLength":200}',
       cd.JsonSchema({"type": "string", "maxLength": 200}), json.dumps(_text(_WORDS, 195))),
      ("d", "object {name: maxLength 100, id: integer}", cd.JsonSchema(NAME_100),
       json.dumps({"name": _text(_WORDS, 95), "id": 123456}, separators=(",", ":"))),
      ("e", '{"type":"string","format":"email"}',
       cd.JsonSchema({"type": "string", "format": "email"}),
       '"firstname.lastname.engineering-department@mail.subdomain.example-company.co.uk"'),
      ("f", "object of 26 keys, any order (registers)", cd.JsonSchema(WIDE_OBJECT),
       _WIDE_TEXT),
      ("g", "object of 26 keys, schema order",
       cd.JsonSchema(WIDE_OBJECT, property_order="schema"), _WIDE_TEXT),
      ("h", "array of <= 20 objects, counted (register)", cd.JsonSchema(LIST_20), _LIST_TEXT),
      ("i", "array of <= 20 objects, copies",
       cd.JsonSchema(LIST_20, property_order="any_bounded"), _LIST_TEXT),
      ("j", "object of 26 keys + free-form, any order, free_form_depth=None (stack + registers)",
       cd.JsonSchema(WIDE_OBJECT, free_form_depth=None), _FREE_TEXT),
      ("k", "object of 26 keys + free-form, schema order, free_form_depth=None (stack)",
       cd.JsonSchema(WIDE_OBJECT, free_form_depth=None, property_order="schema"), _FREE_TEXT),
      ("l", '{"type":"string","minLength":20} (counted, then a strip)',
       cd.JsonSchema({"type": "string", "minLength": 20}), json.dumps(_text(_WORDS, 195))),
  )


def _argmax(x):
  """First index of the row maximum, as two plain reductions: `jnp.argmax` lowers to a
  variadic reduce that XLA's CPU backend runs ~7x slower (0.9 ms per 262k row, 89 ms
  at batch 64 here: see the profile's argmax column), which would hide the constraint."""
  top = x.max(axis=-1, keepdims=True)
  ids = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  return jnp.min(jnp.where(x == top, ids, x.shape[-1]), axis=-1)


@jax.jit
def _step(tables, state, logits, tokens):
  """One constrained step: mask, argmax (returned), advance by `tokens` (the text's)."""
  masked = cd.runtime.mask_logits(tables, state, logits)
  return _argmax(masked), cd.runtime.advance(tables, state, tokens)


@jax.jit
def _constraint_step(tables, state, tokens):
  """The constraint's own work: the packed allowed set and the advance."""
  return cd.runtime.allowed_bits(tables, state), cd.runtime.advance(tables, state, tokens)


@jax.jit
def _allowed_bits(tables, state):
  return cd.runtime.allowed_bits(tables, state)


@jax.jit
def _mask_argmax(tables, state, logits):
  return _argmax(cd.runtime.mask_logits(tables, state, logits))


@jax.jit
def _advance(tables, state, tokens):
  return cd.runtime.advance(tables, state, tokens)


def timed_indices(n: int, spread: int, tail: int) -> list[int]:
  """Steps of an n-token walk to time: all if few, else `spread` evenly spaced ones
  plus the last `tail` (near the end of the count, where the filters apply)."""
  if n <= spread + tail:
    return list(range(n))
  return sorted(set(np.linspace(0, n - 1, spread).astype(int).tolist())
                | set(range(n - tail, n)))


def walk_states(tables, tokens, indices, batch: int) -> list:
  """Per timed step j, the batch's states and tokens ([B] device arrays): row r is at
  step `indices[(j + r) % len(indices)]` of the walk through `tokens`, so the rows of
  a batch sit at different positions of the text (different terminal rows and
  filters), as in a real batch, and every row walks the text's states in turn."""
  state = cd.runtime.init_state(tables, batch_size=1)
  at, wanted = {}, set(indices)
  for i, tok in enumerate(tokens):
    if i in wanted:
      at[i] = (state, tok)
    state = _advance(tables, state, jnp.asarray([tok], jnp.int32))
  if bool(np.asarray(state.error).any()):
    raise AssertionError("a token of the walk was rejected")
  out, m = [], len(indices)
  for j in range(m):
    rows = [at[indices[(j + r) % m]] for r in range(batch)]
    states = jax.tree.map(lambda *x: jnp.concatenate(x), *[s for s, _ in rows])
    out.append((states, jnp.asarray([t for _, t in rows], jnp.int32)))
  return jax.block_until_ready(out)


def time_states(fn, tables, states, logits) -> np.ndarray:
  """Seconds of one call of `fn` at each (state, token), blocked until ready."""
  clock, times = time.perf_counter, []
  for state, tok in states:
    args = (tables, state, logits, tok) if logits is not None else (tables, state, tok)
    t0 = clock()
    jax.block_until_ready(fn(*args))
    times.append(clock() - t0)
  return np.asarray(times)


def _check(tables, tokens) -> None:
  """Every token of the walk is allowed where it is taken (batch 1)."""
  state = cd.runtime.init_state(tables, batch_size=1)
  for i, tok in enumerate(tokens):
    if not bool(np.asarray(cd.runtime.allowed_tokens(tables, state))[0, tok]):
      raise AssertionError(f"token {tok} not allowed at step {i}")
    state = cd.runtime.advance(tables, state, jnp.asarray([tok], jnp.int32))


@jax.jit
def _fast_argmax(logits):
  return _argmax(logits)


def profile(tables, tokens, indices, batch: int, vocab_size: int, iters: int) -> dict:
  """Parts of the step at the middle timed step (row 0 halfway through the walk, the
  other rows after it as in `walk_states`), best of `iters` calls, µs."""
  state, tok = walk_states(tables, tokens, indices, batch)[len(indices) // 2]
  logits = jax.random.normal(jax.random.PRNGKey(0), (batch, vocab_size), jnp.float32)
  best_ms = decode_bench._best_ms  # pylint: disable=protected-access
  us = lambda fn, *a: round(best_ms(fn, a, iters) * 1e3, 1)
  out = {"jnp_argmax_us": us(decode_bench._greedy_step, logits),  # pylint: disable=protected-access
         "argmax_us": us(_fast_argmax, logits),
         "allowed_bits_us": us(_allowed_bits, tables, state),
         "mask_argmax_us": us(_mask_argmax, tables, state, logits),
         "advance_us": us(_advance, tables, state, tok),
         "step_us": us(_step, tables, state, logits, tok)}
  return out


def step_meta(tables, info) -> dict:
  """What the report says of one constraint's tables (`CompileInfo` and shapes)."""
  return {"table_bytes": info.nbytes["total"], "states": info.token_states,
          "edges": info.token_edges, "counted": bool(tables.token_counts.shape[0]),
          "terminal_entries_per_state": int(tables.state_terminals.shape[1]),
          "terminal_bitmaps": int(tables.terminal_bits.shape[0]),
          "guarded_tokens_per_state": int(tables.guarded_slots.shape[-1])}


def time_batch(work: list[dict], batch: int, vocab_size: int, rounds: int) -> list[dict]:
  """One row per constraint of `work` at batch size `batch`: the step and the
  constraint's own work, per timed state best of `rounds` interleaved passes."""
  logits = jax.random.normal(jax.random.PRNGKey(0), (batch, vocab_size), jnp.float32)
  states = [walk_states(w["tables"], w["tokens"], w["indices"], batch) for w in work]
  timed = {"step": (_step, logits), "own": (_constraint_step, None)}
  best = {(k, v): None for k in range(len(work)) for v in timed}
  with regex_bench._NoGc():  # pylint: disable=protected-access
    for rnd in range(rounds + 1):  # Round 0 warms up (compiles) and is dropped.
      for k, w in enumerate(work):
        for v, (fn, lg) in timed.items():
          t = time_states(fn, w["tables"], states[k], lg)
          if rnd:
            best[k, v] = t if best[k, v] is None else np.minimum(best[k, v], t)
  rows, base = [], {}
  for k, w in enumerate(work):
    row = {"case": w["key"], "constraint": w["label"], "batch": batch,
           "steps_walked": len(w["tokens"]), "steps_timed": len(w["indices"]), **w["meta"]}
    for v in timed:
      us = best[k, v] * 1e6
      row[v] = {"median_us": float(np.median(us)), "p90_us": float(np.percentile(us, 90)),
                "max_us": float(us.max()), "min_us": float(us.min())}
      base.setdefault(v, row[v]["median_us"] if w["key"] == "a" else None)
      row[v]["ratio_to_a"] = row[v]["median_us"] / base[v] if base[v] else None
    rows.append(row)
    print(f"  B={batch} {w['key']}: " + "; ".join(
        f"{v} {row[v]['median_us']:.0f} us median (p90 {row[v]['p90_us']:.0f})"
        + (f" {row[v]['ratio_to_a']:.2f}x (a)" if base[v] else "") for v in timed), flush=True)
  return rows


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch-sizes", default="1,8,64")
  parser.add_argument("--rounds", type=int, default=5,
                      help="timed passes over each constraint's states, interleaved")
  parser.add_argument("--cases", default="a,b,c,d,e")
  parser.add_argument("--spread", type=int, default=40,
                      help="a longer walk times this many evenly spaced steps ...")
  parser.add_argument("--tail", type=int, default=12, help="... and its last ones")
  parser.add_argument("--profile-iters", type=int, default=20, help="0: no profile")
  parser.add_argument("--out", default=DEFAULT_OUT)
  args = parser.parse_args(argv)
  batches = [int(b) for b in args.batch_sizes.split(",")]
  keys = args.cases.split(",")
  load = {"start": os.getloadavg()}
  vocab = cd.Vocabulary.from_gguf(default_gguf_path())
  compiler = cd.Compiler(vocab)
  work = []
  for key, label, spec, text in cases():
    if key not in keys:
      continue
    tables, info = compiler.compile_with_info(spec)
    tables = jax.device_put(tables)
    tokens = regex_bench.walk_tokens(vocab.token_bytes, text, vocab.eos_ids[0])
    _check(tables, tokens)
    work.append(dict(key=key, label=label, text=text, tokens=tokens, tables=tables,
                     indices=timed_indices(len(tokens), args.spread, args.tail),
                     meta=step_meta(tables, info)))
    print(f"{key}: {label}: {len(tokens)} tokens, {info.nbytes['total'] / 2**20:.2f} MiB, "
          f"R={tables.state_terminals.shape[1]}", flush=True)
  rows = []
  for batch in batches:
    rows += time_batch(work, batch, vocab.vocab_size, args.rounds)
  profiles = []
  if args.profile_iters:
    for batch in batches:
      for w in work:
        p = profile(w["tables"], w["tokens"], w["indices"], batch, vocab.vocab_size,
                    args.profile_iters)
        profiles.append({"case": w["key"], "batch": batch, **p})
        print(f"  profile B={batch} {w['key']}: {p}", flush=True)
  load["end"] = os.getloadavg()
  table = markdown(rows)
  print("\n" + table)
  if profiles:
    print("\n" + profile_markdown(profiles))
  print("load average (1, 5, 15 min):", load)
  report = {"benchmark": "step_counted", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "environment": {"python": platform.python_version(), "jax": jax.__version__,
                            "device": str(jax.devices()[0]), "cpus": os.cpu_count(),
                            "load_average_1_5_15": load},
            "rounds": args.rounds, "timing": "per step index best of rounds; median over the walk",
            "texts": {w["key"]: w["text"] for w in work}, "rows": rows,
            "profile_mid_walk": profiles, "table_markdown": table}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  print(f"wrote {args.out}")


def markdown(rows) -> str:
  """Per constraint: bytes, R, and per batch size the step and the constraint's own
  work in µs (median over the timed states), with the ratio to (a) in brackets."""
  batches = sorted({r["batch"] for r in rows})
  cell = lambda m: (f"{m['median_us']:.0f} ({m['ratio_to_a']:.2f}x)" if m["ratio_to_a"]
                    else f"{m['median_us']:.0f}")
  lines = ["| constraint | table MiB | R | steps timed | " + " | ".join(
      f"step B={b} | own work B={b}" for b in batches) + " |",
           "|---|---|---|---|" + "---|---|" * len(batches)]
  for key in dict.fromkeys(r["case"] for r in rows):
    rs = {r["batch"]: r for r in rows if r["case"] == key}
    r0 = rs[batches[0]]
    lines.append(f"| {key} `{r0['constraint']}` | {r0['table_bytes'] / 2**20:.2f} | "
                 f"{r0['terminal_entries_per_state']} | {r0['steps_timed']} | " + " | ".join(
                     f"{cell(rs[b]['step'])} | {cell(rs[b]['own'])}" for b in batches)
                 + " |")
  return "\n".join(lines)


def profile_markdown(profiles) -> str:
  cols = ("jnp_argmax_us", "argmax_us", "allowed_bits_us", "mask_argmax_us", "advance_us",
          "step_us")
  lines = ["| case | B | " + " | ".join(c[:-3] for c in cols) + " |",
           "|---|---|" + "---|" * len(cols)]
  for p in profiles:
    lines.append(f"| {p['case']} | {p['batch']} | " + " | ".join(
        f"{p[c]:.0f}" if c in p else "—" for c in cols) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
