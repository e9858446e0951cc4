"""The compressed chain's byte DFA built in numpy (`automata/_chain_dfa.py`).

It must be OpenFst's minimal DFA of `prefix X{n,m} suffix` (renumbered canonically),
arrays and byte classes included, over random classes, escapes, bounds and affixes; and
the tables compiled through it must equal, field by field, those compiled through
OpenFst.
"""

import dataclasses
import random

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _chain_dfa
from constrained_decoding.automata import _chain_edges
from constrained_decoding.automata import _counting
from constrained_decoding.automata import _fsa
from constrained_decoding.constraints import _ir as ir


def _openfst(chain: _counting.Chain, n2: int, m2: int):
  """(dfa, cell) through OpenFst and `_chain_layout`, canonically renumbered, or None."""
  unbounded = chain.max is None
  node = ir.concat(ir.Bytes(chain.prefix), ir.repeat(chain.body, n2, None if unbounded else m2),
                   ir.Bytes(chain.suffix))
  dfa = _fsa.compile_byte_dfa(node)
  if dfa.num_states == 0:
    return None
  layout = _counting._chain_layout(dfa, chain, m2, loops=unbounded)
  if layout is None:
    return None
  return _chain_dfa.canonical(dfa, layout[0], chain.prefix, chain.suffix, n2)


def _built(chain: _counting.Chain, n2: int, m2: int):
  slots = _chain_dfa.body_slots(_fsa.compile_byte_dfa(chain.body))
  if slots is None:
    return None
  return _chain_dfa.build(chain.prefix, slots, chain.suffix, n2, m2, chain.max is None)


def _random_class(rng: random.Random) -> ir.CharClass:
  """Random code-point ranges (ASCII, 2-, 3- and 4-byte characters), never `\\`."""
  ranges = []
  for _ in range(rng.randint(1, 4)):
    top = rng.choice([0x7F, 0x7FF, 0xFFFF, 0x10FFFF])
    lo = rng.randint(0x20, top)
    hi = min(top, lo + rng.randint(0, 3000))
    ranges.append((lo, hi))
  ranges = [r for lo, hi in ranges for r in ((lo, min(hi, 0x5B)), (max(lo, 0x5D), hi))
            if r[0] <= r[1]]
  return ir.char_class(ranges or [(0x61, 0x7A)])


def _random_escapes(rng: random.Random) -> list:
  """Escapes starting with `\\`: a letter, or `u` and one to three hex digits."""
  hex_digit = ir.char_class([(0x30, 0x39), (0x61, 0x66)])
  out = []
  for _ in range(rng.randint(0, 3)):
    if rng.random() < 0.5:
      letters = rng.sample(b"nrtbf\"/\\", rng.randint(1, 4))
      out.append(ir.concat(ir.Bytes(b"\\"), ir.char_class([(c, c) for c in letters])))
    else:
      out.append(ir.concat(ir.Bytes(b"\\u"), *[hex_digit] * rng.randint(1, 3)))
  return out


@pytest.mark.parametrize("seed", range(60))
def test_built_dfa_is_openfsts_minimal_dfa(seed):
  rng = random.Random(seed)
  klass = _random_class(rng)
  escapes = _random_escapes(rng)
  body = ir.union(klass, *escapes) if escapes else klass
  unbounded = rng.random() < 0.3
  n2 = rng.randint(1 if unbounded else 0, 12)
  m2 = n2 if unbounded else n2 + rng.randint(0, 12)
  prefix = bytes(rng.sample(b'"ab{:', rng.randint(0, 2)))
  suffix = bytes(rng.sample(b'"\\}!\n', rng.randint(0, 2)))
  chain = _counting.Chain(prefix=prefix, body=body, char_class=klass, min=n2,
                          max=None if unbounded else m2, suffix=suffix)
  want = _openfst(chain, n2, m2)
  got = _built(chain, n2, m2)
  if got is None:
    body_dfa = _fsa.compile_byte_dfa(body)
    if m2 == 0:
      return
    if _chain_dfa.body_slots(body_dfa) is None:  # X not prefix-free: no chain at all.
      assert want is None
    else:  # The suffix starts like X (an escape, a character of K).
      assert suffix and body_dfa.transitions[0, suffix[0]] >= 0
    return
  assert want is not None
  (want_dfa, want_cell), (got_dfa, got_cell) = want, got
  np.testing.assert_array_equal(got_dfa.transitions, want_dfa.transitions)
  np.testing.assert_array_equal(got_dfa.accepting, want_dfa.accepting)
  np.testing.assert_array_equal(got_dfa.class_edges, want_dfa.class_edges)
  np.testing.assert_array_equal(got_cell, want_cell)
  assert got_dfa.start == want_dfa.start == 0


def test_json_string_chains_match_openfst():
  for spec, n2, m2 in [({"type": "string", "maxLength": 9}, 0, 9),
                       ({"type": "string", "minLength": 7}, 7, 7),
                       ({"type": "string", "minLength": 3, "maxLength": 30}, 3, 30)]:
    chain = _counting.find_chain(cd.JsonSchema(spec).to_ir())
    got, want = _built(chain, n2, m2), _openfst(chain, n2, m2)
    np.testing.assert_array_equal(got[0].transitions, want[0].transitions)
    np.testing.assert_array_equal(got[1], want[1])


