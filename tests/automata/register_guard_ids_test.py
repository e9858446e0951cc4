"""`_registers._guard_ids` (edges grouped by the ops they cross, ids handed out in
numpy) against the plain per-edge loop it replaced, on random crossings and live sets,
both from walk hits (`_hit_groups`) and from a per-edge dict."""

import numpy as np
import pytest

from constrained_decoding.automata import _registers


def _loop_guard_ids(crossed, needs_live, live_needs):
  """The reference: every guarded edge in order, its ops looked up in a dict."""
  guard_ids = {}
  edge_guard = np.full(len(needs_live), -1, np.int32)
  for i in sorted(set(crossed) | set(np.flatnonzero(needs_live >= 0).tolist())):
    ops = crossed.get(i, ())
    if needs_live[i] >= 0:
      ops += live_needs[needs_live[i]]
    if ops:
      if len(ops) > _registers.MAX_GUARD_OPS:
        raise _registers.RegisterError("too many")
      edge_guard[i] = guard_ids.setdefault(ops, len(guard_ids))
  return edge_guard, guard_ids


def _random_case(rng):
  """(hits as `_crossed_hits` returns them, needs_live, live_needs)."""
  num_edges = int(rng.integers(0, 60))
  num_sets = int(rng.integers(1, 6))
  # Few distinct ops, so that live sets and op lists often coincide.
  op = lambda: (int(rng.integers(0, 2)), int(rng.integers(0, 2)), 1)
  live_needs = [tuple(op() for _ in range(int(rng.integers(0, 3)))) for _ in range(num_sets)]
  ops_of = [tuple(op() for _ in range(int(rng.integers(1, 3)))) for _ in range(3)]
  needs_live = np.where(rng.random(num_edges) < 0.6,
                        rng.integers(0, num_sets, num_edges), -1).astype(np.int64)
  edge, position, op_index = [], [], []
  for e in np.flatnonzero(rng.random(num_edges) < 0.4).tolist():
    for p in sorted(rng.choice(8, int(rng.integers(1, 4)), replace=False).tolist()):
      edge.append(e)
      position.append(p)
      op_index.append(int(rng.integers(0, len(ops_of))))
  hits = (np.array(edge, np.int64), np.array(position, np.int64),
          np.array(op_index, np.int64), ops_of)
  return hits, needs_live, live_needs


@pytest.mark.parametrize("seed", range(200))
def test_guard_ids_match_the_per_edge_loop(seed):
  hits, needs_live, live_needs = _random_case(np.random.default_rng(seed))
  crossed = {e: tuple(op for _, ops in h for op in ops)
             for e, h in _registers._hits_by_edge(hits).items()}
  want_guard, want_ids = _loop_guard_ids(crossed, needs_live, live_needs)
  # Grouped by walk hits (attach without distinct strings).
  got_guard, got_ids = _registers._guard_ids(*_registers._hit_groups(hits, needs_live, live_needs),
                                             needs_live, live_needs)
  np.testing.assert_array_equal(got_guard, want_guard)
  assert list(got_ids.items()) == list(want_ids.items())
  # One group per edge (the per-edge dict of distinct strings and push-down automata).
  edges = np.array(sorted(crossed), np.int64)
  group_ops = [crossed[e] + (live_needs[needs_live[e]] if needs_live[e] >= 0 else ())
               for e in edges.tolist()]
  got_guard, got_ids = _registers._guard_ids(edges, np.arange(len(edges)), group_ops,
                                             needs_live, live_needs)
  np.testing.assert_array_equal(got_guard, want_guard)
  assert list(got_ids.items()) == list(want_ids.items())


def test_guard_ids_refuse_too_many_operations():
  ops = tuple((0, 0, 1) for _ in range(_registers.MAX_GUARD_OPS + 1))
  with pytest.raises(_registers.RegisterError, match="register operations"):
    _registers._guard_ids(np.zeros(0, np.int64), np.zeros(0, np.int64), [],
                          np.array([-1, 0]), [ops])
