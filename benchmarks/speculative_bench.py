"""Speculative decoding with constraints: acceptance rate and tokens/s (paper Sec. 5.3).

Target: the real Gemma 3 270M. Prompts: the few-shot conformance prompts
(benchmarks/conformance/), each constrained by its dataset's JSON-answer regex, decoded
greedily (so every speculative configuration must reproduce the plain output exactly;
the report counts the replies that do).

Configurations, per dataset:
  plain           `cd.generate` with the constraint (the baseline).
  jump_forward    `cd.generate` with `SamplingConfig(jump_forward=8)` (forced tokens fed
                  in one call), when that option exists: a reference point.
  ngram_k{k}_c    `cd.generate_speculative` with the prompt-lookup drafter, the draft
                  masked by the constraint (the paper's recipe).
  ngram_k{k}_u    the same drafter without the constraint on the draft (the target is
                  masked either way; invalid proposals are simply rejected).
  layers{n}_k{k}_c/_u   (with --layer-draft n) the target's own first n layers (and its
                  output head) as the draft model: the only smaller model of the same
                  family sharing the vocabulary that is available offline.

Reported: tokens/s (generated tokens, end of sequence included, over the wall time of
the whole call, prefill included; compilation is excluded by a warm-up call per prompt
shape), decode tokens/s (the same with the measured prefill time subtracted: what
speculation can speed up), acceptance rate (accepted / drafted draft tokens, up to each
row's end), tokens per target call (prefill included as the first token's call), and
replies identical to plain decoding and valid under the independent JSON check. CPU
speedup compares tokens per second of process CPU time (all threads), which depends
less on what else runs on a shared machine.
Configurations run interleaved per prompt batch so that load from other processes
affects all of them alike.

Run from the repository root:
  python benchmarks/speculative_bench.py                     # 8 prompts per dataset
  python benchmarks/speculative_bench.py --limit 2 --ks 4    # smoke test
"""

import argparse
import dataclasses
import json
import os
import platform
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # Run as a script from a checkout.

import jax  # pylint: disable=g-import-not-at-top

import constrained_decoding as cd  # pylint: disable=g-import-not-at-top
from constrained_decoding import models  # pylint: disable=g-import-not-at-top
from constrained_decoding.sampling import _generate  # pylint: disable=g-import-not-at-top
from constrained_decoding.tables import bucket_size  # pylint: disable=g-import-not-at-top

try:
  from benchmarks.conformance import run as conformance  # pylint: disable=g-import-not-at-top
except ImportError:
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "conformance"))
  import run as conformance  # pylint: disable=g-import-not-at-top

DEFAULT_OUT = os.path.join(_REPO, "benchmarks", "results", "speculative.json")
GREEDY = cd.SamplingConfig()


def layer_draft(model, num_layers: int):
  """The target's first `num_layers` blocks, final norm and tied head, as a draft model."""
  config = dataclasses.replace(model.config, num_layers=num_layers)
  params = {**model.params, "layers": tuple(model.params["layers"][:num_layers])}
  return dataclasses.replace(model, config=config, params=params)


def configurations(model, ks: list[int], layers: int) -> dict:
  """name -> function(prompts, tables, max_new_tokens) -> (completions, stats or None)."""

  def plain(sampling):
    return lambda p, t, n: (cd.generate(model, p, constraint=t, max_new_tokens=n,
                                        sampling=sampling), None)

  def spec(draft, k, constrain):
    return lambda p, t, n: cd.generate_speculative(
        model, p, draft=draft, num_draft_tokens=k, constraint=t, constrain_draft=constrain,
        max_new_tokens=n, sampling=GREEDY)

  configs = {"plain": plain(GREEDY)}
  if "jump_forward" in {f.name for f in dataclasses.fields(cd.SamplingConfig)}:
    configs["jump_forward"] = plain(cd.SamplingConfig(jump_forward=8))
  drafts = {"ngram": cd.NGramDrafter(max_ngram=3)}
  if layers:
    drafts[f"layers{layers}"] = layer_draft(model, layers)
  for name, draft in drafts.items():
    for k in ks:
      for constrain in (True, False):
        configs[f"{name}_k{k}_{'c' if constrain else 'u'}"] = spec(draft, k, constrain)
  return configs


def time_prefill(model, batch, tables, budget) -> float:
  """Seconds of tokenizing and prefilling `batch` (compiled first), which every
  configuration pays once per call; subtracted to report decode-only throughput."""
  # pylint: disable=protected-access
  jax.block_until_ready(_generate._prepare(model, batch, tables, None, budget, 0)[1])
  t0 = time.perf_counter()
  jax.block_until_ready(_generate._prepare(model, batch, tables, None, budget, 0)[1])
  return time.perf_counter() - t0


