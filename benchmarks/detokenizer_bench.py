"""Per-vocabulary set-up times: Vocabulary.from_gguf, the trie (T_V) and its FST export.

Prints a table and writes benchmarks/results/detokenizer.json. Built = no disk cache;
reloaded = from the cache that the first build wrote (median of --repeats).

  python benchmarks/detokenizer_bench.py
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import constrained_decoding as cd
from constrained_decoding.automata import _detokenizer


def _median_seconds(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                    "detokenizer.json"))
  args = parser.parse_args()
  path = cd.models.default_gguf_path()
  rows = {"vocabulary_from_gguf_s": _median_seconds(lambda: cd.Vocabulary.from_gguf(path),
                                                    args.repeats)}
  vocab = cd.Vocabulary.from_gguf(path)
  rows["trie_build_s"] = _median_seconds(lambda: _detokenizer.build_trie(vocab), args.repeats)
  trie = _detokenizer.build_trie(vocab)
  rows["fst_export_s"] = _median_seconds(lambda: _detokenizer.detokenizing_fst(trie),
                                         args.repeats)
  with tempfile.TemporaryDirectory() as cache:
    _detokenizer.load_or_build_detokenizing_fst(vocab, cache)
    rows["trie_reload_s"] = _median_seconds(
        lambda: _detokenizer.load_or_build_trie(vocab, cache), args.repeats)
    rows["fst_reload_s"] = _median_seconds(
        lambda: _detokenizer.load_or_build_detokenizing_fst(vocab, cache), args.repeats)
  rows.update(num_tokens=vocab.num_tokens, trie_nodes=trie.num_nodes,
              fst_states=int(_detokenizer.detokenizing_fst(trie).num_states()))
  print("| step | seconds |\n|---|---|")
  for key, value in rows.items():
    if key.endswith("_s"):
      print(f"| {key[:-2].replace('_', ' ')} | {value:.3f} |")
  print(f"\n{rows['num_tokens']} tokens, {rows['trie_nodes']} trie nodes, "
        f"{rows['fst_states']} FST states")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
