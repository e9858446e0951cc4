"""Stack-aware masks: no walk over allowed tokens of push-down tables ever sets `error`.

With a small `stack_depth`, random walks over the allowed tokens (numpy reference,
`testing.reference_allowed`) are steered towards opening tokens so that they reach the
stack bound; they must never find the allowed set empty where end is not allowed, and
never push past the capacity. Oracles: the `lark` twins of the grammars (every finished
walk parses), the numpy reference walk (`reference_step_stack`), and the jitted device
step, which must agree with the reference along walks that hit the bound.
"""

import dataclasses
import functools
import random

import grammar_test  # pylint: disable=import-error  (same directory)
import jax
import jax.numpy as jnp
import lark
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.testing import (reference_allowed, reference_end_allowed,
                                          reference_stack_needs, reference_step_stack)

# The grammar of issue 20: nesting of two kinds, and a list whose items return to an
# accepting address (`("," root)*` may continue) above one that is not (`"]"`).
NESTING = 'root ::= "(" root ")" | "x" | "[" list "]"\nlist ::= root ("," root)*\n'
NESTING_LARK = 'start: root\nroot: "(" root ")" | "x" | "[" list "]"\nlist: root ("," root)*\n'
GRAMMARS = ["nesting", "json", "arithmetic", "sexpr"]
OPENING = (b"(", b"[", b"{")


def _grammar(name: str) -> cd.Grammar:
  return cd.Grammar(NESTING) if name == "nesting" else cd.Grammar.builtin(name)


@functools.cache
def _nesting_twin() -> lark.Lark:
  """The Earley parser of NESTING's twin, built once (not once per finished walk)."""
  return lark.Lark(NESTING_LARK, parser="earley")


def _parses(name: str, data: bytes) -> bool:
  if name != "nesting":
    return grammar_test._twin_accepts(name, data)  # pylint: disable=protected-access
  return grammar_test.lark_accepts(_nesting_twin(), data)


_OPENING_TOKENS = {}  # id(vocab) -> (vocab, flags): kept per vocabulary, built once


def _opening_tokens(vocab) -> np.ndarray:
  """Per token, whether its bytes contain an opening bracket (bool [V]). Built once per
  vocabulary: for Gemma 3's 262k tokens a fresh scan per walk was most of this file's
  time."""
  if id(vocab) not in _OPENING_TOKENS:
    flags = np.array([any(o in (b or b"") for o in OPENING) for b in vocab.token_bytes])
    _OPENING_TOKENS[id(vocab)] = (vocab, flags)
  return _OPENING_TOKENS[id(vocab)][1]


def _deep_walk(tables, vocab, rng: random.Random, max_tokens: int):
  """A random walk over allowed tokens that prefers opening ones (so it reaches the
  stack bound), then closes; returns (tokens, (state, stack) before each token, ended).

  Asserts at every step that the row can go on (some token allowed, or end), and that
  no allowed token overflows the stack.
  """
  state, stack, tokens, trail = int(tables.start[0]), (), [], []
  eos = set(vocab.eos_ids)
  opening = _opening_tokens(vocab)
  for _ in range(4 * max_tokens):
    allowed = np.nonzero(reference_allowed(tables, state, stack))[0]
    end = reference_end_allowed(tables, state, stack)
    choices = allowed[~np.isin(allowed, list(eos))]
    assert len(choices) or end, ("dead end", state, stack, vocab.decode(tokens))
    if end and (not len(choices) or len(tokens) >= max_tokens or rng.random() < 0.02):
      return tokens, trail, True
    if len(tokens) < max_tokens and rng.random() < 0.7:
      deeper = choices[opening[choices]]  # in order: the same draws as a list scan
      choices = deeper if len(deeper) else choices
    t = int(choices[rng.randrange(len(choices))])
    trail.append((state, stack))
    state, stack = reference_step_stack(tables, state, stack, t)
    assert len(stack) <= tables.stack_depth, ("overflow", vocab.decode(tokens + [t]))
    tokens.append(t)
  return tokens, trail, False


@pytest.fixture(scope="module", name="byte_tables")
def fixture_byte_tables(byte_vocab):
  compilers = {}

  def tables(name, depth):
    if depth not in compilers:
      compilers[depth] = cd.Compiler(byte_vocab, cd.CompileOptions(stack_depth=depth))
    return compilers[depth].compile(_grammar(name))
  return tables


@pytest.mark.parametrize("name", GRAMMARS)
@pytest.mark.parametrize("depth", [4, 6, 8])
def test_byte_walks_reach_the_bound_and_always_finish(name, depth, byte_tables, byte_vocab):
  tables = byte_tables(name, depth)
  rng = random.Random(depth)
  deepest = 0
  for _ in range(120):  # 4 grammars x 3 depths x 120 = 1,440 walks
    tokens, trail, ended = _deep_walk(tables, byte_vocab, rng, max_tokens=40)
    deepest = max([deepest] + [len(stack) for _, stack in trail])
    if ended:
      assert _parses(name, byte_vocab.decode(tokens)), byte_vocab.decode(tokens)
  assert deepest >= depth - 1  # the walks do reach the bound


@pytest.mark.parametrize("name", GRAMMARS)
def test_gemma_walks_with_multi_symbol_pushes_never_fail(name, gemma_vocab):
  """Gemma tokens such as `[[`, `{"` or `((` push several symbols at once."""
  tables = cd.Compiler(gemma_vocab, cd.CompileOptions(stack_depth=6)).compile(_grammar(name))
  rng = random.Random(7)
  deepest = 0
  for _ in range(25):
    tokens, trail, ended = _deep_walk(tables, gemma_vocab, rng, max_tokens=25)
    deepest = max([deepest] + [len(stack) for _, stack in trail])
    if ended:
      assert _parses(name, gemma_vocab.decode(tokens)), gemma_vocab.decode(tokens)
  assert deepest >= 5


