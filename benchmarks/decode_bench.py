"""Decode throughput, unconstrained vs constrained, and proof that decoding stays on device.

Same model (Gemma 3 270M), same prompts, same number of generated tokens; only the
constraint differs. What is timed is the jitted decode loop alone (`_decode`: one
`lax.while_loop` that masks, samples, advances the constraint and runs the model): the
prefill runs before the clock starts and every executable is compiled by a warm-up call.

Constraints:
  none        unconstrained (the loop is traced without any constraint code).
  no_eos      `[^\\x00]*\\x00`: any text, ended only by a NUL byte, which the model never
              writes. End of sequence is forbidden, so every row runs the full N tokens
              and both loops do exactly the same number of steps. It is also the costliest
              table shape: ~256k explicit edges per state (the widest binary search).
  mc_json     the multiple-choice JSON answer regex of benchmarks/conformance/run.py
              (realistic; its rows stop early, so it is compared per step).

Reported per (batch size, constraint): decode seconds per step (min and median over
interleaved repeats), tokens/s (= batch / seconds per step), and the ratio of constrained
to unconstrained throughput (target >= 0.97). On a machine shared with other jobs the
min is the estimate to trust. As a check that does not depend on load, the constraint's
own step work (mask + argmax + advance against argmax alone, outside the model) is
also timed by itself. Peak RSS (`resource.getrusage`) is sampled
after each phase; it is a process-wide high-water mark, so phases run in the order model
load -> unconstrained warm-up -> constraint compile -> constrained warm-up -> timing.

Host round trips: the jaxpr of `_decode` is searched for callback primitives, and the
lowered StableHLO and the compiled HLO for custom calls to host callbacks, infeed/outfeed
and send/recv; `while` ops are counted. The benchmark fails if any host transfer is found.

Run from the repository root:
  python benchmarks/decode_bench.py                        # batch 1 and 8, 64 tokens
  python benchmarks/decode_bench.py --batch-sizes 1 --tokens 8 --repeats 1   # smoke test
"""

import argparse
import json
import os
import platform
import re
import resource
import statistics
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # Run as a script from a checkout.

import jax  # pylint: disable=g-import-not-at-top
import jax.extend  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

import constrained_decoding as cd  # pylint: disable=g-import-not-at-top
from constrained_decoding.sampling import _generate  # pylint: disable=g-import-not-at-top
from constrained_decoding.sampling import _loop  # pylint: disable=g-import-not-at-top



DEFAULT_OUT = os.path.join(_REPO, "benchmarks", "results", "decode.json")
NO_EOS_PATTERN = r"[^\x00]*\x00"
CALLBACK_PRIMITIVES = ("callback", "outfeed", "infeed", "send", "recv")
GREEDY = cd.SamplingConfig(temperature=0.0)


def peak_rss_mb() -> float:
  """Process peak resident set size in MiB (ru_maxrss is KiB on Linux)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------------------ inputs


def _conformance():
  """benchmarks/conformance/run.py, imported when used: it imports the compiler
  (pynini), which `device_kit run` must not need."""
  try:
    from benchmarks.conformance import run  # pylint: disable=import-outside-toplevel
  except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "conformance"))
    import run  # pylint: disable=import-outside-toplevel
  return run


def load_prompts(count: int) -> list[str]:
  """The first `count` few-shot multiple-choice prompts of the conformance benchmark."""
  conformance = _conformance()
  task = conformance.make_tasks(48, 64)[0]
  with open(task.path, encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [conformance.build_prompt(task, r) for r in records[:count]]


def compile_constraints(model, names: list[str]) -> tuple[dict, dict]:
  """Tables per constraint name (None for unconstrained) and their compile costs."""
  compiler = cd.Compiler(model.vocab)
  patterns = {"no_eos": NO_EOS_PATTERN, "mc_json": _conformance().mc_pattern(48)}
  tables, info = {"none": None}, {}
  for name in names:
    if name == "none":
      continue
    t0 = time.perf_counter()
    tables[name], ci = compiler.compile_with_info(cd.Regex(patterns[name]))
    info[name] = {"pattern": patterns[name], "seconds": round(time.perf_counter() - t0, 4),
                  "token_states": ci.token_states, "token_edges": ci.token_edges,
                  "table_bytes": ci.nbytes["total"],
                  "table_shape_SEM": [tables[name].accepting.shape[0], tables[name].edge_tokens.shape[0],
                                      tables[name].mask_bits.shape[0]]}
  return tables, info


# ------------------------------------------------------------------------------ timing


def decode_args(model, prompts, tables, tokens: int):
  """Prefilled loop inputs (prefill runs and finishes here, outside any timing)."""
  tables_dev, state, eos_ids = _generate._prepare(  # pylint: disable=protected-access
      model, prompts, tables, None, tokens, seed=0)
  jax.block_until_ready(state)
  return (model.params, tables_dev, state, jnp.int32(tokens), eos_ids,
          jnp.float32(GREEDY.temperature), jnp.float32(GREEDY.top_p))


def time_decode(model, prompts, tables, tokens: int) -> tuple[float, float, int]:
  """Wall seconds and process CPU seconds of one decode loop, and the steps it ran.

  CPU time (all threads of this process) counts the work done, whatever share of the
  cores other processes take meanwhile; wall time is what a user waits.
  """
  args = decode_args(model, prompts, tables, tokens)
  t0, c0 = time.perf_counter(), time.process_time()
  out = _loop.decode(*args, network=model.network,  # pylint: disable=protected-access
                          sampling=GREEDY.static_part())
  jax.block_until_ready(out)
  return time.perf_counter() - t0, time.process_time() - c0, int(out.step)


def warm_up(model, prompts_by_batch, tables: dict, tokens: int, samples: dict) -> None:
  """Compiles (and runs once) the decode loop per (batch, constraint). `tokens` must be
  the timed runs' value: it sets the token buffer and KV-cache shapes."""
  for name, constraint in tables.items():
    for batch, prompts in prompts_by_batch.items():
      t0 = time.perf_counter()
      time_decode(model, prompts, constraint, tokens)
      seconds = time.perf_counter() - t0
      samples[(batch, name)] = {"warmup_seconds": seconds, "runs": []}
      print(f"  warm-up batch {batch} {name}: {seconds:.1f}s", flush=True)


