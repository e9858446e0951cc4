"""Grammar-aligned sampling (ASAp) against plain constrained sampling: paper 003, Fig. 5a.

Gemma 3 270M, the grammar G_sk of the paper's Ex. 3 (`00000`, or any 5-digit binary
string starting with `1`) as a regex, and a few-shot prompt of random bits under which
the model's *conditioned* distribution Q(w) ∝ 1[w ∈ L] P(w) gives `00000` probability
0.13 while plain constrained sampling (GCD) draws it about half the time.

Q is exact: every token sequence the compiled tables accept (non-canonical tokenizations
included) is enumerated and scored by teacher forcing (`testing.exact_distribution`).
Reported, for GCD and ASAp at batch 1 and batch 8:
  * the cumulative empirical KL(Q̃_m || Q) of the first m samples, m = 1 .. M (the
    paper's 25-sample sliding window has a noise floor as large as the bias); ASAp's
    first samples explore every unvisited branch, so its early KL is the worse one;
  * the cumulative expectation of "ends with 1" (paper Fig. 6) against Q's;
  * seconds per sample, after a warm-up call that compiles everything; ASAp against
    GCD (the decode loop of `cd.generate`: same prompt, budget and temperature, b rows
    per round, the prompt prefilled once per run in both).
GCD's samples are independent of the batch size, so its KL curve is drawn once (batch
8); its batch-1 cost is timed on `--gcd-timing-samples` samples.

Writes `benchmarks/results/aligned.json` and `aligned.png` (matplotlib: the bench
extra). Run from the repository root:
  python benchmarks/aligned_bench.py --samples 500          # what a 2-core CPU affords
  python benchmarks/aligned_bench.py --samples 2000         # the paper's length
  python benchmarks/aligned_bench.py --cost-rounds 20       # cost only, interleaved
  python benchmarks/aligned_bench.py --grammar slia --samples 256   # push-down SLIA
The SLIA mode writes `benchmarks/results/aligned_slia.json` (see `_slia_run`).
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
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

import constrained_decoding as cd  # pylint: disable=g-import-not-at-top
from constrained_decoding.sampling import _generate  # pylint: disable=g-import-not-at-top
from constrained_decoding.testing import _exact  # pylint: disable=g-import-not-at-top

PATTERN = r"00000|1[01]{4}"
PROMPT = "Random bits: 1 0 0 1 0 1 1 0 1 0 0 0 1 1 0 1\nA random 5-bit binary string: "
MAX_NEW_TOKENS = 8  # five digits and end of sequence fit
# A SyGuS-style bit-vector grammar (the paper's INV-BV4 family, written for this
# repository): recursive, so the tables are push-down.
BV_GRAMMAR = r"""
root ::= expr
expr ::= "x" | "y" | "#x0" | "#x1" | "(bvnot " expr ")" | "(" op " " expr " " expr ")"
op ::= "bvand" | "bvor" | "bvxor" | "bvadd"
"""
BV_PROMPT = ("; SyGuS, bit-vectors. Synthesize f(x, y) = x AND y.\n"
             "(define-fun f ((x (_ BitVec 4)) (y (_ BitVec 4))) (_ BitVec 4) ")
BV_MAX_NEW_TOKENS = 24
# A SyGuS-style string grammar (the paper's SLIA family, written for this repository):
# string and integer terms over one variable `name`, truly recursive (push-down tables),
# so its language is infinite and Q is checked by importance sampling (`_slia_run`).
SLIA_GRAMMAR = r"""
root ::= s
s ::= "name" | "\" \"" | "(str.++ " s " " s ")" | "(str.at " s " " i ")" | "(str.substr " s " " i " " i ")" | "(str.replace " s " " s " " s ")"
i ::= "0" | "1" | "2" | "(str.len " s ")" | "(+ " i " " i ")"
"""
SLIA_PROMPT = (
    "; SyGuS SLIA: a solution term for each function, in the grammar of the track.\n"
    "; f(name) = name followed by a space\n(str.++ name \" \")\n"
    "; f(name) = the second character of name\n(str.at name 1)\n"
    "; f(name) = name without its first character\n(str.substr name 1 (str.len name))\n"
    "; f(name) = the first character of name\n")
SLIA_MAX_NEW_TOKENS = 40


def _cumulative_kl(samples, exact) -> list[float]:
  """KL(empirical of the first m samples || Q) for m = 1 .. len(samples)."""
  counts = np.zeros(len(exact.sequences))
  log_q = np.log(exact.q)
  out = []
  for m, s in enumerate(samples, start=1):
    counts[exact.index[tuple(s.token_ids)]] += 1
    seen = counts > 0
    freq = counts[seen] / m
    out.append(float(np.sum(freq * (np.log(freq) - log_q[seen]))))
  return out


def _decode_steps(samples, batch_size: int) -> int:
  """Decode-loop iterations the samples took: per round of b rows, the longest row
  (its tokens, plus the end of sequence if it finished)."""
  return sum(max(len(s.token_ids) + s.finished for s in samples[i:i + batch_size])
             for i in range(0, len(samples), batch_size))


def _ends_with_1(samples) -> list[float]:
  ones = np.cumsum([s.text.endswith("1") for s in samples])
  return (ones / np.arange(1, len(samples) + 1)).tolist()


def _gcd(model, tables, num_samples, batch_size, sampling, seed, *, prompt=None,
         max_new_tokens=None):
  """(samples, seconds) of plain constrained sampling, b rows per round.

  The decode loop of `cd.generate` (`_loop.decode`), with the prompt prefilled
  once as `generate_aligned` does, so that the two differ only in their rounds.
  """
  prompt = PROMPT if prompt is None else prompt
  max_new_tokens = MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
  placed, init, eos_ids = _generate._prepare(model, [prompt] * batch_size, tables, None,  # pylint: disable=protected-access
                                             max_new_tokens, seed)
  key = jax.random.PRNGKey(seed)

  def draw(r):
    state = jax.tree.map(jnp.copy, init).replace(rng=jax.random.fold_in(key, r))
    state = _generate._decode_until(model, placed, state, max_new_tokens, eos_ids, sampling)  # pylint: disable=protected-access
    return _generate._completions(model, state, max_new_tokens)  # pylint: disable=protected-access

  draw(10**6)  # compiles
  samples = []
  start = time.perf_counter()
  for r in range(-(-num_samples // batch_size)):
    samples += draw(r)
  return samples[:num_samples], time.perf_counter() - start


def _aligned(model, tables, num_samples, batch_size, sampling, seed, capacity):
  """(samples, seconds, store) of ASAp with a fresh store."""
  cd.generate_aligned(model, PROMPT, constraint=tables, num_samples=batch_size,
                      batch_size=batch_size, sampling=sampling, seed=10**6,
                      max_new_tokens=MAX_NEW_TOKENS, capacity=capacity)  # compiles
  start = time.perf_counter()
  samples, store = cd.generate_aligned(
      model, PROMPT, constraint=tables, num_samples=num_samples, batch_size=batch_size,
      sampling=sampling, seed=seed, max_new_tokens=MAX_NEW_TOKENS, capacity=capacity)
  return samples, time.perf_counter() - start, store


def _bv_run(model, sampling, num_samples, seed):
  """The push-down grammar: both methods run, every finished sample parses (the
  grammar's own tables re-walk it), and what they draw most often."""
  tables = cd.Compiler(model.vocab).compile(cd.Grammar(BV_GRAMMAR))
  assert tables.is_pushdown
  out = {"grammar": BV_GRAMMAR, "prompt": BV_PROMPT, "samples": num_samples}
  runs = {}
  runs["gcd"] = _gcd(model, tables, num_samples, 8, sampling, seed, prompt=BV_PROMPT,
                     max_new_tokens=BV_MAX_NEW_TOKENS)
  kwargs = dict(constraint=tables, batch_size=8, sampling=sampling,
                max_new_tokens=BV_MAX_NEW_TOKENS, capacity=1 << 14)
  cd.generate_aligned(model, BV_PROMPT, num_samples=8, seed=10**6, **kwargs)
  start = time.perf_counter()
  aligned, store = cd.generate_aligned(model, BV_PROMPT, num_samples=num_samples, seed=seed,
                                       **kwargs)
  runs["asap"] = (aligned, time.perf_counter() - start)
  for name, (samples, seconds) in runs.items():
    finished = [s for s in samples if s.finished]
    assert not any(s.error for s in samples)
    texts = [s.text for s in finished]
    top = sorted(set(texts), key=lambda t: -texts.count(t))[:5]
    out[name] = {"seconds_per_sample": seconds / len(samples),
                 "finished": len(finished), "distinct": len(set(texts)),
                 "top": [[t, texts.count(t)] for t in top]}
    print(f"BV grammar {name}: {seconds / len(samples) * 1e3:.1f} ms/sample, "
          f"{len(finished)}/{len(samples)} finished, top {out[name]['top'][:3]}", flush=True)
  out["asap"]["store_nodes"] = store.num_nodes
  out["asap"]["log_mass_bound"] = store.log_mass_bound
  return out


def _score(model, prompt, tables, sequences, sampling):
  """{sequence: (log P(w), log q_GCD(w))} of accepted token sequences, by teacher forcing:
  `testing.exact_distribution` given these sequences instead of an enumeration of the
  (here infinite) language."""
  from unittest import mock  # pylint: disable=g-import-not-at-top

  sequences = sorted(set(sequences))
  with mock.patch.object(_exact, "accepted_sequences", lambda *a, **k: sequences):
    dist = _exact.exact_distribution(model, prompt, tables, sampling=sampling, batch_size=16)
  return {w: (float(lp), float(lg)) for w, lp, lg in zip(dist.sequences, dist.log_p,
                                                          dist.log_gcd)}


def _slia_features(text: str) -> dict[str, float]:
  """The statistics whose expectation under Q is compared (paper Fig. 6 in spirit)."""
  return {"str.at at the top": float(text.startswith("(str.at ")),
          "str.substr at the top": float(text.startswith("(str.substr ")),
          "uses str.len": float("(str.len " in text),
          "depth": float(max(np.cumsum([{"(": 1, ")": -1}.get(c, 0) for c in text] or [0])))}


def _slia_run(model, sampling, num_samples, seed, batch_size=8):
  """The push-down SLIA grammar: its language is infinite, so instead of KL, expectations.

  GCD draws w with a known probability q(w) (the masked, renormalized product), so its
  samples weighted by P(w) / q(w) (finished ones; a row cut at the budget weighs 0) are
  a self-normalized importance-sampling estimate of E_Q[f] for Q the model's
  distribution conditioned on the grammar (and the token budget), and their mean
  weight estimates P(L) without bias. ASAp's own empirical means should approach those
  of Q; GCD's plain means show its bias. Also: mean log P(w) of each method's samples
  against Q's (ASAp's samples are Q-distributed in the limit; GCD's favour whatever the
  mask renormalizes into), and the cost per sample.
  """
  tables = cd.Compiler(model.vocab).compile(cd.Grammar(SLIA_GRAMMAR))
  assert tables.is_pushdown
  out = {"grammar": SLIA_GRAMMAR, "prompt": SLIA_PROMPT, "samples": num_samples,
         "batch_size": batch_size, "max_new_tokens": SLIA_MAX_NEW_TOKENS,
         "model": "Gemma 3 270M (Q4_K_M GGUF, dequantized, float32)",
         "device": f"{platform.machine()} CPU, {os.cpu_count()} cores"}
  gcd, gcd_seconds = _gcd(model, tables, num_samples, batch_size, sampling, seed,
                          prompt=SLIA_PROMPT, max_new_tokens=SLIA_MAX_NEW_TOKENS)
  kwargs = dict(constraint=tables, batch_size=batch_size, sampling=sampling,
                max_new_tokens=SLIA_MAX_NEW_TOKENS, capacity=1 << 14)
  cd.generate_aligned(model, SLIA_PROMPT, num_samples=batch_size, seed=10**6, **kwargs)
  start = time.perf_counter()
  asap, store = cd.generate_aligned(model, SLIA_PROMPT, num_samples=num_samples, seed=seed,
                                    **kwargs)
  asap_seconds = time.perf_counter() - start
  runs = {"gcd": (gcd, gcd_seconds), "asap": (asap, asap_seconds)}
  for samples, _ in runs.values():
    assert not any(s.error for s in samples)
  start = time.perf_counter()
  scores = _score(model, SLIA_PROMPT, tables,
                  [s.token_ids for samples, _ in runs.values() for s in samples if s.finished],
                  sampling)
  out["scoring_seconds"] = time.perf_counter() - start
  # Importance weights of GCD's samples: P(w) / q(w) for finished ones, 0 otherwise.
  log_w = np.array([scores[s.token_ids][0] - scores[s.token_ids][1] if s.finished
                    else -np.inf for s in gcd])
  w = np.exp(log_w - np.max(log_w))
  weights = w / w.sum()
  features = {s.text: _slia_features(s.text) for samples, _ in runs.values() for s in samples}
  names = list(next(iter(features.values())))

  def snis(values):
    mean = float(np.sum(weights * values))
    stderr = float(np.sqrt(np.sum(weights**2 * (values - mean)**2)))  # delta method
    return {"mean": mean, "stderr": stderr}

  finished_gcd = np.array([s.finished for s in gcd])
  reference = {name: snis(np.array([features[s.text][name] if s.finished else 0.0
                                    for s in gcd])) for name in names}
  reference["log P(w)"] = snis(np.array([scores[s.token_ids][0] if s.finished else 0.0
                                         for s in gcd]))
  out["q_estimate"] = {
      "method": "self-normalized importance sampling from the GCD samples",
      "effective_sample_size": float(1 / np.sum(weights**2)),
      "log_mass": float(np.max(log_w) + np.log(np.mean(w))) if finished_gcd.any() else None,
      "expectations": reference}
  print(f"SLIA Q (SNIS over {num_samples} GCD samples, ESS "
        f"{out['q_estimate']['effective_sample_size']:.1f}): " + ", ".join(
            f"{k} {v['mean']:.3f}±{v['stderr']:.3f}" for k, v in reference.items()), flush=True)
  for name, (samples, seconds) in runs.items():
    finished = [s for s in samples if s.finished]
    texts = [s.text for s in finished]
    top = sorted(set(texts), key=lambda t: (-texts.count(t), t))[:6]
    stats = {f: float(np.mean([features[t][f] for t in texts])) for f in names}
    stats["log P(w)"] = float(np.mean([scores[s.token_ids][0] for s in finished]))
    steps = _decode_steps(samples, batch_size)
    out[name] = {"seconds": seconds, "seconds_per_sample": seconds / len(samples),
                 "decode_steps": steps, "seconds_per_step": seconds / steps,
                 "finished": len(finished), "distinct": len(set(texts)),
                 "expectations": stats,
                 "top": [[t, texts.count(t)] for t in top]}
    print(f"SLIA {name}: {seconds / len(samples) * 1e3:.0f} ms/sample, "
          f"{seconds / steps * 1e3:.0f} ms/step, {len(finished)}/{len(samples)} finished, "
          + ", ".join(f"{k} {v:.3f}" for k, v in stats.items())
          + f"; top {out[name]['top'][:3]}", flush=True)
  out["asap"].update(store_nodes=store.num_nodes, store_dropped=store.num_dropped,
                     log_mass_bound=store.log_mass_bound)
  out["ratio_per_sample"] = out["asap"]["seconds_per_sample"] / out["gcd"]["seconds_per_sample"]
  out["ratio_per_step"] = out["asap"]["seconds_per_step"] / out["gcd"]["seconds_per_step"]
  return out


_NAMES = {"gcd": "GCD", "asap": "ASAp"}


def _interleaved_cost(model, tables, batch_size, sampling, rounds):
  """Seconds per decode step of GCD and ASAp rounds run alternately (min and median).

  Sequential runs of each method see different load on a shared machine; alternating
  single rounds compares them under the same load. Both start from one prefilled
  state; ASAp's store grows across its rounds as in a real run.
  """
  from constrained_decoding.sampling import _aligned  # pylint: disable=g-import-not-at-top

  placed, init, eos_ids = _generate._prepare(model, [PROMPT] * batch_size, tables, None,  # pylint: disable=protected-access
                                             MAX_NEW_TOKENS, 0)
  key = jax.random.PRNGKey(0)
  store = _aligned.init_store(1 << 14)
  limit = jnp.int32(MAX_NEW_TOKENS)

  def gcd(r):
    state = jax.tree.map(jnp.copy, init).replace(rng=jax.random.fold_in(key, r))
    state = _generate._decode_until(model, placed, state, MAX_NEW_TOKENS, eos_ids, sampling)  # pylint: disable=protected-access
    return state

  def asap(r):
    nonlocal store
    store, state = _aligned._round(  # pylint: disable=protected-access
        model.params, placed, init, store, limit, eos_ids, jnp.float32(sampling.temperature),
        jnp.float32(sampling.top_p), jnp.int32(batch_size), jax.random.fold_in(key, r),
        config=model.config, sampling=sampling.static_part())
    return state

  times = {"gcd": [], "asap": []}
  for r in range(rounds + 1):
    for name, fn in (("gcd", gcd), ("asap", asap)):
      start = time.perf_counter()
      state = jax.block_until_ready(fn(r))
      if r:  # round 0 compiles
        times[name].append((time.perf_counter() - start) / int(state.step))
  out = {f"{name}_seconds_per_step_{stat.__name__}": stat(t)
         for name, t in times.items() for stat in (min, np.median)}
  out["ratio_min"] = out["asap_seconds_per_step_min"] / out["gcd_seconds_per_step_min"]
  out["ratio_median"] = (out["asap_seconds_per_step_median"]
                         / out["gcd_seconds_per_step_median"])
  return {k: float(v) for k, v in out.items()}


def _plot(result, path):
  """Cumulative KL (log scale) and the "ends with 1" expectation against m."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("The plot needs matplotlib: pip install "
                      "constrained_decoding[bench]") from e
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  for run in result["runs"]:
    m = np.arange(1, len(run["kl"]) + 1)
    label = f"{_NAMES[run['method']]}, batch {run['batch_size']}"
    left.plot(m, run["kl"], label=label)
    right.plot(m, run["ends_with_1"], label=label)
  left.axhline(result["exact"]["kl_gcd_limit"], color="gray", ls=":",
               label="KL(GCD || Q), exact")
  left.set(xlabel="samples m", ylabel="KL(empirical of first m || Q), nats", yscale="log",
           title="G_sk, Gemma 3 270M: cumulative KL to the exact Q")
  right.axhline(result["exact"]["ends_with_1"], color="black", ls="--", label="exact Q")
  right.set(xlabel="samples m", ylabel='P("ends with 1")', title="Expectation (Fig. 6)")
  for ax in (left, right):
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--samples", type=int, default=2000)
  parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
  parser.add_argument("--gcd-timing-samples", type=int, default=64)
  parser.add_argument("--capacity", type=int, default=1 << 14)
  parser.add_argument("--bv-samples", type=int, default=64,
                      help="samples of the push-down BV grammar per method (0: skip)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--grammar", choices=["gsk", "slia"], default="gsk",
                      help="gsk: Fig. 5a on G_sk (KL to the exact Q); slia: the push-down "
                      "SyGuS string grammar (expectations against an importance-sampling "
                      "estimate of Q), --samples per method at batch 8")
  parser.add_argument("--out", default=None,
                      help="results JSON (default benchmarks/results/aligned.json, or "
                      "aligned_slia.json with --grammar slia)")
  parser.add_argument("--cost-rounds", type=int, default=0,
                      help="only time alternating GCD / ASAp rounds, this many each")
  args = parser.parse_args(argv)
  if args.out is None:
    args.out = os.path.join(_REPO, "benchmarks", "results",
                            "aligned_slia.json" if args.grammar == "slia" else "aligned.json")
  sampling = cd.SamplingConfig(temperature=1.0)
  model = cd.models.Gemma3.from_gguf()
  if args.grammar == "slia":
    result = _slia_run(model, sampling, args.samples, args.seed,
                       batch_size=args.batch_sizes[-1])
    result["command"] = "python benchmarks/aligned_bench.py " + " ".join(argv or sys.argv[1:])
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
    print("wrote", args.out)
    return
  tables = cd.Compiler(model.vocab).compile(cd.Regex(PATTERN))
  if args.cost_rounds:
    cost = {str(b): _interleaved_cost(model, tables, b, sampling, args.cost_rounds)
            for b in args.batch_sizes}
    cost["command"] = "python benchmarks/aligned_bench.py " + " ".join(argv or sys.argv[1:])
    print(json.dumps(cost, indent=1))
    with open(os.path.splitext(args.out)[0] + "_cost.json", "w") as f:
      json.dump(cost, f, indent=1)
    return
  start = time.perf_counter()
  exact = _exact.exact_distribution(model, PROMPT, tables, sampling=sampling, batch_size=32)
  exact_seconds = time.perf_counter() - start
  ends = np.array([model.vocab.decode(w).endswith(b"1") for w in exact.sequences])
  text = [model.vocab.decode(w).decode() for w in exact.sequences]
  q_zeros = float(sum(q for t, q in zip(text, exact.q) if t == "00000"))
  gcd_zeros = float(sum(g for t, g in zip(text, exact.gcd) if t == "00000"))
  result = {
      "model": "Gemma 3 270M (Q4_K_M GGUF, dequantized, float32)",
      "device": f"{platform.machine()} CPU, {os.cpu_count()} cores",
      "pattern": PATTERN,
      "prompt": PROMPT,
      "samples": args.samples,
      "capacity": args.capacity,
      "command": "python benchmarks/aligned_bench.py " + " ".join(argv or sys.argv[1:]),
      "exact": {
          "num_sequences": len(exact.sequences),
          "seconds": exact_seconds,
          "log_mass": exact.log_mass,
          "q_00000": q_zeros,
          "gcd_00000": gcd_zeros,
          "kl_gcd_limit": float(np.sum(exact.gcd * (np.log(exact.gcd) - np.log(exact.q)))),
          "ends_with_1": float(exact.q[ends].sum()),
          "ends_with_1_gcd": float(exact.gcd[ends].sum()),
      },
      "runs": [],
  }
  print(json.dumps(result["exact"], indent=1), flush=True)

  def record(method, batch_size, samples, seconds, store=None):
    kl = _cumulative_kl(samples, exact)
    steps = _decode_steps(samples, batch_size)
    run = {"method": method, "batch_size": batch_size, "seconds": seconds,
           "seconds_per_sample": seconds / len(samples), "decode_steps": steps,
           "seconds_per_step": seconds / steps,
           "tokens_per_sample": float(np.mean([len(s.token_ids) for s in samples])),
           "kl": [round(x, 6) for x in kl],
           "ends_with_1": [round(x, 6) for x in _ends_with_1(samples)]}
    if store is not None:
      run.update(store_nodes=store.num_nodes, store_dropped=store.num_dropped,
                 store_bytes=store.nbytes, log_mass_bound=store.log_mass_bound)
    result["runs"].append(run)
    marks = [m for m in (25, 100, 250, 500, 1000, 2000) if m <= len(kl)]
    print(f"{method} b={batch_size}: {seconds / len(samples) * 1e3:.1f} ms/sample, "
          f"{seconds / steps * 1e3:.1f} ms/step, KL "
          + ", ".join(f"m={m}: {kl[m - 1]:.3f}" for m in marks)
          + f", ends with 1: {run['ends_with_1'][-1]:.3f}", flush=True)

  samples, seconds = _gcd(model, tables, args.samples, 8, sampling, args.seed)
  record("gcd", 8, samples, seconds)
  for b in args.batch_sizes:
    samples, seconds, store = _aligned(model, tables, args.samples, b, sampling, args.seed,
                                       args.capacity)
    record("asap", b, samples, seconds, store)
  timing = {}
  for b in args.batch_sizes:
    if b == 8:
      gcd_sample = result["runs"][0]["seconds_per_sample"]
      gcd_step = result["runs"][0]["seconds_per_step"]
    else:
      samples, seconds = _gcd(model, tables, args.gcd_timing_samples, b, sampling, args.seed)
      gcd_sample = seconds / len(samples)
      gcd_step = seconds / _decode_steps(samples, b)
    asap = next(r for r in result["runs"] if r["method"] == "asap" and r["batch_size"] == b)
    timing[str(b)] = {"gcd_seconds_per_sample": gcd_sample,
                      "asap_seconds_per_sample": asap["seconds_per_sample"],
                      "ratio_per_sample": asap["seconds_per_sample"] / gcd_sample,
                      "gcd_seconds_per_step": gcd_step,
                      "asap_seconds_per_step": asap["seconds_per_step"],
                      "ratio_per_step": asap["seconds_per_step"] / gcd_step}
  result["cost"] = timing
  print(json.dumps(timing, indent=1))
  if args.bv_samples:
    result["bv_grammar"] = _bv_run(model, sampling, args.bv_samples, args.seed)
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  _plot(result, os.path.splitext(args.out)[0] + ".png")
  print("wrote", args.out)


if __name__ == "__main__":
  main()