_MASK = jax.jit(cd.allowed_tokens)
_STEP = jax.jit(cd.advance)


@pytest.mark.parametrize("name", GRAMMARS)
def test_device_masks_and_steps_equal_the_reference_at_the_bound(name, byte_tables,
                                                                 byte_vocab):
  tables = byte_tables(name, 4)
  rng = random.Random(11)
  for _ in range(3):
    tokens, trail, _ = _deep_walk(tables, byte_vocab, rng, max_tokens=30)
    state = cd.init_state(tables, batch_size=1)
    for t, (ref_state, ref_stack) in zip(tokens, trail):
      assert (int(state.state[0]), tuple(np.asarray(state.stack[0, :int(state.depth[0])])
                                         .tolist())) == (ref_state, ref_stack)
      np.testing.assert_array_equal(np.asarray(_MASK(tables, state)[0]),
                                    reference_allowed(tables, ref_state, ref_stack))
      state = _STEP(tables, state, jnp.array([t], jnp.int32))
      assert not bool(state.error[0])


def test_stacked_tables_keep_the_bound_of_each_part(byte_vocab, byte_tables):
  """Stacking with a deeper part raises D; the stacked masks are the reference's."""
  shallow = byte_tables("nesting", 4)
  regex = cd.Compiler(byte_vocab).compile(cd.Regex(r"\(x\)"))
  stacked = cd.stack_tables([regex, shallow, byte_tables("json", 8)])
  assert stacked.stack_depth == 8
  rng = random.Random(5)
  tokens, trail, _ = _deep_walk(shallow, byte_vocab, rng, max_tokens=20)
  start = int(stacked.start[1])
  state = cd.init_state(stacked, constraint_ids=jnp.array([1]))
  ref_state, ref_stack = start, ()
  for t in tokens:
    np.testing.assert_array_equal(np.asarray(_MASK(stacked, state)[0]),
                                  reference_allowed(stacked, ref_state, ref_stack))
    state = _STEP(stacked, state, jnp.array([t], jnp.int32))
    ref_state, ref_stack = reference_step_stack(stacked, ref_state, ref_stack, t)
  assert not bool(state.error[0])


def test_needs_and_masks_at_the_bound_of_the_issue_grammar(byte_tables):
  tables = byte_tables("nesting", 4)
  need, need_return = reference_stack_needs(tables)
  assert need[int(tables.start[0])] == 0  # "x" finishes at once
  # At depth 3 of 4, "(" is still offered ("x" then closes it); at depth 4 it is not.
  assert reference_allowed(tables, *_after(tables, b"((("))[ord("(")]
  assert not reference_allowed(tables, *_after(tables, b"(((("))[ord("(")]
  assert need_return.min() == 0


def _after(tables, data: bytes):
  state, stack = int(tables.start[0]), ()
  for b in data:
    state, stack = reference_step_stack(tables, state, stack, b)
  return state, stack


def test_grammar_that_cannot_finish_within_the_stack_is_refused(byte_vocab):
  # Every sentence nests at least two recursive calls: "(" inner ")" with inner "{" leaf "}".
  grammar = cd.Grammar('root ::= "(" inner ")"\n'
                       'inner ::= "[" inner "]" | "{" leaf "}"\n'
                       'leaf ::= "<" leaf ">" | "x"\n')
  with pytest.raises(errors.CompileBudgetError, match="stack_depth"):
    cd.Compiler(byte_vocab, cd.CompileOptions(stack_depth=1)).compile(grammar)
  tables = cd.Compiler(byte_vocab, cd.CompileOptions(stack_depth=3)).compile(grammar)
  assert tables.is_pushdown


def test_without_stack_aware_masks_the_walks_overflow(byte_tables, byte_vocab):
  """The property above is not vacuous: the same walks on tables without the capped
  rows (as before stack-aware masks) push past the bound."""
  tables = byte_tables("nesting", 4)
  uncapped = dataclasses.replace(tables, capped_limits=np.zeros((0, 0), np.int32),
                                 capped_rows=np.zeros((0, 0), np.int32),
                                 capped_bits=np.zeros((0, 0), np.uint32))
  rng = random.Random(3)
  with pytest.raises(AssertionError, match="overflow|dead end"):
    for _ in range(50):
      _deep_walk(uncapped, byte_vocab, rng, max_tokens=40)


def test_regular_tables_carry_no_capped_rows(byte_vocab, byte_tables):
  """Regular tables keep their layout, step and `shape_key`; only push-down ones cap."""
  regex = cd.Compiler(byte_vocab).compile(cd.Regex(r"\(x\)"))
  assert regex.capped_limits.shape == regex.capped_rows.shape == (0, 0)
  assert regex.capped_bits.shape == (0, 0)
  assert len(regex.shape_key[0]) == len(byte_tables("nesting", 4).shape_key[0]) - 3
  # The push-down step gathers one exclusion row more; the regular step is unchanged.
  grammar = byte_tables("nesting", 4)
  uncapped = dataclasses.replace(grammar, capped_limits=np.zeros((0, 0), np.int32),
                                 capped_rows=np.zeros((0, 0), np.int32),
                                 capped_bits=np.zeros((0, 0), np.uint32))

  def gathers(tables):
    return str(jax.make_jaxpr(cd.allowed_bits)(
        tables, cd.init_state(tables, batch_size=1))).count("gather")
  assert gathers(grammar) > gathers(uncapped)
