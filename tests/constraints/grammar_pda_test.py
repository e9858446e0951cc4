"""Recursive grammars as token-level push-down automata (Alg. 3): build, tables, runtime.

Oracles: `lark` Earley parsers for the built-in grammars (`grammar_test._twin`; LALR for
arithmetic, the same language: `_arithmetic_lalr`), Python's
`json`, the grammar's own random strings (`_grammar_depth.sample_text`), and the numpy
reference walker (`testing.reference_step_stack`) for the device runtime.
"""

import functools
import json
import random

import grammar_test  # pylint: disable=import-error  (same directory)
import jax
import jax.numpy as jnp
import lark
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.automata import _pda
from constrained_decoding.constraints import _grammar_depth
from constrained_decoding.testing import (TokenIndex, reference_accepts, reference_allowed,
                                          reference_end_allowed, reference_step_stack)

PDA_BUILTINS = ["json", "arithmetic", "sexpr"]


@pytest.fixture(scope="module", name="tables_for")
def fixture_tables_for(gemma_compiler):
  """name -> the compiled built-in grammar (the compiler memoizes it)."""
  return lambda name: gemma_compiler.compile(cd.Grammar.builtin(name))


@pytest.fixture(scope="module", name="index")
def fixture_index(gemma_vocab):
  return TokenIndex(gemma_vocab)


# One jitted step and mask for the module (batch 1): eager calls compiled each
# primitive on its own.
_STEP = jax.jit(cd.advance)
_MASK = jax.jit(cd.allowed_tokens)


def _device_walk(tables, tokens):
  """States, stacks and flags of one row after each token, stepped under jit."""
  step = _STEP
  state = cd.init_state(tables, batch_size=1)
  out = []
  for t in tokens:
    state = step(tables, state, jnp.array([t], jnp.int32))
    depth = int(state.depth[0])
    out.append((int(state.state[0]), tuple(np.asarray(state.stack[0, :depth]).tolist()),
                bool(state.error[0])))
  return out, state


@pytest.mark.parametrize("name", PDA_BUILTINS)
def test_builtin_compiles_to_a_pushdown_automaton(name, gemma_compiler):
  tables, info = gemma_compiler.compile_with_info(cd.Grammar.builtin(name))
  assert tables.is_pushdown and tables.stack_depth == 64
  assert info.num_groups > info.token_states  # some groups pop
  assert info.dropped_paths >= 0
  assert "stack_depth=64" in repr(tables)


@functools.cache
def _arithmetic_lalr() -> lark.Lark:
  """`grammar_test`'s arithmetic twin under LALR with the contextual lexer: the same
  language as its Earley form (one multi-byte terminal, NUMBER, never next to another;
  binary `ADD_OP` and unary "-" never expected in one parser state), ~70x faster on the
  multi-kilobyte strings of nesting 5 (Earley was half of the test's time)."""
  return lark.Lark(grammar_test.ARITHMETIC_LARK, parser="lalr")


def _twin_accepts(name: str, text: bytes) -> bool:
  if name != "arithmetic":
    return grammar_test._twin_accepts(name, text)  # pylint: disable=protected-access
  return grammar_test.lark_accepts(_arithmetic_lalr(), text)


@pytest.mark.parametrize("name", PDA_BUILTINS)
def test_random_grammar_strings_are_accepted_under_random_tokenizations(
    name, tables_for, index):
  """Completeness: strings of the grammar (nesting up to 5) under random tokenizations."""
  tables = tables_for(name)
  grammar = cd.Grammar.builtin(name).grammar_ir()
  rng = random.Random(1)
  for _ in range(25):
    text = _grammar_depth.sample_text(grammar, rng, max_depth=5)
    assert _twin_accepts(name, text), text
    for tokens in (index.random_tokenization(text, rng), index.longest_tokenization(text)):
      assert reference_accepts(tables, tokens), (text, tokens)


