"""The token-level compile's fast paths against the plain computations they replace."""

import random

import numpy as np
import pytest

from constrained_decoding.automata import _compose
from constrained_decoding.automata import _unique_strings


def _live_oracle(num_states, src, dst, start, accepting) -> np.ndarray:
  """Reachable from `start` and co-reachable from `accepting`, by Python set closure."""
  forward, backward = {}, {}
  for a, b in zip(src.tolist(), dst.tolist()):
    forward.setdefault(a, set()).add(b)
    backward.setdefault(b, set()).add(a)

  def closure(seeds, graph):
    seen, stack = set(seeds), list(seeds)
    while stack:
      for r in graph.get(stack.pop(), ()):
        if r not in seen:
          seen.add(r)
          stack.append(r)
    return seen

  both = closure([start], forward) & closure(np.flatnonzero(accepting).tolist(), backward)
  return np.isin(np.arange(num_states), list(both))


@pytest.mark.parametrize("seed", range(40))
def test_live_states_equal_set_closure(seed):
  """Random graphs with parallel edges, chains deeper than one BFS level, frontiers long
  enough to be deduplicated (past 256), unreachable and dead states."""
  rng = np.random.default_rng(seed)
  num_states = int(rng.integers(1, 2000))
  chain = np.arange(num_states - 1)
  shape = seed % 4
  if shape == 0:  # Sparse random graph.
    src = rng.integers(0, num_states, 3 * num_states)
    dst = rng.integers(0, num_states, 3 * num_states)
  elif shape == 1:  # A long chain with repeated edges and a few shortcuts back.
    src = np.concatenate([chain, chain, rng.integers(0, num_states, 5)])
    dst = np.concatenate([chain + 1, chain + 1, rng.integers(0, num_states, 5)])
  elif shape == 2:  # A star: one level of ~num_states states.
    src = np.concatenate([np.zeros(num_states, np.int64), rng.integers(0, num_states, 50)])
    dst = np.concatenate([np.arange(num_states), rng.integers(0, num_states, 50)])
  else:  # No edges at all, or very few.
    src = rng.integers(0, num_states, seed % 3)
    dst = rng.integers(0, num_states, seed % 3)
  accepting = rng.random(num_states) < [0.01, 0.001, 0.05, 0.5][shape]
  start = int(rng.integers(0, num_states))
  for s, d in ((src, dst), (src.astype(np.int32), dst.astype(np.int32))):
    got = _compose._live_states(num_states, s, d, start, accepting)  # pylint: disable=protected-access
    assert got.dtype == bool and got.shape == (num_states,)
    np.testing.assert_array_equal(got, _live_oracle(num_states, s, d, start, accepting))


def test_token_hash_equals_hash_of_every_token():
  """`token_hash` by byte positions over length-sorted tokens = `hash_of` token by token
  (lengths 0..300 in random order, None, high bytes)."""
  rng = random.Random(0)
  tokens = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 2, 3, 7, 40, 300])))
            for _ in range(300)] + [None, b"", b"\xff" * 5]
  rng.shuffle(tokens)
  table = _unique_strings._hash_tokens(tokens)  # pylint: disable=protected-access
  assert table.dtype == np.int32 and table.shape == (len(tokens), 4)
  for row, data in zip(table.tolist(), tokens):
    assert tuple(row) == _unique_strings.hash_of(data or b"")
  assert _unique_strings._hash_tokens([]).shape == (0, 4)  # pylint: disable=protected-access
