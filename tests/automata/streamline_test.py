"""Streamlining push-down automata (`automata/_streamline.py`) and one-row masks.

Oracles: the unstreamlined tables walked by the numpy reference (`testing`), whose
allowed sets are rebuilt from edges, not mask rows; grammar strings from
`_grammar_depth.sample_text` under random tokenizations; a hand-built automaton whose
never-legal groups are known.
"""

import functools
import random
import time

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import _packing
from constrained_decoding.automata import _pda
from constrained_decoding.automata import _streamline
from constrained_decoding.constraints import _grammar_depth
from constrained_decoding.testing import (TokenIndex, reference_allowed, reference_end_allowed,
                                          reference_step_stack)

BOTTOM = _streamline.BOTTOM


def _token_pda(**fields):
  """A TokenPda from lists: groups as (state, pops top first), edges as
  (group, token, target, push row)."""
  groups, edges = fields.pop("groups"), fields.pop("edges")
  pushes = fields.pop("pushes", [()])
  width = max((len(p) for _, p in groups), default=0)
  q = max(len(p) for p in pushes)
  return _pda.TokenPda(
      num_states=fields["num_states"], start=0,
      accepting=np.array(fields["accepting"], bool),
      group_state=np.array([s for s, _ in groups], np.int32),
      group_pops=np.array([list(p) + [-1] * (width - len(p)) for _, p in groups],
                          np.int32).reshape(len(groups), width),
      group_num_pops=np.array([len(p) for _, p in groups], np.int32),
      edge_group=np.array([e[0] for e in edges], np.int32),
      edge_token=np.array([e[1] for e in edges], np.int32),
      edge_target=np.array([e[2] for e in edges], np.int32),
      edge_push=np.array([e[3] for e in edges], np.int32),
      push_symbols=np.array([list(p) + [-1] * (q - len(p)) for p in pushes],
                            np.int32).reshape(len(pushes), q),
      push_lengths=np.array([len(p) for p in pushes], np.int32),
      terminal_bits=np.zeros((0, 1), np.uint32),
      state_terminal=np.full(fields["num_states"], -1, np.int32),
      terminal_target=np.full(fields["num_states"], -1, np.int32), dropped_paths=0)


# a^n b^n: state 0 reads `a` (token 0) pushing return address 1, or `b` (token 1)
# popping it; 0 -a-> 0 push 1; 0 -b-> 1 pop 1; 1 -b-> 1 pop 1. Symbol 1 is only ever
# above symbol 1 or the bottom; state 2 is unreachable; the groups popping 2, popping
# (1, 2) and those of state 2 never match.
_ANBN = dict(
    num_states=3, accepting=[True, True, False],
    groups=[(0, ()), (0, (1,)), (0, (2,)), (1, ()), (1, (1,)), (1, (1, 2)), (2, ()),
            (2, (1,))],
    edges=[(0, 0, 0, 1), (1, 1, 1, 0), (2, 1, 1, 0), (4, 1, 1, 0), (5, 2, 0, 0),
           (6, 0, 0, 0), (7, 1, 1, 0)],
    pushes=[(), (1,)])


def test_stack_abstraction_of_a_hand_built_automaton():
  tops, below = _streamline.stack_abstraction(_token_pda(**_ANBN))
  assert tops == [{BOTTOM, 1}, {BOTTOM, 1}, set()]
  assert below == {1: {BOTTOM, 1}}


def test_stack_abstraction_revisits_pops_when_a_symbol_gains_a_neighbour():
  # 0 -a-> 1 pushing 1; 1 -b-> 2 popping 1; 1 -c-> 0 pushing 1. State 1's pop group is
  # examined before `c` shows that 1 can lie on 1, so it must be examined again:
  # `a c a b` reaches state 2 with 1 on top.
  pda = _token_pda(num_states=3, accepting=[True, False, True],
                   groups=[(0, ()), (1, (1,)), (1, ()), (2, ())],
                   edges=[(0, 0, 1, 1), (1, 1, 2, 0), (2, 2, 0, 1)], pushes=[(), (1,)])
  tops, below = _streamline.stack_abstraction(pda)
  assert tops == [{BOTTOM, 1}, {1}, {BOTTOM, 1}]
  assert below == {1: {BOTTOM, 1}}


def test_streamline_removes_exactly_the_never_legal_groups():
  pda = _token_pda(**_ANBN)
  out, report = _streamline.streamline(pda)
  kept = [(int(s), tuple(int(x) for x in p[:n]))
          for s, p, n in zip(out.group_state, out.group_pops, out.group_num_pops)]
  # Pop-free groups stay (they carry terminal bits), even the unreachable state's.
  assert kept == [(0, ()), (0, (1,)), (1, ()), (1, (1,)), (2, ())]
  assert (out.edge_token.tolist(), out.edge_group.tolist()) == ([0, 1, 1], [0, 1, 3])
  assert report == _streamline.StreamlineReport(
      groups_before=8, groups_after=5, edges_before=7, edges_after=3, unreachable_states=1)


def test_streamlined_tables_of_a_hand_built_automaton_walk_like_the_original(byte_vocab):
  full = _packing.pack_pda_tables(_token_pda(**_ANBN), byte_vocab, stack_depth=8)
  slim = _packing.pack_pda_tables(_streamline.streamline(_token_pda(**_ANBN))[0],
                                 byte_vocab, stack_depth=8)
  _assert_same_walks(full, slim, [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1, 1, 1, 1]])