@pytest.mark.parametrize("name", PDA_BUILTINS)
def test_prefixes_are_viable_and_wrong_strings_rejected(name, tables_for, index):
  tables = tables_for(name)
  grammar = cd.Grammar.builtin(name).grammar_ir()
  rng = random.Random(2)
  for _ in range(15):
    text = _grammar_depth.sample_text(grammar, rng, max_depth=4)
    tokens = index.longest_tokenization(text)
    # One walk allows every token in turn exactly when every prefix is viable (walking
    # each prefix again, as before, repeated the same steps: quadratic, ~2 min).
    states, ok = cd.testing.reference_walk(tables, tokens)
    assert ok and len(states) == len(tokens), (text, len(states))
    # Dropping the last byte or adding a closing bracket breaks most strings.
    for broken in (text + b")]}", text[:-1]):
      if not _twin_accepts(name, broken):
        assert not reference_accepts(tables, index.longest_tokenization(broken)), broken


def _random_walk(tables, rng, vocab, max_tokens=60):
  """Soundness walk: a random allowed token each step (end of sequence when allowed and
  after `max_tokens`, or by chance), with the numpy reference."""
  state, stack, tokens = int(tables.start[0]), (), []
  eos = set(vocab.eos_ids)
  while True:
    allowed = np.nonzero(reference_allowed(tables, state, stack))[0]
    assert len(allowed), (state, stack, tokens)
    end = reference_end_allowed(tables, state, stack)
    if end and (len(tokens) >= max_tokens or rng.random() < 0.15):
      return tokens
    choices = allowed[~np.isin(allowed, list(eos))]
    # Past the budget, prefer closing tokens so the walk ends.
    if len(tokens) >= max_tokens:
      closing = [t for t in choices.tolist()
                 if (vocab.token_bytes[t] or b"")[-1:] in (b"]", b"}", b")", b"\"")]
      choices = np.array(closing) if closing else choices
    t = int(choices[rng.randrange(len(choices))])
    state, stack = reference_step_stack(tables, state, stack, t)
    tokens.append(t)


@pytest.mark.parametrize("name", PDA_BUILTINS)
def test_random_token_walks_parse(name, tables_for, gemma_vocab):
  """Soundness: every walk through allowed tokens that may end spells a valid string."""
  tables = tables_for(name)
  rng = random.Random(3)
  for _ in range(12):
    tokens = _random_walk(tables, rng, gemma_vocab)
    text = gemma_vocab.decode(tokens)
    assert grammar_test._twin_accepts(name, text), text  # pylint: disable=protected-access
    if name == "json":
      json.loads(text)


def test_device_walk_equals_reference_walk(tables_for, index):
  tables = tables_for("json")
  rng = random.Random(4)
  for text in [b'{"a": [1, {"b": [true, null]}], "c": "q\\"x"}', b"[[[], [[]]], {}]",
               b'  {"k" : -1.5e3 }  ']:
    tokens = index.random_tokenization(text, rng)
    reference, ok = cd.testing.reference_walk(tables, tokens, with_stacks=True)
    assert ok
    device, final = _device_walk(tables, tokens)
    assert [(s, st, False) for s, st in reference] == device
    assert bool(_MASK(tables, final)[0, index.by_bytes[b"}"][0]]) == bool(
        reference_allowed(tables, *reference[-1])[index.by_bytes[b"}"][0]])
    eos = jnp.array([index_vocab_eos(tables)], jnp.int32)
    assert bool(_STEP(tables, final, eos).done[0])


def index_vocab_eos(tables) -> int:
  bits = np.asarray(tables.eos_bits)
  return int(np.nonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))[0][0])


def test_device_mask_equals_reference_mask(tables_for, index):
  tables = tables_for("json")
  tokens = index.longest_tokenization(b'{"a": [[1, 2], {"b": [')
  state = cd.init_state(tables, batch_size=1)
  ref_state, ref_stack = int(tables.start[0]), ()
  for t in tokens:
    np.testing.assert_array_equal(np.asarray(_MASK(tables, state)[0]),
                                  reference_allowed(tables, ref_state, ref_stack))
    state = _STEP(tables, state, jnp.array([t], jnp.int32))
    ref_state, ref_stack = reference_step_stack(tables, ref_state, ref_stack, t)