def run_dataset(model, compiler, task, configs: dict, args) -> dict:
  records = conformance.load_records(task, args.limit)
  tables, compile_info = conformance.compile_task(compiler, task)
  tables = jax.device_put(tables)
  budget = args.max_new_tokens or (compile_info["longest_token_path"] or 128) + 1
  prompts = [conformance.build_prompt(task, r) for r in records]
  # The last batch is padded with its last prompt (one shape); padding rows are not counted.
  batches = []
  for i in range(0, len(prompts), args.batch_size):
    chunk = prompts[i:i + args.batch_size]
    batches.append((chunk + [chunk[-1]] * (args.batch_size - len(chunk)), len(chunk)))
  print(f"{task.name}: {len(prompts)} prompts, batch {args.batch_size}, "
        f"max_new_tokens={budget}", flush=True)
  counters = ("seconds", "prefill_seconds", "cpu_seconds", "tokens", "drafted", "accepted",
              "rounds", "same_as_plain", "valid", "replies")
  totals = {name: dict.fromkeys(counters, 0) for name in configs}
  warmed = set()
  for b, (batch, real) in enumerate(batches):
    shape = bucket_size(max(len(model.encode(p)) for p in batch), 16)  # prompt bucket
    reference = None
    prefill = time_prefill(model, batch, tables, budget)
    for name, run in configs.items():
      if (name, shape) not in warmed:  # compile outside the clock
        t0 = time.perf_counter()
        run(batch, tables, budget)
        warmed.add((name, shape))
        print(f"  warm-up {name}: {time.perf_counter() - t0:.1f}s", flush=True)
      t0, c0 = time.perf_counter(), time.process_time()
      outs, stats = run(batch, tables, budget)
      seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
      outs = outs[:real]
      total = totals[name]
      total["seconds"] += seconds
      total["prefill_seconds"] += prefill
      total["cpu_seconds"] += cpu
      generated = sum(len(o.token_ids) + o.finished for o in outs)
      total["tokens"] += generated
      total["replies"] += len(outs)
      total["valid"] += sum(conformance.check_reply(task, o.text).strict and not o.error
                            for o in outs)
      if name == "plain":
        reference = outs
      total["same_as_plain"] += sum(o == r for o, r in zip(outs, reference))
      if stats is not None:
        total["drafted"] += sum(stats.drafted[:real])
        total["accepted"] += sum(stats.accepted[:real])
        # Target calls: one per round, plus the prefill's logits for the first token.
        total["rounds"] += sum(stats.rounds[:real])
      print(f"  batch {b}: {name:14s} {seconds:6.2f}s {generated:4d} tokens", flush=True)
  rows = []
  for name, t in totals.items():
    row = {"config": name, "replies": t["replies"], "tokens": t["tokens"],
           "seconds": round(t["seconds"], 3),
           "prefill_seconds": round(t["prefill_seconds"], 3),
           "cpu_seconds": round(t["cpu_seconds"], 3),
           "tokens_per_cpu_s": round(t["tokens"] / t["cpu_seconds"], 2),
           "tokens_per_s": round(t["tokens"] / t["seconds"], 2),
           "decode_tokens_per_s": round(t["tokens"] / (t["seconds"] - t["prefill_seconds"]), 2),
           "same_as_plain": t["same_as_plain"], "valid": t["valid"]}
    if t["drafted"]:
      row["acceptance_rate"] = round(t["accepted"] / t["drafted"], 3)
      row["tokens_per_target_call"] = round(t["tokens"] / (t["rounds"] + t["replies"]), 2)
    rows.append(row)
  base, decode_base = rows[0]["tokens_per_s"], rows[0]["decode_tokens_per_s"]
  for row in rows:
    row["speedup"] = round(row["tokens_per_s"] / base, 2)
    row["decode_speedup"] = round(row["decode_tokens_per_s"] / decode_base, 2)
    row["cpu_speedup"] = round(row["tokens_per_cpu_s"] / rows[0]["tokens_per_cpu_s"], 2)
  return {"compile": compile_info, "max_new_tokens": budget, "rows": rows}


def markdown(results: dict) -> str:
  lines = ["| dataset | config | tokens/s | speedup | decode tokens/s | decode speedup | "
           "CPU speedup | acceptance | tokens/target call | same as plain | valid |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for dataset, r in results.items():
    for row in r["rows"]:
      lines.append(
          f"| {dataset} | {row['config']} | {row['tokens_per_s']:.1f} | {row['speedup']:.2f} | "
          f"{row['decode_tokens_per_s']:.1f} | {row['decode_speedup']:.2f} | "
          f"{row['cpu_speedup']:.2f} | "
          f"{row.get('acceptance_rate', '—')} | {row.get('tokens_per_target_call', '—')} | "
          f"{row['same_as_plain']}/{row['replies']} | {row['valid']}/{row['replies']} |")
  return "\n".join(lines)


def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--limit", type=int, default=8, help="Prompts per dataset (0: all).")
  parser.add_argument("--batch-size", type=int, default=1)
  parser.add_argument("--ks", default="2,4,8", help="Draft lengths k to try.")
  parser.add_argument("--layer-draft", type=int, default=0,
                      help="Also draft with the target's first N layers (0: off).")
  parser.add_argument("--max-new-tokens", type=int, default=0,
                      help="Token budget (0: longest constrained reply + 1).")
  parser.add_argument("--datasets", default="multiple_choice,arithmetic")
  parser.add_argument("--out", default=DEFAULT_OUT)
  return parser.parse_args()


def main() -> None:
  args = parse_args()
  model = models.Gemma3.from_gguf(progress=False)
  compiler = cd.Compiler(model.vocab)
  configs = configurations(model, [int(k) for k in args.ks.split(",")], args.layer_draft)
  tasks = [t for t in conformance.make_tasks(48, 64) if t.name in args.datasets.split(",")]
  t0 = time.perf_counter()
  results = {task.name: run_dataset(model, compiler, task, configs, args) for task in tasks}
  table = markdown(results)
  print("\n" + table)
  report = {
      "benchmark": "speculative decoding with constraints", "model": "gemma3-270m (GGUF)",
      "decoding": "greedy", "args": vars(args),
      "environment": {"python": platform.python_version(), "jax": jax.__version__,
                      "backend": jax.default_backend(), "machine": platform.machine(),
                      "cpus": os.cpu_count()},
      "wall_seconds": round(time.perf_counter() - t0, 1),
      "datasets": results, "table_markdown": table,
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
