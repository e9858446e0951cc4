"""Real-world-style JSON Schemas through `cd.JsonSchema`: coverage, compile time, sizes.

`benchmarks/schemas/*.json` holds 44 schemas written for this benchmark in the styles
met in practice (pydantic v2 models, OpenAPI 3 components, function-calling tool
parameters, Kubernetes objects, SchemaStore-style configuration files, draft-04
schemas, ...), each as `{"style", "schema", "valid": [...], "invalid": [...]}`.

For each schema, with the Gemma 3 vocabulary (`--vocab bytes` for the byte one):
  1. the instances are checked with `jsonschema` (the corpus itself must be right:
     `corpus_errors`, expected empty);
  2. the schema is compiled once, after one warm-up compile of another schema, with
     `cd.Compiler(vocab).compile(cd.JsonSchema(schema))` (default options, or
     `--whitespace`): compiled, or refused with the typed error, or crashed;
  3. each instance is judged as in `json_schema_suite.py` (every serialization of the
     value, canonical and random tokenizations, the numpy reference walk): valid ones
     must be accepted (or rejected only by a documented narrowing, `narrowed`),
     invalid ones rejected.
Reports compile time p50/p90/p99/max, wall and CPU (of compiled schemas, and of all
including the time to a refusal), table bytes (`cd.tables_nbytes`) and every
wrong answer, and which objects keep schema order (the front end's log: `property_order`
"any" falls back past `MAX_ANY_ORDER_SIZE`); writes
`benchmarks/results/schema_corpus.json`.

  python benchmarks/schema_corpus.py                # Gemma 3 vocabulary
  python benchmarks/schema_corpus.py --vocab bytes  # faster
  python benchmarks/schema_corpus.py --passes 3      # + the steady state

`--passes N` (N > 1) compiles the corpus N - 1 more times in the same process with the
same compiler, made with `memoize=False` so that every pass compiles anew: pass 0 is the
judged pass above (first use of each schema's per-vocabulary work), later passes find
everything per vocabulary already in memory. The summary gives every pass's CPU
percentiles (`compile_cpu_s_by_pass`) and the last one's as `steady_compile_cpu_s`.
"""

import argparse
import collections
import gc
import glob
import json
import logging
import os
import statistics
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # Run as a script from a checkout.

import constrained_decoding as cd  # noqa: E402
from benchmarks import json_schema_suite as suite  # noqa: E402

CORPUS_DIR = os.path.join(_REPO, "benchmarks", "schemas")
# Compiled before timing, so that no schema pays for the compiler's first-use work.
_WARM_UP = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}


def load_corpus(corpus_dir: str = CORPUS_DIR) -> dict[str, dict]:
  """name -> {"style", "schema", "valid", "invalid"}, sorted by name."""
  out = {}
  for path in sorted(glob.glob(os.path.join(corpus_dir, "*.json"))):
    with open(path, encoding="utf-8") as f:
      out[os.path.basename(path)[:-len(".json")]] = json.load(f)
  return out


def draft_of(schema) -> str:
  """`draft4`, `draft7` or `draft2020-12`, from the schema's `$schema` (default 2020-12)."""
  uri = schema.get("$schema", "") if isinstance(schema, dict) else ""
  return "draft4" if "draft-04" in uri else "draft7" if "draft-07" in uri else "draft2020-12"


def corpus_errors(entry: dict) -> list[str]:
  """What `jsonschema` (formats checked) disagrees with in the entry's labels."""
  validator = suite._validator(draft_of(entry["schema"]))  # pylint: disable=protected-access
  check = validator(entry["schema"], format_checker=validator.FORMAT_CHECKER)
  return ([f"valid instance rejected: {json.dumps(x)[:80]}" for x in entry["valid"]
           if not check.is_valid(x)] +
          [f"invalid instance accepted: {json.dumps(x)[:80]}" for x in entry["invalid"]
           if check.is_valid(x)])


class _SchemaOrderLog(logging.Handler):
  """Collects the front end's "the object at <pointer> keeps schema order" notes."""

  def __init__(self):
    super().__init__(logging.INFO)
    self.pointers: list[str] = []

  def emit(self, record):
    message = record.getMessage()
    if "keeps schema order" in message:
      self.pointers.append(message.split("the object at ")[-1].split(" keeps")[0])