def test_unbalanced_and_forbidden_tokens_set_error(tables_for, index):
  tables = tables_for("json")
  for text in (b"[1]]", b'{"a" 1}', b"[1,,2]"):
    _, final = _device_walk(tables, index.longest_tokenization(text))
    assert bool(final.error[0]), text
  _, final = _device_walk(tables, index.longest_tokenization(b"[1, [2"))
  assert not bool(final.error[0])
  eos = jnp.array([index_vocab_eos(tables)], jnp.int32)
  after = _STEP(tables, final, eos)
  assert bool(after.error[0]) and not bool(after.done[0])  # unclosed brackets


def test_stack_overflow_sets_error_and_never_corrupts(gemma_vocab, index, tmp_path):
  compiler = cd.Compiler(gemma_vocab, cd.CompileOptions(stack_depth=3,
                                                        cache_dir=str(tmp_path)))
  tables = compiler.compile(cd.Grammar.builtin("json"))
  ok, _ = _device_walk(tables, index.longest_tokenization(b"[[1]]"))
  assert not ok[-1][2]
  tokens = [index.by_bytes[b"["][0]] * 6
  walk, final = _device_walk(tables, tokens)
  errors_at = [e for _, _, e in walk]
  assert errors_at.index(True) >= 2 and all(errors_at[errors_at.index(True):])
  assert int(final.depth[0]) <= 3


def test_regex_and_grammar_rows_mix_in_one_batch(gemma_compiler, tables_for, index):
  grammar = tables_for("arithmetic")
  regex = gemma_compiler.compile(cd.Regex(r"\(\d\)"))
  stacked = cd.stack_tables([regex, grammar])
  assert stacked.stack_depth == grammar.stack_depth
  texts = [b"(7)", b"(1+(2*3))"]
  rows = [index.longest_tokenization(t) for t in texts]
  state = cd.init_state(stacked, constraint_ids=jnp.array([0, 1]))
  step = _STEP
  for k in range(max(map(len, rows))):
    tokens = [r[k] if k < len(r) else index_vocab_eos(stacked) for r in rows]
    state = step(stacked, state, jnp.array(tokens, jnp.int32))
  assert not np.asarray(state.error).any()
  state = step(stacked, state, jnp.full((2,), index_vocab_eos(stacked), jnp.int32))
  assert np.asarray(state.done).all()


def test_tokens_cross_rule_boundaries(tables_for, index):
  """A token may close several rules at once (Outlines issue 684): after `[{"b":[1`
  the token `]}` pops two rules, while `]]` is not allowed (an object is open)."""
  tables = tables_for("json")
  prefix = index.longest_tokenization(b'[{"b":[1')
  states, ok = cd.testing.reference_walk(tables, prefix, with_stacks=True)
  assert ok
  allowed = reference_allowed(tables, *states[-1])
  close_two = index.by_bytes[b"]}"][0]
  assert allowed[close_two]
  assert not allowed[index.by_bytes[b"]]"][0]]
  assert reference_accepts(tables, prefix + [close_two, index.by_bytes[b"]"][0]])


def test_nondeterministic_grammar_raises_with_rules_and_prefix(byte_compiler):
  text = 'root ::= "x" | r "y"\nr ::= "x" r? "z"'
  with pytest.raises(errors.NondeterministicGrammarError,
                     match=r"rules \['r', 'root'\].*token b'x' can be read in two ways"):
    byte_compiler.compile(cd.Grammar(text))
  # The bounded regular version of the same grammar compiles.
  byte_compiler.compile(cd.Grammar(text, max_depth=3))


def test_tail_calls_push_nothing(byte_compiler):
  """Right recursion runs in constant stack: `list ::= item ("," list)?`."""
  grammar = cd.Grammar('root ::= "[" list "]"\nlist ::= [a-z] ("," list)? | "(" root ")"')
  tables = byte_compiler.compile(grammar)
  text = b"[" + b",".join([b"a"] * 50) + b"]"
  states, ok = cd.testing.reference_walk(tables, list(text), with_stacks=True)
  assert ok and max(len(stack) for _, stack in states) <= 2
  assert reference_accepts(tables, list(text))


def test_rtn_of_json_keeps_one_recursive_rule():
  rtn = _pda.build_rtn(cd.Grammar.builtin("json").grammar_ir())
  assert rtn.rules == ("root", "value")
  assert rtn.start == 0 and rtn.tops[0] == frozenset()
  assert all(rtn.rule_of_state[r] in (0, 1) for r in rtn.tops[1])