def test_ambiguous_suffix_is_not_built():
  # The suffix starts with a byte an escape starts with: OpenFst merges, no clean chain.
  body = ir.union(ir.char_class([(0x61, 0x7A)]), ir.concat(ir.Bytes(b"\\"), ir.Bytes(b"n")))
  slots = _chain_dfa.body_slots(_fsa.compile_byte_dfa(body))
  assert _chain_dfa.build(b"", slots, b"\\x", 0, 5, False) is None
  assert _chain_dfa.build(b"", slots, b"!", 0, 5, False) is not None


def test_body_slots_refuses_non_chain_bodies():
  assert _chain_dfa.body_slots(_fsa.compile_byte_dfa(ir.Bytes(b"ab"))) is not None
  # Not prefix-free (`a` then `ab`), cyclic, or nullable: no slots.
  for node in [ir.union(ir.Bytes(b"a"), ir.Bytes(b"ab")),
               ir.repeat(ir.Bytes(b"a"), 1, None),
               ir.union(ir.Bytes(b""), ir.Bytes(b"a"))]:
    assert _chain_dfa.body_slots(_fsa.compile_byte_dfa(node)) is None


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
  tokens = [bytes([b]) for b in range(256)] + [b"ab", b"abc", b'b"', b"\\n", b"u00", b"\xc3\xa4",
                                               b'", "', b'{"name": "', b"nab", None]
  vocab = cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])
  return cd.Compiler(vocab, cd.CompileOptions(
      cache_dir=str(tmp_path_factory.mktemp("chain_dfa")), memoize=False))


@pytest.mark.parametrize("spec", [
    cd.JsonSchema({"type": "string", "maxLength": 300}),
    cd.JsonSchema({"type": "string", "minLength": 40}),
    cd.Regex(r'"[^"]{2,45}"!'),
    cd.Regex(r"\w{1,400}"),
    cd.JsonSchema({"type": "object", "required": ["name"],
                   "properties": {"name": {"type": "string", "maxLength": 200},
                                  "id": {"type": "integer"}}}),
    cd.JsonSchema({"type": "array", "items": {"type": "string", "minLength": 30}}),
])
def test_tables_equal_through_openfst(spec, compiler, monkeypatch):
  def compile_fresh():
    _counting._COMPRESSED_CACHE.clear()
    tables, info = compiler.compile_with_info(spec)
    assert tables.token_counts.shape[0], "the counted path must be taken"
    return tables
  built = compile_fresh()
  # Without slots every chain goes through OpenFst and `_chain_dfa.canonical`.
  monkeypatch.setattr(_counting, "_body_slots", lambda body: None)
  through_openfst = compile_fresh()
  for field in dataclasses.fields(built):
    a, b = getattr(built, field.name), getattr(through_openfst, field.name)
    if isinstance(a, np.ndarray):
      np.testing.assert_array_equal(a, b, err_msg=field.name)
      assert a.dtype == b.dtype, field.name
    else:
      assert a == b, field.name


@pytest.mark.parametrize("spec", [
    cd.JsonSchema({"type": "string", "maxLength": 300}),
    cd.JsonSchema({"type": "string", "minLength": 40}),
    cd.JsonSchema({"type": "string", "minLength": 50, "maxLength": 500}),
    cd.Regex(r'"[^"]{2,45}"!'),
    cd.Regex(r"\w{1,400}"),
    cd.Regex(r"[^\"]{0,400}"),
])
def test_chain_walk_copies_equal_a_walk_of_every_state(spec, compiler):
  """`_chain_edges.walk_chain` walks one position per class and copies: the same edges as walking
  every chain state."""
  from constrained_decoding.automata import _compose
  chain = _counting.find_chain(spec.to_ir())
  span = int(compiler.trie.node_depth.max()) + 2
  n2, m2, _ = _counting._compressed(chain.min, chain.min if chain.max is None else chain.max,
                                    span)
  dfa, cell, stride, _, _ = _counting.compressed_dfa(chain, n2, m2)
  counts = _counting._class_counts(compiler.vocab, chain.char_class)
  states = np.unique(cell[cell >= 0])
  subtrie = _counting._chain_subtrie(counts, (dfa.transitions[states] >= 0).any(axis=0),
                                     compiler.trie)
  budget = dict(max_edges=10**8, deadline=float("inf"), what="chain")

  def edge_set(parts):
    if not parts:
      return np.zeros(0, np.int64)
    src, tok, dst = (np.asarray(a, np.int64) for a in _compose._concatenate_columns(parts))
    key = np.sort((src * 2**20 + tok) * 2**20 + dst)
    assert len(np.unique(key)) == len(key)
    return key

  copied = _chain_edges.walk_chain(dfa, subtrie, cell, stride, n2, m2, span, budget)
  every = _compose._walk(dfa, subtrie, states, **budget)
  np.testing.assert_array_equal(edge_set(copied), edge_set(every))
  assert len(copied) == 2 or not len(edge_set(every)), "positions were copied"
