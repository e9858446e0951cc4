"""The decode and step benchmarks on an accelerator that has neither the GGUF nor pynini.

An accelerator machine lent for a few minutes has jax (with its CUDA plugin), flax,
numpy and sentencepiece, but no pynini and no room for the 253 MB GGUF. So the work is
split in two:

```sh
# here (needs the GGUF and pynini): compile every constraint, walk its text, save a kit
.venv/bin/python benchmarks/device_kit.py prepare --dir .devkit
# there (needs only jax): time decode and step from the kit
python3 benchmarks/device_kit.py run --dir .devkit --out $OUT --budget-s 420
```

The kit holds the Gemma 3 270M config and vocabulary (pickled), the few-shot prompts
as token ids, and per constraint its tables (`save_tables`, no pynini to load) and the
tokens of the valid text `step_bench` walks. The model on the accelerator has *random
weights* of the real architecture (`Gemma3.random`): a step costs the same whatever
the weights are, but unconstrained rows may stop early at an end-of-sequence token and
`mc_json` rows stop where the weights lead (`no_eos` always runs every step; see
`decode_bench`).

`run` times, in order of interest, writing its JSON after every phase so that a lease
that runs out still returns what finished (`--budget-s` skips what would start late):
  1. `decode_bench`: the jitted decode loop (model + constraint) per batch size and
     constraint, with the host-transfer evidence of the compiled loop;
  2. `decode_bench.step_overhead`: mask + argmax + advance against argmax alone;
  3. `step_bench`: one constrained step per walked state of cases a-i (timed from the
     host per call, so at small batch the launch overhead is in every figure);
  4. `step_bench.profile` at the largest batch.
"""

import argparse
import json
import os
import pickle
import platform
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # Run as a script from a checkout.

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import constrained_decoding as cd  # pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import decode_bench, regex_bench, step_bench  # pylint: disable=g-import-not-at-top,wrong-import-position

DECODE_CONSTRAINTS = ("no_eos", "mc_json")
_MODEL_FILE = "model.pkl"  # config, vocabulary, bos id, prompt ids


def prepare(kit: str, prompts: int) -> None:
  """Compiles the decode and step constraints for Gemma 3 and writes the kit."""
  model = cd.models.Gemma3.from_gguf(progress=False)
  os.makedirs(kit, exist_ok=True)
  prompt_ids = [model.encode(p) for p in decode_bench.load_prompts(prompts)]
  with open(os.path.join(kit, _MODEL_FILE), "wb") as f:
    pickle.dump({"config": model.config, "vocab": model.vocab, "bos_id": model.bos_id,
                 "prompt_ids": prompt_ids}, f)
  tables, info = decode_bench.compile_constraints(model, list(DECODE_CONSTRAINTS))
  for name in DECODE_CONSTRAINTS:
    tables[name].save(os.path.join(kit, f"decode_{name}.cdt"), vocab=model.vocab)
  compiler = cd.Compiler(model.vocab)
  steps = {"decode_compile": info}
  for key, label, spec, text in step_bench.cases():
    t, ci = compiler.compile_with_info(spec)
    tokens = regex_bench.walk_tokens(model.vocab.token_bytes, text, model.vocab.eos_ids[0])
    step_bench._check(t, tokens)  # pylint: disable=protected-access
    t.save(os.path.join(kit, f"step_{key}.cdt"), vocab=model.vocab)
    steps[key] = {"label": label, "text": text, "tokens": tokens,
                  "meta": step_bench.step_meta(t, ci)}
    print(f"step case {key}: {len(tokens)} tokens, {ci.nbytes['total'] / 2**20:.2f} MiB",
          flush=True)
  with open(os.path.join(kit, "cases.json"), "w", encoding="utf-8") as f:
    json.dump(steps, f)
  total = sum(os.path.getsize(os.path.join(kit, n)) for n in os.listdir(kit))
  print(f"kit {kit}: {total / 2**20:.1f} MiB")


class _Report:
  """The run's JSON, rewritten whole after every phase."""

  def __init__(self, path: str, budget_s: float):
    self.path, self.budget_s, self.t0 = path, budget_s, time.perf_counter()
    self.data = {"benchmark": "device_kit", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                   time.gmtime()),
                 "environment": {"python": platform.python_version(), "jax": jax.__version__,
                                 "backend": jax.default_backend(),
                                 "device": str(jax.devices()[0]),
                                 "device_kind": jax.devices()[0].device_kind},
                 "skipped": []}

  def elapsed(self) -> float:
    return time.perf_counter() - self.t0

  def may_start(self, phase: str) -> bool:
    if self.elapsed() < self.budget_s:
      print(f"[{self.elapsed():.0f}s] {phase}", flush=True)
      return True
    self.data["skipped"].append(phase)
    self.write()
    return False

  def write(self) -> None:
    self.data["elapsed_s"] = round(self.elapsed(), 1)
    with open(self.path, "w", encoding="utf-8") as f:
      json.dump(self.data, f, indent=1)


def edge_search_unrolled(tables: dict, register_tables, batches: list[int],
                         vocab_size: int) -> dict:
  """`_find_edges` looped (unroll 1) and unrolled on this platform: the step overhead,
  and the compile time of `advance` for register tables (what the loop was made for)."""
  runtime = sys.modules["constrained_decoding.runtime._runtime"]
  default, out = runtime.EDGE_SEARCH_UNROLL, {}
  for unroll in (1, True):
    runtime.EDGE_SEARCH_UNROLL = {"default": unroll}
    jax.clear_caches()
    dev = jax.device_put(register_tables)
    state = cd.runtime.init_state(dev, batch_size=batches[-1])
    t0 = time.perf_counter()
    jax.jit(cd.runtime.advance).lower(dev, state, state.state).compile()
    out[str(unroll)] = {
        "advance_compile_s_register_tables": round(time.perf_counter() - t0, 2),
        "step_overhead": decode_bench.step_overhead(tables, batches, vocab_size, 50)}
  runtime.EDGE_SEARCH_UNROLL = default
  jax.clear_caches()
  return out


