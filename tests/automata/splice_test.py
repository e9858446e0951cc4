"""Spliced fragments (`automata/_splice.py`): exact against inlining the fragment.

Oracle: the same IR compiled with every `ir.Fragment` inlined (its body composed with
the vocabulary like any other part). The two token automata are compared as languages:
a walk over pairs of states checks that both accept alike and that every token leads
both to a pair that is checked in turn (dense next-state arrays, terminals included).
The small vocabulary has tokens that enter and leave values (`":1,"`, `"}`, `e,"`, ...)
and a lowered terminal threshold, so that the fragment has wide states and exits.
"""

import random

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import tables as _tables
from constrained_decoding.automata import _compose
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _splice
from constrained_decoding.automata import _loops
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_values as jv
from constrained_decoding.testing import reference_accepts

_PIECES = ['",', '"}', '"]', '1,', '1}', '12', '0.5', 'e,"', 'e}', '":', '":"', '":1', '":{',
           '":[', ':1,"', ',"', '{"', '}]', '},{', '}}', ']}', '],', 'null', 'null,', 'true}',
           'false]', '[]', '{}', '"a', 'ab', 'abc"', 'bc",', ' "', ', ', '\\"', '\\u00',
           '"\u00e9', '\u00e9"', 'x"}', 'n', 'na', 'name', 'name"', 'id', 'id":', '-1',
           '1e5', '5,"', '"x":', 'x":[1', ' ', '  ']


def _vocab(byte_complete: bool) -> cd.Vocabulary:
  rng = random.Random(1)
  alphabet = b'abnx"{}:,[]\\ 0125.e-'
  pieces = sorted({p.encode() for p in _PIECES})
  pieces += [bytes(rng.choice(alphabet) for _ in range(rng.randint(2, 5))) for _ in range(400)]
  singles = [bytes([b]) for b in range(256)
             if byte_complete or b not in b"eu\\"]  # Some bytes only inside longer tokens.
  tokens = singles + sorted(set(pieces) - set(singles)) + [None]
  return cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])


@pytest.fixture(scope="module", params=[True, False], ids=["byte-complete", "gaps"])
def compiler(request):
  return cd.Compiler(_vocab(request.param), cd.CompileOptions(cache_dir=None))


@pytest.fixture(autouse=True)
def _small_terminals(monkeypatch):
  monkeypatch.setattr(_loops, "MIN_TERMINAL_TOKENS", 8)


def _fragment(compiler: cd.Compiler, fragment: ir.Fragment):
  """The compiler's composed `fragment` (built once per compiler)."""
  return compiler._fragment(fragment, float("inf"), "test")  # pylint: disable=protected-access


def _token_dfa(compiler: cd.Compiler, node: ir.Node, splice: bool):
  """The token DFA of `node`, fragments spliced (asserted) or inlined."""
  dfa = _fsa.compile_byte_dfa(node, fragments=splice)
  given = None
  if splice:
    assert len(dfa.fragment_arcs), "no fragment arc: the test would be vacuous"
    spliced = _splice.splice(dfa, [_fragment(compiler, f) for f in dfa.fragments])
    assert spliced is not None, "splicing refused"
    dfa, given = spliced
  wide = compiler.wide_states.find(dfa, None if given is None else given.states)
  return _compose.compose_token_dfa(
      dfa, compiler.trie, wide=wide, token_class_bits=compiler.wide_states.token_class_bits,
      num_words=_tables.num_words(compiler.vocab.vocab_size), given=given)


def _next_states(t: _compose.TokenDfa, state: int, vocab_size: int) -> np.ndarray:
  """int64 `[V]`: each token's next state from `state` (-1: not allowed)."""
  nxt = np.full(vocab_size, -1, np.int64)
  for k, target in t.state_terminals[state][::-1]:  # Earlier terminals take precedence.
    if k >= 0:
      bits = np.unpackbits(t.terminal_bits[k].view(np.uint8), bitorder="little")
      nxt[bits[:vocab_size].astype(bool)] = target
  lo, hi = np.searchsorted(t.edge_source, [state, state + 1])
  nxt[t.edge_token[lo:hi]] = t.edge_target[lo:hi]  # Explicit edges come first.
  return nxt


def assert_same_language(a: _compose.TokenDfa, b: _compose.TokenDfa, vocab_size: int):
  """Both token DFAs accept the same token sequences (a walk over pairs of states)."""
  assert a.num_states and b.num_states
  seen = {(0, 0)}
  stack = [(0, 0)]
  while stack:
    x, y = stack.pop()
    assert a.accepting[x] == b.accepting[y], (x, y)
    nx, ny = _next_states(a, x, vocab_size), _next_states(b, y, vocab_size)
    differ = np.flatnonzero((nx >= 0) != (ny >= 0))
    assert not len(differ), f"states {x}/{y} differ on tokens {differ[:10].tolist()}"
    allowed = nx >= 0
    for pair in set(zip(nx[allowed].tolist(), ny[allowed].tolist())):
      if pair not in seen:
        seen.add(pair)
        stack.append(pair)


