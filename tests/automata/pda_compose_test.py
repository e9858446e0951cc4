"""The token-level PDA (`_pda.compose_token_pda`) against a per-token enumeration.

Oracle: each (state, token) pair's paths followed byte by byte in plain Python over the
RTN, with the epsilon moves the module docstring specifies (calls push their return
address unless it is a tail, returns pop what the token pushed or else the stack below,
taken only before a byte), one configuration set per byte. The composition walks the
vocabulary trie in numpy over interned configurations; both must give the same edges
(source, token, pops, target, pushes). Also the two ways `_edge_groups` numbers groups.
"""

import itertools

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _pda

_GRAMMARS = {
    # Nesting with returns inside tokens ("))+" pops two rules).
    "parens": ('root ::= expr\nexpr ::= term ("+" term)*\nterm ::= "x" | "(" expr ")"',
               "x+()"),
    # Right recursion (tail calls push nothing) next to a call with a return address.
    "lists": ('root ::= "[" items? "]"\nitems ::= item ("," items)?\n'
              'item ::= "a" | root', "[],a"),
}


def _oracle_edges(rtn, vocab_bytes, max_pops, max_pushes):
  """{(source, token, pops top first, target, pushes bottom first)} by enumeration."""
  def is_tail(q):
    return bool(rtn.accepting[q]) and not rtn.calls[q] and not (rtn.transitions[q] >= 0).any()

  def closure(configs):
    seen, todo = set(configs), list(configs)
    while todo:
      state, pushed, popped = todo.pop()
      moves = []
      for rule, ret in rtn.calls[state]:
        if is_tail(ret):
          moves.append((rtn.rule_start[rule], pushed, popped))
        elif len(pushed) < max_pushes:
          moves.append((rtn.rule_start[rule], pushed + (ret,), popped))
      if rtn.accepting[state]:
        if pushed:
          moves.append((pushed[-1], pushed[:-1], popped))
        elif len(popped) < max_pops:
          moves += [(ret, (), popped + (ret,))
                    for ret in rtn.tops[rtn.rule_of_state[state]]]
      for move in moves:
        if move not in seen:
          seen.add(move)
          todo.append(move)
    return seen

  edges = set()
  for source in range(rtn.num_states):
    for token, text in enumerate(vocab_bytes):
      if not text:
        continue
      configs = {(source, (), ())}
      for b in text:
        configs = {(int(rtn.transitions[q, b]), pushed, popped)
                   for q, pushed, popped in closure(configs) if rtn.transitions[q, b] >= 0}
      edges |= {(source, token, popped, q, pushed) for q, pushed, popped in configs}
  return edges


def _pda_edges(token_pda):
  out = set()
  for g, t, target, u in zip(token_pda.edge_group.tolist(), token_pda.edge_token.tolist(),
                             token_pda.edge_target.tolist(), token_pda.edge_push.tolist()):
    pops = tuple(token_pda.group_pops[g, :token_pda.group_num_pops[g]].tolist())
    pushes = tuple(token_pda.push_symbols[u, :token_pda.push_lengths[u]].tolist())
    out.add((int(token_pda.group_state[g]), t, pops, target, pushes))
  return out


@pytest.mark.parametrize("name", sorted(_GRAMMARS))
@pytest.mark.parametrize("max_pops,max_pushes", [(8, 16), (1, 1)])
def test_edges_equal_the_enumeration(name, max_pops, max_pushes):
  text, alphabet = _GRAMMARS[name]
  tokens = [("".join(p)).encode() for n in (1, 2, 3)
            for p in itertools.product(alphabet, repeat=n)]
  vocab = cd.Vocabulary.from_token_bytes(tokens + [None], eos_ids=[len(tokens)])
  rtn = _pda.build_rtn(cd.Grammar(text).grammar_ir())
  token_pda = _pda.compose_token_pda(
      rtn, _detokenizer.build_trie(vocab), vocab_bytes=lambda t: tokens[t],
      num_words=(len(tokens) + 32) // 32, max_pops=max_pops, max_pushes=max_pushes)
  expected = _oracle_edges(rtn, tokens, max_pops, max_pushes)
  assert len(expected) > 30
  assert _pda_edges(token_pda) == expected
  # Groups: one per (state, pops) with edges, plus every state's pop-free one, in order.
  keys = [(int(s), tuple(p[:n].tolist())) for s, p, n in
          zip(token_pda.group_state, token_pda.group_pops, token_pda.group_num_pops)]
  assert keys == sorted(keys, key=lambda k: (k[0], len(k[1]), k[1]))
  assert set(keys) == ({(e[0], e[2]) for e in expected}
                       | {(s, ()) for s in range(rtn.num_states)})


@pytest.mark.parametrize("seed", range(5))
def test_edge_groups_marked_or_sorted_agree(seed):
  rng = np.random.default_rng(seed)
  num_states, num_pops = int(rng.integers(1, 40)), int(rng.integers(1, 12))
  key = rng.integers(0, num_states * num_pops, int(rng.integers(0, 300)))
  expected = np.unique(np.concatenate([key, np.arange(num_states) * num_pops]))
  for limit in (None, 0):
    keys, edge_group = _pda._edge_groups(key, num_states, num_pops, mark_limit=limit)
    np.testing.assert_array_equal(keys, expected)
    np.testing.assert_array_equal(keys[edge_group], key)