def timed_runs(model, prompts_by_batch, tables: dict, tokens: int, repeats: int,
               samples: dict) -> None:
  """Timed repeats, interleaved over constraints so that load from other processes on
  the machine hits every configuration alike."""
  for rep in range(repeats):
    for batch, prompts in prompts_by_batch.items():
      for name, constraint in tables.items():
        seconds, cpu, steps = time_decode(model, prompts, constraint, tokens)
        samples[(batch, name)]["runs"].append((seconds, cpu, steps))
        print(f"  rep {rep} batch {batch} {name}: {seconds:.2f}s wall, {cpu:.2f}s CPU / "
              f"{steps} steps", flush=True)


def summarize(samples: dict) -> list[dict]:
  """Per (batch, constraint): seconds per step, tokens/s, ratio to unconstrained.

  `ratio` uses each configuration's best run; `ratio_paired` is the median over repeats
  of the ratio between runs of the same repeat (adjacent in time, so they share the
  machine's load at that moment); `ratio_cpu` compares median CPU time per step.
  """
  rows = []
  for (batch, name), s in samples.items():
    per_step = [sec / steps for sec, _, steps in s["runs"]]
    cpu_step = [cpu / steps for _, cpu, steps in s["runs"]]
    rows.append({"batch": batch, "constraint": name, "steps": [st for *_, st in s["runs"]],
                 "step_ms": [round(p * 1e3, 2) for p in per_step],
                 "cpu_ms_per_step": [round(c * 1e3, 2) for c in cpu_step],
                 "cpu_ms_per_step_median": statistics.median(cpu_step) * 1e3,
                 "step_ms_min": min(per_step) * 1e3,
                 "step_ms_median": statistics.median(per_step) * 1e3,
                 "tokens_per_s": batch / min(per_step),
                 "tokens_per_s_median": batch / statistics.median(per_step),
                 "warmup_seconds": round(s["warmup_seconds"], 2)})
  base = {r["batch"]: r for r in rows if r["constraint"] == "none"}
  for r in rows:
    b = base[r["batch"]]
    r["ratio"] = r["tokens_per_s"] / b["tokens_per_s"]
    r["ratio_median"] = r["tokens_per_s_median"] / b["tokens_per_s_median"]
    r["ratio_paired"] = statistics.median(
        base_ms / ms for base_ms, ms in zip(b["step_ms"], r["step_ms"]))
    r["ratio_cpu"] = b["cpu_ms_per_step_median"] / r["cpu_ms_per_step_median"]
  return rows


def _best_ms(fn, args, iters: int) -> float:
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best * 1e3


@jax.jit
def _greedy_step(logits):
  return jnp.argmax(logits, axis=-1).astype(jnp.int32)


@jax.jit
def _constrained_greedy_step(tables, state, logits):
  logits = cd.runtime.mask_logits(tables, state, logits)
  token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  return cd.runtime.advance(tables, state, token), token