SCHEMAS = [
    {"type": "object"},
    {"type": "object", "properties": {"name": {"type": "string"}, "id": {"type": "integer"}},
     "required": ["id"]},
    {"type": "object", "properties": {"a": {"type": "object"},
                                      "b": {"type": "array", "items": {"type": "object"}}}},
    {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "null"}}}},
    # Two free-form members each (any order, written twice): three would be past the
    # any-order budget of wide parts, a register object this test does not contract.
    {"type": "object", "properties": {"a": {}, "b": {"title": "any"}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {}, "c": True},
     "required": ["a"], "additionalProperties": False},
]


@pytest.mark.parametrize("whitespace", ["compact", "single", "flexible"])
@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
@pytest.mark.parametrize("depth", [0, 1, 2])
def test_spliced_schema_equals_inlined(compiler, schema, whitespace, depth):
  spec = cd.JsonSchema(schema, whitespace=whitespace, free_form_depth=depth)
  node = spec.to_ir()
  assert_same_language(_token_dfa(compiler, node, True), _token_dfa(compiler, node, False),
                       compiler.vocab.vocab_size)


@pytest.mark.parametrize("depth", [0, 2])
def test_spliced_schema_free_json_equals_inlined(compiler, depth):
  node = cd.Json(depth).to_ir()
  assert isinstance(node, ir.Fragment)
  spliced = _token_dfa(compiler, node, True)
  assert_same_language(spliced, _token_dfa(compiler, node, False), compiler.vocab.vocab_size)
  # The end state that only the fragment arc led to is dropped with the arc.
  inline_dfa = _fsa.compile_byte_dfa(ir.inline_fragments(node))
  spliced_dfa, _ = _splice.splice(_fsa.compile_byte_dfa(node, fragments=True),
                                  [_fragment(compiler, node)])
  assert spliced_dfa.num_states == inline_dfa.num_states


def _value(depth: int = 1) -> ir.Fragment:
  return ir.Fragment(f"test-value/{depth}", jv.json_value(jv.Whitespace(), depth))


@pytest.mark.parametrize("node", [
    _value(),  # At the start; nothing follows.
    ir.concat(ir.Bytes(b"["), _value(), ir.repeat(ir.concat(ir.Bytes(b","), _value()), 0, None),
              ir.Bytes(b"]")),
    ir.concat(_value(2), ir.repeat(ir.Bytes(b" "), 0, 2)),  # Whitespace after a value.
    ir.union(ir.concat(ir.Bytes(b"a"), _value(0), ir.Bytes(b"}")),
             ir.concat(ir.Bytes(b"b"), _value(2), ir.Bytes(b"]"))),
], ids=["alone", "list", "trailing-space", "two-fragments"])
def test_spliced_ir_equals_inlined(compiler, node):
  assert_same_language(_token_dfa(compiler, node, True), _token_dfa(compiler, node, False),
                       compiler.vocab.vocab_size)


@pytest.mark.parametrize("node", [
    ir.concat(_value(), ir.Bytes(b"5")),  # A digit may continue a number: not an exit.
    ir.concat(_value(), ir.Bytes(b"x")),  # Not a byte that may follow a JSON value.
    ir.concat(_value(), _value()),  # A value right after a value.
], ids=["digit", "x", "two-values"])
def test_unspliceable_arcs_are_refused(compiler, node):
  dfa = _fsa.compile_byte_dfa(node, fragments=True)
  automata = [_fragment(compiler, f) for f in dfa.fragments]
  assert _splice.splice(dfa, automata) is None


# A source that also reads bytes of its own: walked, its row the union of its own and the
# fragment's first bytes (the bytes both read lead to union states).
_MIXED = [
    ir.union(_value(), ir.Bytes(b"x")),  # Disjoint first bytes.
    ir.concat(ir.union(_value(), ir.Bytes(b"12"), ir.Bytes(b"true"), ir.Bytes(b'"a')),
              ir.Bytes(b"}")),  # Shared prefixes, one continuation.
    ir.union(ir.concat(_value(), ir.Bytes(b"}")),  # Different continuations: `12]`
             ir.concat(ir.Bytes(b"1"), ir.repeat(ir.Bytes(b"2"), 0, None), ir.Bytes(b"]")),
             ir.concat(ir.Bytes(b"[1"), ir.Bytes(b","), _value(0), ir.Bytes(b"]]"))),
    ir.concat(ir.Bytes(b"["), ir.union(ir.concat(_value(), ir.Bytes(b",")),
                                       ir.concat(ir.Bytes(b"-"), ir.Bytes(b"0"), ir.Bytes(b","))),
              _value(0), ir.Bytes(b"]")),  # Two sources, one mixed.
    ir.concat(ir.repeat(ir.Bytes(b" "), 0, 2), _value()),  # Flexible whitespace before.
]