def run_schema(compiler, speller, name: str, entry: dict, *, whitespace: str,
               time_limit: float, shared_definitions: str = "inline",
               free_form_depth: int | None = 2) -> dict:
  """Compiles one schema and judges its instances; returns its row."""
  row = {"name": name, "style": entry["style"], "corpus_errors": corpus_errors(entry),
         "valid": len(entry["valid"]), "invalid": len(entry["invalid"]), "verdicts": {},
         "wrong": [], "narrowings": []}
  front_end = logging.getLogger("constrained_decoding.constraints._json_schema")
  notes, level = _SchemaOrderLog(), front_end.level
  front_end.addHandler(notes)
  front_end.setLevel(logging.INFO)
  cpu = time.process_time()
  try:
    result = suite.compile_case(compiler, entry["schema"], whitespace=whitespace,
                                time_limit=time_limit, free_form_depth=free_form_depth,
                                shared_definitions=shared_definitions)
  finally:
    cpu = time.process_time() - cpu
    front_end.removeHandler(notes)
    front_end.setLevel(level)
  # Objects past MAX_ANY_ORDER_SIZE keep schema order (property_order="any" narrowed).
  row["schema_order_objects"] = notes.pointers
  row.update(status=result["status"], error=result["error"], compile_s=result["seconds"],
             compile_cpu_s=cpu)
  if result["status"] != "compiled":
    return row
  tables = result["tables"]
  row["table_bytes"] = cd.tables_nbytes(tables)["total"]
  row["ignored_keywords"] = len(cd.JsonSchema(entry["schema"]).ignored_keywords())
  verdicts = collections.Counter()
  for valid, instances in ((True, entry["valid"]), (False, entry["invalid"])):
    for data in instances:
      judged = suite.judge_instance(tables, data, valid, speller, whitespace,
                                    entry["schema"])
      if judged["verdict"] == "rejected_valid":
        reason = suite.explain_rejection(compiler, entry["schema"], data,
                                         draft=draft_of(entry["schema"]),
                                         whitespace=whitespace, speller=speller,
                                         time_limit=time_limit)
        if reason is not None:
          judged = {**judged, "verdict": "narrowed", "reason": reason}
      verdicts[judged["verdict"]] += 1
      detail = {"valid": valid, "data": data, "text": judged["text"]}
      if judged["verdict"] in suite.WRONG_VERDICTS:
        row["wrong"].append({**detail, "verdict": judged["verdict"]})
      elif judged["verdict"] == "narrowed":
        row["narrowings"].append({**detail, "reason": judged["reason"]})
  row["verdicts"] = dict(verdicts)
  return row


def steady_pass(compiler, corpus: dict, names: list[str], *, whitespace: str,
                shared_definitions: str, free_form_depth: int | None = 2
                ) -> dict[str, float]:
  """name -> CPU seconds of compiling it once more with `compiler` (no judging; the
  spec built inside the timer, as in pass 0's `compile_case`)."""
  out = {}
  for name in names:
    cpu = time.process_time()
    compiler.compile(cd.JsonSchema(corpus[name]["schema"], whitespace=whitespace,
                                   free_form_depth=free_form_depth, implied_types=True,
                                   shared_definitions=shared_definitions))
    out[name] = time.process_time() - cpu
  return out


def percentiles(values: list[float]) -> dict:
  """p50, p90, p99 and max (nearest rank)."""
  if not values:
    return {}
  ordered = sorted(values)
  rank = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
  return {"p50": statistics.median(ordered), "p90": rank(0.9), "p99": rank(0.99),
          "max": ordered[-1]}


