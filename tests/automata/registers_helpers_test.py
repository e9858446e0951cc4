"""The array helpers of `automata/_registers.py` against plain-Python oracles.

`_distinct_pairs` (the state graph of `live_sets`) against a set of pairs, sorted;
`_tokens_with` (which tokens may cross a register operation) against a per-token scan
of its bytes.
"""

import random

import numpy as np
import pytest

from constrained_decoding.automata import _registers


@pytest.mark.parametrize("seed", range(5))
def test_distinct_pairs_equal_sorted_set(seed):
  rng = np.random.default_rng(seed)
  q = int(rng.integers(1, 50))
  n = int(rng.integers(0, 400))
  src, dst = rng.integers(0, q, n), rng.integers(0, q, n)
  got_src, got_dst = _registers._distinct_pairs(src, dst, q)  # pylint: disable=protected-access
  assert list(zip(got_src.tolist(), got_dst.tolist())) == sorted(set(zip(src.tolist(),
                                                                         dst.tolist())))


@pytest.mark.parametrize("seed", range(5))
def test_tokens_with_equals_byte_scan(seed):
  rng = random.Random(seed)
  token_bytes = [None, b""] + [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
                               for _ in range(300)]
  wanted = np.zeros(256, bool)
  wanted[rng.sample(range(256), rng.choice([0, 1, 3, 40]))] = True
  got = _registers._tokens_with(token_bytes, wanted)  # pylint: disable=protected-access
  expected = [any(wanted[b] for b in (t or b"")) for t in token_bytes]
  assert got.tolist() == expected