def step_overhead(tables: dict, batch_sizes: list[int], vocab_size: int,
                  iters: int) -> list[dict]:
  """The constraint's own per-step work, timed alone (best of `iters`): greedy argmax
  with mask + advance against argmax alone on random logits. Unlike the end-to-end
  numbers this hardly moves with load from other processes, so it tells a real
  slowdown from noise."""
  rows = []
  for batch in batch_sizes:
    logits = jax.random.normal(jax.random.PRNGKey(0), (batch, vocab_size))
    base = _best_ms(_greedy_step, (logits,), iters)
    for name, constraint in tables.items():
      if constraint is None:
        continue
      dev = jax.device_put(constraint)
      state = cd.runtime.init_state(dev, batch_size=batch)
      ms = _best_ms(_constrained_greedy_step, (dev, state, logits), iters)
      rows.append({"batch": batch, "constraint": name, "argmax_ms": round(base, 3),
                   "mask_argmax_advance_ms": round(ms, 3),
                   "overhead_ms": round(ms - base, 3)})
  return rows


# ------------------------------------------------------------------- on-device evidence


def _primitives(jaxpr, counts: dict) -> dict:
  """Counts every primitive in a closed jaxpr, recursing into sub-jaxprs."""
  for eqn in jaxpr.eqns:
    counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      _primitives(sub, counts)
  return counts


def _hlo_facts(text: str, while_pattern: str, call_pattern: str) -> dict:
  """While-op count (with the JAX op each came from, where the text says), custom-call
  targets and host-transfer ops of one HLO / StableHLO module."""
  calls = sorted(set(re.findall(call_pattern, text)))
  whiles = [line for line in text.splitlines() if re.search(while_pattern, line)]
  origins = [m.group(1) for m in (re.search(r'op_name="([^"]*)"', w) for w in whiles) if m]
  return {"while_ops": len(whiles), "while_origins": origins, "custom_call_targets": calls,
          "host_transfer_ops": sorted({m for m in re.findall(
              r"\b(infeed|outfeed|send|recv|send-done|recv-done)\(", text)})}


def _host_transfers(facts: dict) -> list[str]:
  """Everything in `facts` that would move data to or from the host mid-loop."""
  return facts["jaxpr_callbacks"] + [
      t for k in ("stablehlo", "compiled_hlo") for t in facts[k]["custom_call_targets"]
      if "callback" in t.lower() or "python" in t.lower()] + [
      t for k in ("stablehlo", "compiled_hlo") for t in facts[k]["host_transfer_ops"]]


def _lowering_facts(fn, args, lowered) -> dict:
  """jaxpr facts of `fn(*args)`; StableHLO and compiled-HLO facts of `lowered` (the
  same computation, lowered by the jitted function that production code calls)."""
  prims = _primitives(jax.make_jaxpr(fn)(*args).jaxpr, {})
  facts = {
      "jaxpr_while": prims.get("while", 0),
      "jaxpr_callbacks": sorted(p for p in prims
                                if any(c in p for c in CALLBACK_PRIMITIVES)),
      "stablehlo": _hlo_facts(lowered.as_text(), r"stablehlo\.while\b",
                              r"custom_call @([\w.]+)"),
      "compiled_hlo": _hlo_facts(lowered.compile().as_text(), r"\swhile\(",
                                 r"custom_call_target=\"([^\"]+)\""),
  }
  facts["offending"] = _host_transfers(facts)
  facts["host_round_trip"] = bool(facts["offending"])
  return facts


def detector_self_check() -> dict:
  """The same checks on a loop that *does* call the host each step must flag it;
  otherwise a clean result for `_decode` would prove nothing."""
  def body(i):
    jax.debug.callback(lambda v: None, i)
    return i + 1
  fn = lambda n: jax.lax.while_loop(lambda i: i < n, body, jnp.int32(0))
  args = (jnp.int32(3),)
  facts = _lowering_facts(fn, args, jax.jit(fn).lower(*args))
  assert facts["host_round_trip"], f"detector missed a host callback: {facts}"
  return {"flagged": facts["offending"]}


def loop_evidence(model, prompts, tables) -> dict:
  """jaxpr / StableHLO / compiled-HLO facts of `_decode` for one constraint."""
  args = decode_args(model, prompts, tables, 4)
  static = {"network": model.network, "sampling": GREEDY.static_part()}
  fn = lambda *a: _loop.decode(*a, **static)  # pylint: disable=protected-access
  lowered = _loop.decode.lower(*args, **static)  # pylint: disable=protected-access
  return _lowering_facts(fn, args, lowered)


# ------------------------------------------------------------------------------ report


