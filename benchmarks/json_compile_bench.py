"""Compile time and table size of JSON constraints with the Gemma 3 vocabulary (ours only).

The peers' side of the extensions issue is not written yet. "first" is the first
compile in the process with an empty wide-state cache directory (it builds the cached
terminal bitmaps); "warm" is the median of --repeats later compiles (memoization off).

  python benchmarks/json_compile_bench.py
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import constrained_decoding as cd

GPQA = {"type": "object", "properties": {
    "Final Answer": {"enum": ["A", "B", "C", "D"]}, "Solution": {"type": "string"}},
    "required": ["Final Answer", "Solution"]}
RPG = {"type": "object", "properties": {
    "name": {"type": "string"},
    "class": {"type": "string", "enum": ["Warrior", "Rogue", "Sorceror"]},
    "life": {"type": "integer"}, "mana": {"type": "integer"},
    "equipment": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "durability": {"type": "integer"},
        "quality": {"type": "string", "enum": ["Normal", "Magic", "Unique"]}}}}}}

SPECS = {
    "quoted text regex": cd.Regex(r'"([^"\\]|\\.)*"'),
    "GPQA answer schema, strict properties": cd.JsonSchema(GPQA, strict_properties=True),
    "RPG schema (App. C.4.5), strict properties": cd.JsonSchema(RPG, strict_properties=True),
    "GPQA answer schema, spec default (extra properties allowed)": cd.JsonSchema(GPQA),
    "schema-free JSON, depth 2": cd.Json(2),
}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                    "json_compile.json"))
  args = parser.parse_args()
  vocab = cd.Vocabulary.from_gguf(cd.models.default_gguf_path())
  rows = []
  with tempfile.TemporaryDirectory() as cache:
    compiler = cd.Compiler(vocab, cd.CompileOptions(memoize=False, cache_dir=cache))
    for name, spec in SPECS.items():
      start = time.perf_counter()
      compiler.compile(spec)
      first = time.perf_counter() - start
      warm, info = [], None
      for _ in range(args.repeats):
        _, info = compiler.compile_with_info(spec)
        warm.append(info.seconds["total"])
      rows.append(dict(constraint=name, first_ms=1e3 * first,
                       warm_ms=1e3 * statistics.median(warm), states=info.token_states,
                       explicit_edges=info.token_edges, terminals=info.num_terminals,
                       table_mib=info.nbytes["total"] / 2**20))
  print("| constraint | first ms | warm ms (median) | states | explicit edges | "
        "terminals | tables MiB |\n|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['constraint']} | {r['first_ms']:.0f} | {r['warm_ms']:.2f} | {r['states']} | "
          f"{r['explicit_edges']} | {r['terminals']} | {r['table_mib']:.1f} |")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
