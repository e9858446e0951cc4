"""Terminal labels and sugar (paper Sec. 2.5): compile time and table size, Gemma 3.

Ours only (the peers have no such labels). For each regex: the first compile in this
process (per-vocabulary bitmaps come from the disk cache when an earlier run built
them; pass --cache-dir to a fresh directory to measure a cold start), then the median
and min of N warm compiles with memoization off, and the sizes `CompileInfo` reports.

Run from the repository root:
  python benchmarks/labels_bench.py --repeats 20
"""

import argparse
import os
import sys
import time

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # Run as a script from a checkout.

import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

PATTERNS = (
    r"(?P<QUOTED_TEXT>)",
    r"(?P<UNQUOTED_TEXT>)",
    r"key: (?P<UNQUOTED_TEXT>)\n",
    r"(?P<TEXT_UNTIL>\n\n)",
    r"Answer: (?P<TEXT_UNTIL>END)",
    r"(?P<PARAGRAPH_TOKEN>){2}",
    r"Summary:\n(?:- (?P<PARAGRAPH_TOKEN>)+\n){3,5}",
    r"(?P<SUBSTRING_OF>The quick brown fox jumps over the lazy dog)",
    r"\[(?P<DELIMITED_LIST>(?P<QUOTED_TEXT>)|, )?\]",
    r"(?P<DELIMITED_SUBSEQUENCE_OF>red|green|blue|, )",
)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--cache-dir", default=cd.CompileOptions().cache_dir)
  args = parser.parse_args()
  vocab = cd.Vocabulary.from_gguf(cd.models.default_gguf_path())
  compiler = cd.Compiler(vocab, cd.CompileOptions(memoize=False, cache_dir=args.cache_dir))
  print("| regex | first ms | warm ms med (min) | states | explicit edges | terminals |"
        " tables MiB |")
  print("|---|---|---|---|---|---|---|")
  for pattern in PATTERNS:
    spec = cd.Regex(pattern)
    start = time.perf_counter()
    compiler.compile_with_info(spec)
    first = time.perf_counter() - start
    times = []
    for _ in range(args.repeats):
      start = time.perf_counter()
      _, info = compiler.compile_with_info(spec)
      times.append(time.perf_counter() - start)
    shown = pattern.replace("|", "\\|").replace("\n", "\\n")
    print(f"| `{shown}` | {1e3 * first:.1f} | {1e3 * np.median(times):.2f} "
          f"({1e3 * min(times):.2f}) | {info.token_states} | {info.token_edges} | "
          f"{info.num_terminals} | {info.nbytes['total'] / 2**20:.2f} |")


if __name__ == "__main__":
  main()