def markdown(rows: list[dict]) -> str:
  head = ("| schema | style | status | compile ms | table MiB | valid: ok / narrowed / n |"
          " invalid rejected / n | wrong |\n|---|---|---|---|---|---|---|---|")
  lines = [head]
  for r in rows:
    compile_ms = f"{1e3 * r['compile_s']:.0f}"
    if r["status"] != "compiled":
      lines.append(f"| {r['name']} | {r['style']} | {r['status']}: {r['error'][:70]} |"
                   f" {compile_ms} | — | — | — | — |")
      continue
    wrong_valid = sum(w["valid"] for w in r["wrong"])
    narrowed = len(r["narrowings"])
    lines.append(
        f"| {r['name']} | {r['style']} | compiled | {compile_ms} |"
        f" {r['table_bytes'] / 2**20:.1f} | {r['valid'] - wrong_valid - narrowed} / {narrowed} /"
        f" {r['valid']} | {r['invalid'] - (len(r['wrong']) - wrong_valid)} / {r['invalid']} |"
        f" {len(r['wrong'])} |")
  return "\n".join(lines)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--corpus-dir", default=CORPUS_DIR)
  parser.add_argument("--vocab", choices=("gemma", "bytes"), default="gemma")
  parser.add_argument("--whitespace", choices=("compact", "single", "flexible"),
                      default="compact")
  parser.add_argument("--time-limit", type=float, default=60.0,
                      help="seconds per compile (CompileOptions.max_seconds; default 60)")
  parser.add_argument("--random-tokenizations", type=int, default=2)
  parser.add_argument("--shared-definitions", choices=("inline", "call"),
                      default="inline", help="JsonSchema(shared_definitions=...)")
  parser.add_argument("--free-form-depth", type=suite.free_form_depth_arg, default=2,
                      help="JsonSchema(free_form_depth=...): an int, or 'none' for calls to"
                      " one JSON rule on the device stack (push-down tables; default 2)")
  parser.add_argument("--cache-dir", default=cd.CompileOptions().cache_dir)
  parser.add_argument("--passes", type=int, default=1,
                      help="compile passes over the corpus (default 1); the ones after the"
                      " first are timed only, with memoize off: the steady state")
  parser.add_argument("--out", default=None,
                      help="default: benchmarks/results/schema_corpus[_bytes].json")
  args = parser.parse_args(argv)
  if args.out is None:
    suffix = "" if args.vocab == "gemma" else f"_{args.vocab}"
    if args.free_form_depth != 2:
      suffix += f"_free_form_{args.free_form_depth}".lower()
    args.out = os.path.join(_REPO, "benchmarks", "results", f"schema_corpus{suffix}.json")
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  corpus = load_corpus(args.corpus_dir)
  vocab, speller = suite.make_speller(args.vocab, args.random_tokenizations)
  # The speller's token index is ~350k objects of the benchmark's own; without this
  # every full collection during a compile walks them (~0.27 s CPU a corpus pass).
  gc.freeze()
  if args.passes < 1:
    raise SystemExit(f"--passes {args.passes}: expected at least 1")
  # With several passes every pass compiles anew (the memo would answer passes >= 1).
  compiler = cd.Compiler(vocab, cd.CompileOptions(max_seconds=args.time_limit,
                                                  cache_dir=args.cache_dir,
                                                  memoize=args.passes == 1))
  load_start, start = os.getloadavg(), time.time()
  compiler.compile(cd.JsonSchema(_WARM_UP, whitespace=args.whitespace))
  rows = []
  for name, entry in corpus.items():
    row = run_schema(compiler, speller, name, entry, whitespace=args.whitespace,
                     time_limit=args.time_limit, free_form_depth=args.free_form_depth,
                     shared_definitions=args.shared_definitions)
    rows.append(row)
    print(f"{name}: {row['status']} in {row['compile_s']:.2f} s {row['verdicts']}"
          f"{' ' + row['error'] if row['error'] else ''}", flush=True)
  compiled = [r for r in rows if r["status"] == "compiled"]
  by_pass = [percentiles([r["compile_cpu_s"] for r in compiled])]
  for index in range(1, args.passes):
    cpu_s = steady_pass(compiler, corpus, [r["name"] for r in compiled],
                        whitespace=args.whitespace,
                        shared_definitions=args.shared_definitions,
                        free_form_depth=args.free_form_depth)
    for r in compiled:
      r.setdefault("compile_cpu_s_by_pass", [r["compile_cpu_s"]]).append(cpu_s[r["name"]])
    by_pass.append(percentiles(list(cpu_s.values())))
    print(f"pass {index}: CPU p50 {1e3 * by_pass[-1]['p50']:.1f} ms, p90"
          f" {1e3 * by_pass[-1]['p90']:.1f}, p99 {1e3 * by_pass[-1]['p99']:.1f}", flush=True)
  summary = {
      "schemas": len(rows),
      "status": dict(collections.Counter(r["status"] for r in rows)),
      "refusals_by_error": dict(collections.Counter(
          r["error"].split(":")[0] for r in rows if r["status"] == "refused")),
      "compile_s": percentiles([r["compile_s"] for r in compiled]),
      # CPU time of this process (`time.process_time`): less sensitive to other load.
      "compile_cpu_s": percentiles([r["compile_cpu_s"] for r in compiled]),
      # Refusals included: a budget refusal may take as long as a compile.
      "compile_or_refuse_s": percentiles([r["compile_s"] for r in rows]),
      # CPU per pass (pass 0 above; later ones compile only, memoize off), and the last.
      "passes": args.passes,
      "compile_cpu_s_by_pass": by_pass,
      "steady_compile_cpu_s": by_pass[-1] if args.passes > 1 else None,
      "table_bytes": percentiles([r["table_bytes"] for r in compiled]),
      "instances": sum(r["valid"] + r["invalid"] for r in compiled),
      "verdicts": dict(sum((collections.Counter(r["verdicts"]) for r in rows),
                           collections.Counter())),
      "corpus_errors": sum(len(r["corpus_errors"]) for r in rows),
      "schemas_with_schema_order_objects": sum(bool(r["schema_order_objects"])
                                               for r in rows),
      "narrowed_by_reason": dict(collections.Counter(
          n["reason"] for r in rows for n in r["narrowings"])),
  }
  print()
  print(markdown(rows))
  print()
  print(json.dumps(summary, indent=1))
  for r in rows:
    for w in r["wrong"]:
      print(f"WRONG {w['verdict']}: {r['name']}: {w['text'][:100]}")
    for e in r["corpus_errors"]:
      print(f"CORPUS {r['name']}: {e}")
  meta = {"vocab": args.vocab, "shared_definitions": args.shared_definitions,
          "free_form_depth": args.free_form_depth, "vocab_size": vocab.vocab_size, "whitespace": args.whitespace,
          "time_limit_s": args.time_limit, "random_tokenizations": speller.num_random,
          "wall_s": time.time() - start, "load_average_start": load_start,
          "load_average_end": os.getloadavg(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump({"meta": meta, "summary": summary, "schemas": rows}, f, indent=1,
              ensure_ascii=False)
  print(f"\nwrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
