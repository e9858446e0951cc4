"""Jump-forward on the conformance prompts: model calls and tokens/s, with and without.

Gemma 3 270M, greedy, the few-shot JSON-answer prompts and regexes of
`benchmarks/conformance/run.py`. Each (dataset, batch size) is decoded twice with the
same prompts: plain (`SamplingConfig()`) and with jump-forward
(`SamplingConfig(jump_forward=J)`): after each sampled token, the tokens the constraint
forces (its allowed set is one token, or only end-of-sequence ids) are fed to the model
in the same call. What is timed is the jitted decode loop alone (`_decode`), after a
warm-up call per mode compiled its executable; prefill runs before the clock starts.
Timed passes over all prompts alternate between the modes (`--repeats`, default 3) and
the fastest pass of each is reported, with the process CPU time of the decode loop
(less sensitive than wall time to other jobs on a shared machine).

Reported per (dataset, batch, mode): decode seconds, generated tokens (end of sequence
included), tokens/s, decode-loop model calls (`DecodeState.calls`, summed over batches),
whether the greedy outputs are identical to plain decoding's, and the strict
conformance of the replies (`json.loads` + key checks, as in conformance/run.py).

Also measured, because it decides what jump-forward can gain with this vocabulary:
  forced_states  tokens of the plain replies emitted in a state that forces its token.
  draft_matches  tokens of the plain replies equal to the longest token allowed in their
                 state, when at most 64 tokens are allowed: what a drafter that proposes
                 "the longest allowed token" would get accepted under greedy verification
                 (as speculative decoding verifies drafts). Gemma spells every byte two
                 ways (a piece and a byte-fallback token) and has two end-of-sequence
                 ids, so a literal never has a single allowed token; only verification
                 can skip model calls inside it.

Run from the repository root:
  python benchmarks/jump_forward_bench.py                      # 16 questions, batch 1 and 8
  python benchmarks/jump_forward_bench.py --limit 2 --batch-sizes 1 --max-new-tokens 16
"""

import argparse
import json
import os
import platform
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # Run as a script from a checkout.

import jax  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

import constrained_decoding as cd  # pylint: disable=g-import-not-at-top
from constrained_decoding.sampling import _generate  # pylint: disable=g-import-not-at-top
from constrained_decoding.testing import _reference  # pylint: disable=g-import-not-at-top

try:
  from benchmarks.conformance import run as conformance  # pylint: disable=g-import-not-at-top
except ImportError:
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "conformance"))
  import run as conformance  # pylint: disable=g-import-not-at-top

DEFAULT_OUT = os.path.join(_REPO, "benchmarks", "results", "jump_forward.json")
_DRAFT_MAX_ALLOWED = 64


def _batches(prompts, batch_size):
  """Prompt batches; the last one padded with its last prompt (one shape, one compile)."""
  out = []
  for start in range(0, len(prompts), batch_size):
    chunk = prompts[start:start + batch_size]
    out.append((chunk, chunk + [chunk[-1]] * (batch_size - len(chunk))))
  return out


def decode_pass(model, tables, batches, max_new_tokens, sampling):
  """Decodes every batch; returns (completions, (wall, cpu) seconds, calls, tokens). Only
  `_decode` is timed (prefill and host post-processing are not)."""
  seconds, cpu, calls, tokens, out = 0.0, 0.0, 0, 0, []
  for chunk, padded in batches:
    tables_dev, state, eos_ids = _generate._prepare(  # pylint: disable=protected-access
        model, padded, tables, None, max_new_tokens, 0)
    jax.block_until_ready(state)
    started, cpu_started = time.perf_counter(), time.process_time()
    state = _generate._decode_until(  # pylint: disable=protected-access
        model, tables_dev, state, max_new_tokens, eos_ids, sampling)
    jax.block_until_ready(state)
    seconds += time.perf_counter() - started
    cpu += time.process_time() - cpu_started
    calls += int(state.calls)
    done = _generate._completions(model, state, max_new_tokens)[:len(chunk)]  # pylint: disable=protected-access
    tokens += sum(len(c.token_ids) + c.finished for c in done)
    out.extend(done)
  return out, (seconds, cpu), calls, tokens


def _longest_allowed(allowed: np.ndarray, lengths: np.ndarray) -> int:
  ids = np.nonzero(allowed)[0]
  if not 1 <= len(ids) <= _DRAFT_MAX_ALLOWED:
    return -1
  return int(ids[np.argmax(lengths[ids] * (1 << 20) + ids)])


def forcing_profile(model, tables, completions) -> dict:
  """How many reply tokens sit in forcing states, and how many a longest-token drafter
  would have guessed (host walk with the numpy reference of the constraint)."""
  lengths = np.array([len(b or b"") for b in model.vocab.token_bytes]
                     + [0] * (model.vocab.vocab_size - len(model.vocab.token_bytes)))
  eos = set(model.vocab.eos_ids)
  total = forced = matches = 0
  for c in completions:
    ids = list(c.token_ids) + ([model.vocab.eos_ids[0]] if c.finished else [])
    state, stack = int(np.asarray(tables.start)[0]), ()
    for token in ids:
      allowed = _reference.reference_allowed(tables, state, stack)
      choices = set(np.nonzero(allowed)[0].tolist())
      total += 1
      forced += len(choices - eos) == 1 and not choices & eos or (choices and choices <= eos)
      matches += _longest_allowed(allowed, lengths) == token
      if token in eos:
        break
      state, stack = _reference.reference_step_stack(tables, state, stack, int(token))
  return {"reply_tokens": total, "forced_states": int(forced), "draft_matches": int(matches)}