@pytest.mark.parametrize("node", _MIXED, ids=["disjoint", "shared", "diverging", "two", "space-before"])
def test_mixed_sources_splice_as_inlined(compiler, node):
  dfa = _fsa.compile_byte_dfa(node, fragments=True)
  sources = dfa.fragment_arcs[:, 0]
  assert (dfa.transitions[sources] >= 0).any(), "no mixed source: the test would be vacuous"
  assert_same_language(_token_dfa(compiler, node, True), _token_dfa(compiler, node, False),
                       compiler.vocab.vocab_size)


_PETS = {"anyOf": [
    {"type": "object", "properties": {"kind": {"const": "cat"}, "age": {"type": "integer"}},
     "required": ["kind"]},
    {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"},
                                      "age": {"type": "number"}}, "required": ["kind"]},
    {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}]}


def test_discriminated_union_splices_as_inlined(compiler):
  """Each object leaves the others' keys free-form: `"age":` reads an integer or a
  number, `"good":` a boolean, either side a free-form value."""
  node = cd.JsonSchema(_PETS).to_ir()
  dfa = _fsa.compile_byte_dfa(node, fragments=True)
  assert not len(dfa.marker_arcs)
  assert (dfa.transitions[dfa.fragment_arcs[:, 0]] >= 0).any(), "no mixed source"
  assert_same_language(_token_dfa(compiler, node, True), _token_dfa(compiler, node, False),
                       compiler.vocab.vocab_size)


def test_compiler_splices_default_schemas(compiler, spy):
  calls = spy(_splice, "splice")
  schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
  texts = {"compact": b'{"id":1,"x":[1,"a"]}', "single": b'{"id": 1, "x": [1, "a"]}',
           "flexible": b'{ "id":1 , "x": [1,"a"] }'}
  for whitespace, text in texts.items():
    calls.clear()
    tables = compiler.compile(cd.JsonSchema(schema, whitespace=whitespace))
    assert len(calls) == 1
    assert calls[0] is not None
    byte_token = {t: i for i, t in enumerate(compiler.vocab.token_bytes) if t and len(t) == 1}
    tokens = [byte_token[bytes([b])] for b in text]
    assert reference_accepts(tables, tokens)
    assert not reference_accepts(tables, tokens[:-1])


def test_fragment_equality_is_by_name():
  a = ir.Fragment("v", ir.Bytes(b"1"))
  assert a == ir.Fragment("v", ir.Bytes(b"2")) and hash(a) == hash(ir.Fragment("v", ir.EPSILON))
  assert a != ir.Fragment("w", ir.Bytes(b"1"))
  assert (ir.inline_fragments(ir.concat(ir.Bytes(b"["), a))
          == ir.concat(ir.Bytes(b"["), ir.Bytes(b"1")))


def test_fragment_with_token_classes_is_inlined(compiler):
  node = ir.concat(ir.Bytes(b"<"), ir.Fragment("token", ir.Terminal("TEXT_TOKEN")))
  assert _splice.build_fragment(node.parts[1], compiler.trie, compiler.wide_states) is None
  dfa = _fsa.compile_byte_dfa(node, fragments=True)
  assert _splice.splice(dfa, [None]) is None
  # The compiler then inlines: one token-class terminal after "<".
  inlined = _fsa.compile_byte_dfa(node)
  assert len(inlined.token_arcs) == 1


def test_gemma_rpg_default_spliced_equals_inlined(gemma_compiler):
  rpg = {"type": "object", "properties": {
      "name": {"type": "string"}, "life": {"type": "integer"},
      "equipment": {"type": "array", "items": {"type": "object", "properties": {
          "name": {"type": "string"}, "quality": {"enum": ["Normal", "Magic"]}}}}}}
  node = cd.JsonSchema(rpg).to_ir()
  assert_same_language(_token_dfa(gemma_compiler, node, True),
                       _token_dfa(gemma_compiler, node, False),
                       gemma_compiler.vocab.vocab_size)


def test_fragments_are_cached_on_disk(tmp_path, monkeypatch):
  vocab = _vocab(True)
  fragment = cd.Json(1).to_ir()
  options = cd.CompileOptions(cache_dir=str(tmp_path))
  built = _fragment(cd.Compiler(vocab, options), fragment)
  [path] = tmp_path.glob("wide-v*-fragment-*.arrays")

  def no_walks(*args, **kwargs):
    raise AssertionError("composed again instead of loading the cached fragment")

  with monkeypatch.context() as patch:
    patch.setattr(_compose, "token_edges", no_walks)
    loaded = _fragment(cd.Compiler(vocab, options), fragment)
  for name in ("edges", "exit_from", "exit_node", "exit_byte"):
    assert all(np.array_equal(a, b) for a, b in zip(np.atleast_2d(getattr(built, name)),
                                                     np.atleast_2d(getattr(loaded, name))))
  assert built.terminals.keys() == loaded.terminals.keys()
  for state, edges in built.terminals.items():
    assert [(b.tobytes(), t) for b, t in edges] == [(b.tobytes(), t)
                                                   for b, t in loaded.terminals[state]]
  path.write_bytes(b"not a zip file")  # Damaged: built again, and rewritten.
  again = _fragment(cd.Compiler(vocab, options), fragment)
  assert np.array_equal(again.edges[1], built.edges[1]) and path.stat().st_size > 100