def markdown(rows: list[dict]) -> str:
  lines = ["| batch | constraint | steps | ms/step (min) | ms/step (median) | tokens/s | "
           "ratio vs none (best runs) | ratio (paired, median) | CPU ms/step (median) | "
           "ratio (CPU time) |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in sorted(rows, key=lambda r: (r["batch"], r["constraint"] != "none")):
    lines.append(f"| {r['batch']} | {r['constraint']} | {max(r['steps'])} | "
                 f"{r['step_ms_min']:.1f} | {r['step_ms_median']:.1f} | "
                 f"{r['tokens_per_s']:.1f} | {r['ratio']:.3f} | {r['ratio_paired']:.3f} | "
                 f"{r['cpu_ms_per_step_median']:.1f} | {r['ratio_cpu']:.3f} |")
  return "\n".join(lines)


def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch-sizes", default="1,8")
  parser.add_argument("--tokens", type=int, default=64, help="Generated tokens per row.")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--constraints", default="none,no_eos,mc_json")
  parser.add_argument("--out", default=DEFAULT_OUT)
  return parser.parse_args()


def main() -> None:
  args = parse_args()
  batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
  names = args.constraints.split(",")
  if names[0] != "none":
    names = ["none"] + [n for n in names if n != "none"]
  rss = {"start": peak_rss_mb()}
  model = cd.models.Gemma3.from_gguf()
  rss["after_model_load"] = peak_rss_mb()
  prompts = load_prompts(max(batch_sizes))
  prompts_by_batch = {b: prompts[:b] for b in batch_sizes}
  self_check = detector_self_check()
  print("detector self-check (a loop with jax.debug.callback) flags:", self_check["flagged"])

  # Phases in this order, so that the peak-RSS samples separate the constraint's cost.
  samples, evidence = {}, {}
  evidence["none"] = loop_evidence(model, prompts[:1], None)
  warm_up(model, prompts_by_batch, {"none": None}, args.tokens, samples)
  rss["after_unconstrained_warmup"] = peak_rss_mb()
  tables, compile_info = compile_constraints(model, names)
  tables = {n: tables[n] for n in names}
  print("compile:", json.dumps(compile_info), flush=True)
  rss["after_constraint_compile"] = peak_rss_mb()
  constrained = {n: t for n, t in tables.items() if n != "none"}
  for name, constraint in constrained.items():
    evidence[name] = loop_evidence(model, prompts[:1], constraint)
  warm_up(model, prompts_by_batch, constrained, args.tokens, samples)
  rss["after_constrained_warmup"] = peak_rss_mb()
  for name, facts in evidence.items():
    print(f"decode loop ({name}): jaxpr while={facts['jaxpr_while']} callbacks="
          f"{facts['jaxpr_callbacks']}; StableHLO while={facts['stablehlo']['while_ops']} "
          f"custom_calls={facts['stablehlo']['custom_call_targets']}; compiled HLO while="
          f"{facts['compiled_hlo']['while_ops']} custom_calls="
          f"{facts['compiled_hlo']['custom_call_targets']} host transfers="
          f"{facts['compiled_hlo']['host_transfer_ops']}; while ops come from "
          f"{facts['compiled_hlo']['while_origins']}", flush=True)

  overhead = step_overhead(tables, batch_sizes, model.config.vocab_size, 50)
  for r in overhead:
    print(f"  step work alone, batch {r['batch']} {r['constraint']}: mask+argmax+advance "
          f"{r['mask_argmax_advance_ms']:.2f} ms vs argmax {r['argmax_ms']:.2f} ms", flush=True)
  timed_runs(model, prompts_by_batch, tables, args.tokens, args.repeats, samples)
  rss["after_timing"] = peak_rss_mb()
  rows = summarize(samples)
  table = markdown(rows)
  print("\n" + table)
  print("peak RSS MiB:", {k: round(v) for k, v in rss.items()})
  report = {
      "benchmark": "decode",
      "model": "Gemma 3 270M (base, GGUF Q4_K_M dequantized, float32)",
      "tokens": args.tokens, "repeats": args.repeats, "decoding": "greedy",
      "prompt_tokens": [len(model.encode(p)) for p in prompts],
      "environment": {"python": platform.python_version(), "jax": jax.__version__,
                      "backend": jax.default_backend(), "cpus": os.cpu_count()},
      "compile": compile_info, "rows": rows, "table_markdown": table,
      "step_overhead": overhead,
      "peak_rss_mib": {k: round(v, 1) for k, v in rss.items()},
      "loop_evidence": evidence, "detector_self_check": self_check,
  }
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  print(f"wrote {args.out}")
  if any(f["host_round_trip"] for f in evidence.values()):
    sys.exit("host round trip found in the decode loop: " + json.dumps(
        {n: f["offending"] for n, f in evidence.items()}))


if __name__ == "__main__":
  main()