def run_dataset(model, compiler, task, args) -> dict:
  records = conformance.load_records(task, args.limit)
  prompts = [conformance.build_prompt(task, r) for r in records]
  tables, compile_info = conformance.compile_task(compiler, task)
  result = {"questions": len(records), "compile_seconds": compile_info["seconds"],
            "batches": {}}
  configs = {"plain": cd.SamplingConfig(),
             "jump_forward": cd.SamplingConfig(jump_forward=args.jump)}
  for batch_size in args.batch_sizes:
    batches = _batches(prompts, batch_size)
    for sampling in configs.values():  # compile both executables before any timing
      decode_pass(model, tables, batches[:1], args.max_new_tokens, sampling)
    runs = {mode: [] for mode in configs}
    for _ in range(args.repeats):  # interleaved, so that load changes hit both modes
      for mode, sampling in configs.items():
        runs[mode].append(decode_pass(model, tables, batches, args.max_new_tokens, sampling))
    modes = {}
    plain_texts = [c.text for c in runs["plain"][0][0]]
    for mode, passes in runs.items():
      outs, _, calls, tokens = passes[0]
      seconds = sorted(p[1][0] for p in passes)
      cpu = min(p[1][1] for p in passes)
      texts = [c.text for c in outs]
      strict = sum(conformance.check_reply(task, t).strict for t in texts) / len(texts)
      modes[mode] = {"decode_seconds_min": round(seconds[0], 3),
                     "decode_seconds_median": round(seconds[len(seconds) // 2], 3),
                     "decode_cpu_seconds_min": round(cpu, 3),
                     "tokens": tokens, "tokens_per_second": round(tokens / seconds[0], 2),
                     "model_calls": calls,
                     "identical_to_plain": all([c.text for c in p[0]] == plain_texts
                                               for p in passes),
                     "conform_strict": strict}
      print(f"  {task.name} batch {batch_size} {mode}: {modes[mode]}", flush=True)
    if "profile" not in result:
      result["profile"] = forcing_profile(model, tables, runs["plain"][0][0])
      print(f"  {task.name} profile: {result['profile']}", flush=True)
    plain, jump = modes["plain"], modes["jump_forward"]
    modes["speedup_tokens_per_second"] = round(
        jump["tokens_per_second"] / plain["tokens_per_second"], 3)
    modes["cpu_seconds_ratio"] = round(
        jump["decode_cpu_seconds_min"] / plain["decode_cpu_seconds_min"], 3)
    modes["model_calls_saved"] = plain["model_calls"] - jump["model_calls"]
    result["batches"][str(batch_size)] = modes
  return result


def markdown(results: dict) -> str:
  lines = ["| dataset | batch | calls plain | calls jump | tok/s plain | tok/s jump | speedup "
           "| CPU s jump / plain | identical | forced / reply tokens | draft matches |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for name, r in results.items():
    p = r["profile"]
    for batch, m in r["batches"].items():
      lines.append(
          f"| {name} | {batch} | {m['plain']['model_calls']} | "
          f"{m['jump_forward']['model_calls']} | {m['plain']['tokens_per_second']} | "
          f"{m['jump_forward']['tokens_per_second']} | {m['speedup_tokens_per_second']} | "
          f"{m['cpu_seconds_ratio']} | "
          f"{m['jump_forward']['identical_to_plain']} | {p['forced_states']} / "
          f"{p['reply_tokens']} | {p['draft_matches']} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--limit", type=int, default=16, help="questions per dataset")
  parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")],
                      default=[1, 8])
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--jump", type=int, default=8, help="forced tokens per model call")
  parser.add_argument("--repeats", type=int, default=3,
                      help="timed passes per mode, interleaved; the fastest is reported")
  parser.add_argument("--datasets", default="multiple_choice,arithmetic")
  parser.add_argument("--out", default=DEFAULT_OUT)
  args = parser.parse_args()
  model = cd.models.Gemma3.from_gguf()
  compiler = cd.Compiler(model.vocab)
  tasks = [t for t in conformance.make_tasks(48, 64) if t.name in args.datasets.split(",")]
  results = {t.name: run_dataset(model, compiler, t, args) for t in tasks}
  table = markdown(results)
  print("\n" + table)
  report = {"benchmark": "jump_forward", "model": "Gemma 3 270M (GGUF Q4_K_M, float32)",
            "decoding": "greedy", "limit": args.limit, "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "jump_forward": args.jump, "table_markdown": table, "datasets": results,
            "environment": {"python": platform.python_version(), "jax": jax.__version__,
                            "backend": jax.default_backend(), "cpus": os.cpu_count()}}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
