"""`_splice.inline`: fragments inlined from their automata, where `splice` refuses.

Oracle: `_fsa.compile_byte_dfa(node)`, the IR compiled with every fragment's body in
place. `inline` must give the same `ByteDfa`, field for field (dtypes included), or
None; the compiler's tables must not depend on which of the two built the DFA.
"""

import random

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _splice
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_values as jv

_FIELDS = ("transitions", "accepting", "start", "token_arcs", "class_edges", "fragment_arcs",
           "marker_arcs")


def _automaton(fragment: ir.Fragment) -> _splice.FragmentAutomaton:
  """The fragment's minimal DFA without token edges: all that `inline` reads."""
  empty = np.zeros(0, np.int32)
  return _splice.FragmentAutomaton(fragment.name, _fsa.compile_byte_dfa(fragment.body),
                                   (empty,) * 3, {}, empty, empty, empty)


def _inline(node: ir.Node):
  """`_splice.inline` of `node`'s DFA with fragment arcs."""
  dfa = _fsa.compile_byte_dfa(node, fragments=True)
  return _splice.inline(dfa, [_automaton(f) for f in dfa.fragments])


def _assert_same(got, want) -> None:
  for name in _FIELDS:
    a, b = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
    assert a.dtype == b.dtype and a.shape == b.shape, name
    np.testing.assert_array_equal(a, b, err_msg=name)
  assert got.markers == want.markers and got.fragments == want.fragments == ()


def _value(depth: int = 1) -> ir.Fragment:
  return ir.Fragment(f"test-value/{depth}", jv.json_value(jv.Whitespace(), depth))


@pytest.mark.parametrize("node", [
    ir.concat(_value(), ir.Bytes(b"5")),  # A digit may continue a number.
    ir.concat(_value(), ir.Bytes(b"x")),
    ir.union(_value(), ir.Bytes(b"x")),  # The fragment's start also reads other bytes.
    ir.concat(ir.repeat(ir.Bytes(b" "), 0, 2), _value()),
    # A key one alternative declares and the other takes as an additional property
    # (the discriminated unions `splice` refuses), with register markers around.
    ir.union(ir.concat(ir.Bytes(b'{"a":'), ir.Marker("set", 0, 1), _value(), ir.Bytes(b"}")),
             ir.concat(ir.Bytes(b'{"a":'), ir.Bytes(b'"x"'), ir.Bytes(b',"b":'),
                       ir.Marker("set", 0, 2), _value(2), ir.Bytes(b"}"))),
    ir.concat(ir.Terminal("TEXT_TOKEN"), ir.union(_value(0), ir.Bytes(b"tx"))),
], ids=["digit", "x", "alternative", "space-before", "discriminated", "token-class"])
def test_inline_equals_the_compiled_ir(node):
  got = _inline(node)
  assert got is not None
  _assert_same(got, _fsa.compile_byte_dfa(node))


def test_inline_refuses_what_it_cannot_build():
  assert _inline(ir.concat(_value(), _value())) is None  # A continuation starts one.
  empty_start = ir.Fragment("maybe", ir.repeat(ir.Bytes(b"ab"), 0, 2))
  assert _inline(ir.concat(ir.Bytes(b"["), empty_start, ir.Bytes(b"]"))) is None
  dfa = _fsa.compile_byte_dfa(ir.concat(ir.Bytes(b"["), _value()), fragments=True)
  assert _splice.inline(dfa, [None]) is None  # A fragment that could not be built.


def _random_node(rng: random.Random, depth: int, fragments: list) -> ir.Node:
  """A small random IR over a few bytes, with fragments, markers and token classes."""
  pick = rng.random()
  if depth == 0 or pick < 0.3:
    leaf = rng.random()
    if leaf < 0.25:
      return rng.choice(fragments)
    if leaf < 0.3:
      return ir.Marker("set", 0, 1 << rng.randrange(3))
    if leaf < 0.33:
      return ir.Terminal("TEXT_TOKEN")
    if leaf < 0.5:
      return ir.char_class([(ord("a"), ord(rng.choice("abcx")))])
    return ir.Bytes(bytes(rng.choice(b'ab,}x"') for _ in range(rng.randint(1, 2))))
  children = [_random_node(rng, depth - 1, fragments) for _ in range(rng.randint(1, 3))]
  if pick < 0.55:
    return ir.concat(*children)
  if pick < 0.85:
    return ir.union(*children)
  return ir.repeat(children[0], rng.randint(0, 1), rng.choice([1, 2, None]))


def test_random_irs_inline_as_compiled():
  rng = random.Random(7)
  bodies = [jv.json_value(jv.Whitespace(), 0), ir.concat(ir.Bytes(b"b"), ir.repeat(
      ir.char_class([(ord("a"), ord("c"))]), 0, None)), ir.Bytes(b"ax")]
  fragments = [ir.Fragment(f"random/{i}", body) for i, body in enumerate(bodies)]
  checked = 0
  for _ in range(300):
    node = _random_node(rng, 4, fragments)
    dfa = _fsa.compile_byte_dfa(node, fragments=True)
    if not len(dfa.fragment_arcs):
      continue
    got = _inline(node)
    if got is not None:
      _assert_same(got, _fsa.compile_byte_dfa(node))
      checked += 1
  assert checked >= 50


def test_compiler_tables_do_not_depend_on_the_inlining(monkeypatch):
  """A discriminated union (which `splice` now splices; refused here): the compiler
  inlines from the automata, and its tables equal those compiled from the IR."""
  vocab = cd.Vocabulary.from_token_bytes(
      [bytes([b]) for b in range(256)] + [b'{"', b'":', b'",', b'"}', b'kind', b'dog', None],
      eos_ids=[262])
  schema = {"anyOf": [
      {"type": "object", "properties": {"kind": {"const": "dog"}, "bark": {"type": "boolean"}},
       "required": ["kind"]},
      {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}]}
  spec = cd.JsonSchema(schema)
  options = cd.CompileOptions(cache_dir=None, memoize=False)
  monkeypatch.setattr(_splice, "splice", lambda *a, **k: None)
  calls = []
  original = _splice.inline
  monkeypatch.setattr(_splice, "inline", lambda *a: calls.append(original(*a)) or calls[-1])
  fast = cd.Compiler(vocab, options).compile(spec)
  assert calls and calls[-1] is not None
  monkeypatch.setattr(_splice, "inline", lambda *a: None)
  slow = cd.Compiler(vocab, options).compile(spec)
  for name in fast.__dataclass_fields__:
    np.testing.assert_array_equal(np.asarray(getattr(fast, name)), np.asarray(getattr(slow, name)),
                                  err_msg=name)
