"""The plain part of the push-down composition (`_pda_plain.py`) against enumeration.

Oracle: each (origin, token) followed byte by byte over the DFA in plain Python: the
path is a plain edge when it reaches the token's last byte without entering a special
state, and stops at the first prefix that enters one (that prefix and state are
reported once per origin). Also the canonical order of push rows.
"""

import itertools

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _pda
from constrained_decoding.automata import _pda_plain
from constrained_decoding.automata._byte_dfa import ByteDfa
from constrained_decoding.automata._trie_walk import _PY_FRONTIER
from constrained_decoding.automata._trie_walk import _root_frontier


def _node_text(trie) -> dict:
  """Trie node -> the bytes from the root to it."""
  text, todo = {0: b""}, [0]
  while todo:
    node = todo.pop()
    for slot in range(trie.child_start[node], trie.child_start[node + 1]):
      child = int(trie.child_node[slot])
      text[child] = text[node] + bytes([int(trie.child_byte[slot])])
      todo.append(child)
  return text


def _enumerate(transitions, special, tokens, origins, first_bytes):
  """({(origin, token, state)} plain edges, {(origin, prefix, state)} stops)."""
  edges, stops = set(), set()
  for k, origin in enumerate(origins):
    for token, text in enumerate(tokens):
      if not text or not first_bytes[k, text[0]]:
        continue
      state = origin
      for end in range(1, len(text) + 1):
        state = int(transitions[state, text[end - 1]])
        if state < 0:
          break
        if special[state]:
          stops.add((origin, text[:end], state))
          break
      else:
        edges.add((origin, token, state))
  return edges, stops


def _walked(edges, stopped, trie):
  text = _node_text(trie)
  return ({(int(o), int(t), int(s)) for o, t, s in zip(*edges)},
          {(int(o), text[int(n)], int(s)) for n, s, o in zip(*stopped)})


def _vocab(tokens):
  return cd.Vocabulary.from_token_bytes(list(tokens) + [None], eos_ids=[len(tokens)])


@pytest.mark.parametrize("seed", range(6))
def test_stopping_walk_equals_the_enumeration(seed):
  rng = np.random.default_rng(seed)
  num_states, alphabet = int(rng.integers(6, 12)), b"abcd"
  transitions = np.full((num_states, 256), -1, np.int32)
  for b in alphabet:
    transitions[:, b] = np.where(rng.random(num_states) < 0.15, -1,
                                 rng.integers(0, num_states, num_states))
  stop_at = num_states - int(rng.integers(1, 3))
  tokens = [bytes(p) for n in (1, 2, 3, 4) for p in itertools.product(alphabet, repeat=n)]
  trie = _detokenizer.build_trie(_vocab(tokens))
  origins = np.arange(stop_at, dtype=np.int32)
  first_bytes = rng.random((len(origins), 256)) < 0.7
  frontier = _root_frontier(ByteDfa(transitions, np.zeros(num_states, bool), 0), trie,
                            origins, first_bytes)
  edges, stopped = _pda_plain._stopping_walk(transitions, trie, *frontier, stop_at=stop_at,
                                             max_edges=10**6, deadline=float("inf"),
                                             what="test")
  special = np.arange(num_states) >= stop_at
  expected = _enumerate(transitions, special, tokens, origins.tolist(), first_bytes)
  assert len(expected[0]) > 10
  assert _walked(edges, stopped, trie) == expected
  assert len(stopped[0]) == len(expected[1])  # Each stop once.


def test_a_frontier_grown_in_python_steps_is_checked_for_stops():
  # One narrow level ("a"), then a level far wider than the Python steps take, all in
  # a special state: every such prefix stops, none is an edge.
  tokens = [b"a"] + [b"a" + bytes([b]) for b in range(256)] + [b"a" + bytes([b]) + b"z"
                                                               for b in range(256)]
  assert 256 > 4 * _PY_FRONTIER
  transitions = np.full((4, 256), -1, np.int32)
  transitions[0, ord("a")] = 1
  transitions[1, :] = 3  # 3 is special (stop_at 3); 2 is never reached.
  transitions[3, ord("z")] = 2
  trie = _detokenizer.build_trie(_vocab(tokens))
  root_slot = int(trie.child_start[0]) + list(trie.child_byte[:trie.child_start[1]]).index(97)
  frontier = (np.array([trie.child_node[root_slot]], np.int32), np.array([1], np.int32),
              np.array([0], np.int32))
  edges, stopped = _pda_plain._stopping_walk(transitions, trie, *frontier, stop_at=3,
                                             max_edges=10**6, deadline=float("inf"),
                                             what="test")
  assert _walked(edges, stopped, trie) == (
      {(0, 0, 1)}, {(0, b"a" + bytes([b]), 3) for b in range(256)})


_GRAMMARS = {
    # Multi-byte literals between the calls and returns: plain runs inside tokens.
    "objects": ('root ::= "{key:" value "}"\nvalue ::= "null" | root', "{ke:nul}"),
    "lists": ('root ::= "[" items? "]"\nitems ::= item (",," items)?\n'
              'item ::= "abc" | root', "[],abc"),
}


def _grammar_case(name):
  text, alphabet = _GRAMMARS[name]
  tokens = [("".join(p)).encode() for n in (1, 2, 3)
            for p in itertools.product(alphabet, repeat=n)]
  return _pda.build_rtn(cd.Grammar(text).grammar_ir()), tokens


@pytest.mark.parametrize("name", sorted(_GRAMMARS))
def test_plain_states_walk_equals_the_enumeration(name):
  rtn, tokens = _grammar_case(name)
  alphabet = _GRAMMARS[name][1]
  plain = _pda_plain.PlainStates(rtn)
  # Special: a call, a return (final in its rule) or nothing else here (no registers).
  np.testing.assert_array_equal(
      plain.special, rtn.accepting | np.array([bool(c) for c in rtn.calls]))
  assert plain.special.any() and not plain.special.all()
  trie = _detokenizer.build_trie(_vocab(tokens))
  origins = np.flatnonzero(~plain.special)
  first_bytes = np.ones((len(origins), 256), bool)
  first_bytes[::2, ord(alphabet[0])] = False
  edges, stopped = plain.walk(trie, origins, first_bytes, max_edges=10**6,
                              deadline=float("inf"), what="test")
  expected = _enumerate(rtn.transitions, plain.special, tokens, origins.tolist(),
                        first_bytes)
  assert expected[0] and expected[1]
  assert _walked(edges, stopped, trie) == expected


def test_push_rows_by_length_then_content():
  # Two call sites: tokens such as "[{[" push two different return addresses in either
  # order.
  grammar = 'root ::= "[" root? "]" | "{" root? "}" | "a"'
  tokens = [bytes(p) for n in (1, 2, 3, 4) for p in itertools.product(b"[]{}a", repeat=n)]
  rtn = _pda.build_rtn(cd.Grammar(grammar).grammar_ir())
  token_pda = _pda.compose_token_pda(
      rtn, _detokenizer.build_trie(_vocab(tokens)), vocab_bytes=lambda t: tokens[t],
      num_words=(len(tokens) + 32) // 32)
  rows = [tuple(r[:n]) for r, n in zip(token_pda.push_symbols.tolist(),
                                       token_pda.push_lengths.tolist())]
  assert rows[0] == () and {len(r) for r in rows} >= {0, 1, 2, 3}
  assert any(r[::-1] in rows and r[0] != r[1] for r in rows if len(r) == 2)
  assert rows == sorted(set(rows), key=lambda r: (len(r), r))
  assert set(token_pda.edge_push.tolist()) == set(range(len(rows)))  # Every row used.
