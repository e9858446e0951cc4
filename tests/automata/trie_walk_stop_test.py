"""`_trie_walk._walk_frontier(stop_at=...)`: pairs reaching a stop state are never edges.

Oracle: the expected edges and stops written out by hand for a walk whose second level
(256 children) is far wider than the plain-Python steps take, so that the level the
Python steps hand back is the one that reaches the stop state.
"""

import numpy as np
import pda_plain_test  # pylint: disable=import-error  (same directory)

import constrained_decoding as cd
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _trie_walk


def test_a_frontier_grown_in_python_steps_is_checked_for_stops():
  tokens = ([b"a"] + [b"a" + bytes([b]) for b in range(256)]
            + [b"a" + bytes([b]) + b"z" for b in range(256)])
  assert 256 > 4 * _trie_walk._PY_FRONTIER  # pylint: disable=protected-access
  transitions = np.full((4, 256), -1, np.int32)
  transitions[0, ord("a")] = 1
  transitions[1, :] = 3  # 3 is the stop state (stop_at=3); 2 only after one.
  transitions[3, ord("z")] = 2
  vocab = cd.Vocabulary.from_token_bytes(tokens + [None], eos_ids=[len(tokens)])
  trie = _detokenizer.build_trie(vocab)
  stopped = []
  parts = _trie_walk._walk_frontier(  # pylint: disable=protected-access
      transitions, trie, np.array([0], np.int32), np.array([0], np.int32),
      np.array([0], np.int32), max_edges=10**6, deadline=float("inf"), what="test",
      stop_at=3, stopped=stopped)
  edges = {(int(s), int(t), int(d)) for p in parts for s, t, d in zip(*p)}
  assert edges == {(0, 0, 1)}  # Only the token "a"; no "a?" or "a?z" past the stop.
  text = pda_plain_test._node_text(trie)  # pylint: disable=protected-access
  stops = {(int(o), text[int(n)], int(q)) for group in stopped
           for n, q, o in zip(*(np.atleast_1d(np.asarray(x)) for x in group))}
  assert stops == {(0, b"a" + bytes([b]), 3) for b in range(256)}