def run(kit: str, out: str, batches: list[int], tokens: int, repeats: int, rounds: int,
        budget_s: float, cases: list[str]) -> None:
  """Times decode and step from the kit; see the module docstring."""
  os.makedirs(out, exist_ok=True)
  report = _Report(os.path.join(out, "device_kit.json"), budget_s)
  print(report.data["environment"], flush=True)
  with open(os.path.join(kit, _MODEL_FILE), "rb") as f:
    saved = pickle.load(f)
  vocab = saved["vocab"]
  model = cd.models.Gemma3.random(saved["config"], tokenizer=None, vocab=vocab,
                                  bos_id=saved["bos_id"])
  load = lambda name: cd.load_tables(os.path.join(kit, name), vocab=vocab)
  with open(os.path.join(kit, "cases.json"), encoding="utf-8") as f:
    steps = json.load(f)
  report.data["decode_compile_here"] = steps.pop("decode_compile")

  prompts = saved["prompt_ids"]
  by_batch = {b: [prompts[i % len(prompts)] for i in range(b)] for b in batches}
  tables = {"none": None, **{n: load(f"decode_{n}.cdt") for n in DECODE_CONSTRAINTS}}
  samples, evidence = {}, {}
  report.data["decode"] = {"model": "Gemma 3 270M architecture, random float32 weights",
                           "tokens": tokens, "repeats": repeats, "rows": []}
  if report.may_start("decode evidence"):
    for name, t in tables.items():
      facts = decode_bench.loop_evidence(model, prompts[:1], t)
      evidence[name] = {k: facts[k] for k in ("jaxpr_while", "offending", "host_round_trip")}
    report.data["decode"]["loop_evidence"] = evidence
    report.write()
  for batch, rows in by_batch.items():
    if not report.may_start(f"decode batch {batch}"):
      continue
    decode_bench.warm_up(model, {batch: rows}, tables, tokens, samples)
    decode_bench.timed_runs(model, {batch: rows}, tables, tokens, repeats, samples)
    report.data["decode"]["rows"] = decode_bench.summarize(samples)
    report.data["decode"]["table_markdown"] = decode_bench.markdown(
        report.data["decode"]["rows"])
    report.write()
  if report.may_start("step overhead"):
    report.data["step_overhead"] = decode_bench.step_overhead(
        tables, batches, model.config.vocab_size, 50)
    report.write()
  if report.may_start("edge search unrolled"):
    report.data["edge_search_unrolled"] = edge_search_unrolled(
        tables, load("step_f.cdt"), batches, model.config.vocab_size)
    report.write()

  work = []
  for key in cases:
    s = steps[key]
    work.append(dict(key=key, label=s["label"], tokens=s["tokens"], meta=s["meta"],
                     tables=jax.device_put(load(f"step_{key}.cdt")),
                     indices=step_bench.timed_indices(len(s["tokens"]), 40, 12)))
  report.data["step"] = {"rows": [], "rounds": rounds,
                         "timing": "per call from the host, blocked until ready; per step "
                                   "index best of rounds; median over the walk"}
  for batch in batches:
    if not report.may_start(f"step batch {batch}"):
      continue
    report.data["step"]["rows"] += step_bench.time_batch(work, batch, vocab.vocab_size,
                                                         rounds)
    report.data["step"]["table_markdown"] = step_bench.markdown(report.data["step"]["rows"])
    report.write()
  if report.may_start(f"step profile batch {batches[-1]}"):
    report.data["step"]["profile"] = [
        {"case": w["key"], "batch": batches[-1],
         **step_bench.profile(w["tables"], w["tokens"], w["indices"], batches[-1],
                              vocab.vocab_size, 20)} for w in work]
    report.data["step"]["profile_markdown"] = step_bench.profile_markdown(
        report.data["step"]["profile"])
  report.write()
  for part in ("decode", "step"):
    print(f"\n{part}:\n" + report.data.get(part, {}).get("table_markdown", "(none)"))
  if "profile_markdown" in report.data.get("step", {}):
    print("\n" + report.data["step"]["profile_markdown"])
  print("skipped:", report.data["skipped"], f"elapsed {report.elapsed():.0f}s")
  if any(f["host_round_trip"] for f in evidence.values()):
    sys.exit("host round trip found in the decode loop: " + json.dumps(evidence))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("mode", choices=("prepare", "run"))
  parser.add_argument("--dir", default=".devkit", help="the kit's folder")
  parser.add_argument("--out", default=os.path.join(_REPO, "benchmarks", "results"))
  parser.add_argument("--prompts", type=int, default=48, help="prepare: distinct prompts")
  parser.add_argument("--batch-sizes", default="1,8,64,256")
  parser.add_argument("--tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--cases", default="a,b,c,d,e,f,g,h,i")
  parser.add_argument("--budget-s", type=float, default=float("inf"),
                      help="run: start no phase after this many seconds")
  args = parser.parse_args(argv)
  if args.mode == "prepare":
    prepare(args.dir, args.prompts)
  else:
    run(args.dir, args.out, [int(b) for b in args.batch_sizes.split(",")], args.tokens,
        args.repeats, args.rounds, args.budget_s, args.cases.split(","))


if __name__ == "__main__":
  main()