def _assert_same_walks(full, slim, walks):
  """Both tables allow the same tokens and move alike at every prefix of `walks`."""
  for tokens in walks:
    a = b = (int(full.start[0]), ())
    for t in tokens:
      assert np.array_equal(reference_allowed(full, *a), reference_allowed(slim, *b))
      assert reference_end_allowed(full, *a) == reference_end_allowed(slim, *b)
      a, b = reference_step_stack(full, *a, t), reference_step_stack(slim, *b, t)
      assert a == b
      if a is None:
        break


def _gemma_pdas(compiler, name: str):
  """(TokenPda, unstreamlined tables, streamlined tables) of a built-in grammar."""
  rtn = _pda.build_rtn(cd.Grammar.builtin(name).pushdown_grammar())
  token_pda, _ = compiler._token_pda(rtn, name, time.perf_counter() + 600)  # pylint: disable=protected-access
  pack = functools.partial(_packing.pack_pda_tables, vocab=compiler.vocab, stack_depth=64)
  return (token_pda, pack(token_pda),
          pack(_streamline.streamline(token_pda)[0]))


@pytest.fixture(scope="module", name="pdas")
def fixture_pdas(gemma_compiler):
  """name -> `_gemma_pdas`, each built once per module."""
  return functools.cache(functools.partial(_gemma_pdas, gemma_compiler))


def _random_walks(tables, rng, count, length):
  """Token sequences of random allowed tokens (end of sequence excluded)."""
  walks = []
  for _ in range(count):
    state, tokens = (int(tables.start[0]), ()), []
    for _ in range(length):
      allowed = reference_allowed(tables, *state)
      allowed[_eos_ids(tables)] = False
      allowed = np.nonzero(allowed)[0].tolist()
      if not allowed:
        break
      # Favour low ids (bytes, punctuation) half the time, so stacks get deep.
      t = rng.choice(allowed[:64] if rng.random() < 0.5 else allowed)
      tokens.append(t)
      state = reference_step_stack(tables, *state, t)
      assert state is not None
    walks.append(tokens)
  return walks


def _walks(name, tables, vocab, rng, *, random_walks, strings):
  """Random walks of allowed tokens, and the grammar's random strings (nesting <= 4)
  under random tokenizations."""
  index = TokenIndex(vocab)
  grammar = cd.Grammar.builtin(name).grammar_ir()
  return _random_walks(tables, rng, random_walks, 40) + [
      index.random_tokenization(_grammar_depth.sample_text(grammar, rng, max_depth=4), rng)
      for _ in range(strings)]


@pytest.mark.parametrize("name", ["json", "arithmetic"])
def test_abstraction_covers_every_visited_stack(name, pdas, gemma_vocab):
  """Soundness of the bigram abstraction along random walks and grammar strings."""
  token_pda, full, _ = pdas(name)
  tops, below = _streamline.stack_abstraction(token_pda)
  walks = _walks(name, full, gemma_vocab, random.Random(3), random_walks=6, strings=12)
  visited = 0
  for tokens in walks:
    state, stack = int(full.start[0]), ()
    for t in tokens:
      step = reference_step_stack(full, state, stack, t)
      assert step is not None
      state, stack = step
      assert (stack[-1] if stack else BOTTOM) in tops[state]
      for lower, upper in zip((BOTTOM,) + stack, stack):
        assert lower in below[upper]
      visited += 1
  assert visited > 200


@pytest.mark.parametrize("name", ["json", "arithmetic"])
def test_streamlined_tables_walk_like_the_original(name, pdas, gemma_vocab):
  _, full, slim = pdas(name)
  walks = _walks(name, full, gemma_vocab, random.Random(4), random_walks=3, strings=8)
  _assert_same_walks(full, slim, walks)


def test_json_grammar_report(gemma_compiler):
  _, info = gemma_compiler.compile_with_info(cd.Grammar.builtin("json"))
  report = info.streamlined
  assert report.groups_after < report.groups_before == report.groups_after + 2
  assert report.edges_after < report.edges_before
  assert info.num_groups == report.groups_after
  assert info.token_edges == report.edges_after


def test_streamlining_can_be_turned_off(gemma_vocab):
  compiler = cd.Compiler(gemma_vocab, cd.CompileOptions(streamline=False))
  _, info = compiler.compile_with_info(cd.Grammar.builtin("arithmetic"))
  assert info.streamlined is None


def test_every_mask_row_is_the_union_of_the_matching_groups(pdas):
  """A group's mask row is what its state allows when the stack's top is exactly its
  pops: its own tokens and those of the groups popping a prefix (one gather a step)."""
  _, full, _ = pdas("json")
  eos = np.unpackbits(np.asarray(full.eos_bits).view(np.uint8),
                      bitorder="little")[:full.vocab_size].astype(bool)
  checked = 0
  for state, row in enumerate(np.asarray(full.state_groups)):
    for group in row[row >= 0].tolist():
      stack = tuple(reversed(full.group_pops[group, :full.group_num_pops[group]].tolist()))
      expected = reference_allowed(full, state, stack) & ~eos
      bits = np.asarray(full.mask_bits)[int(full.group_mask[group])]
      got = np.unpackbits(bits.view(np.uint8), bitorder="little")[:full.vocab_size]
      assert np.array_equal(got.astype(bool), expected), (state, group)
      checked += 1
  assert checked > 150


def _eos_ids(tables):
  bits = np.unpackbits(np.asarray(tables.eos_bits).view(np.uint8), bitorder="little")
  return np.nonzero(bits[:tables.vocab_size])[0].tolist()
