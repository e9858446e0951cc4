"""Tests for IR -> pynini -> `ByteDfa` (`automata/_fsa.py`)."""

import functools
import itertools
import random

import numpy as np
import pynini
import pytest
import pywrapfst

from constrained_decoding import errors
from constrained_decoding.automata import _byte_dfa
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _nfa
from constrained_decoding.automata import _nfa_pack
from constrained_decoding.automata import _utf8
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _regex

_MAX = ir.MAX_CODE_POINT


@functools.cache
def _encodings() -> dict[int, tuple[np.ndarray, np.ndarray]]:
  """{UTF-8 length n: (code points, their encodings as a uint8 [N, n] array)}."""
  scalars = np.concatenate([np.arange(0xD800), np.arange(0xE000, _MAX + 1)])
  out = {}
  for n, (lo, hi) in enumerate([(0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF),
                                (0x10000, _MAX)], start=1):
    codes = scalars[(scalars >= lo) & (scalars <= hi)]
    text = codes.astype("<u4").tobytes().decode("utf-32-le")
    out[n] = codes, np.frombuffer(text.encode(), np.uint8).reshape(-1, n)
  return out


def _check_sequences(lo: int, hi: int) -> None:
  """utf8_sequences(lo, hi) spells exactly the encodings of the scalars in lo..hi."""
  sequences = _utf8.utf8_sequences(lo, hi)
  matched = {n: np.zeros(len(codes), np.int64) for n, (codes, _) in _encodings().items()}
  size = 0
  for seq in sequences:
    codes, encoded = _encodings()[len(seq)]
    inside = np.ones(len(codes), bool)
    for i, (b_lo, b_hi) in enumerate(seq):
      inside &= (encoded[:, i] >= b_lo) & (encoded[:, i] <= b_hi)
    matched[len(seq)] += inside
    size += int(np.prod([b_hi - b_lo + 1 for b_lo, b_hi in seq]))
  expected = 0
  for n, (codes, _) in _encodings().items():
    wanted = (codes >= lo) & (codes <= hi)
    # Every scalar in range is spelled by exactly one sequence, and no other one is.
    np.testing.assert_array_equal(matched[n], wanted.astype(np.int64))
    expected += int(wanted.sum())
  # The sequences spell no byte string that is not such an encoding.
  assert size == expected
  starts = [tuple(b for b, _ in seq) for seq in sequences]
  assert starts == sorted(starts), "sequences are not in increasing order"


def test_utf8_sequences_of_all_scalar_values():
  _check_sequences(0, _MAX)
  assert len(_utf8.utf8_sequences(0, _MAX)) == 9  # The classic table (RFC 3629).


@pytest.mark.parametrize("lo, hi", [
    (0, 0), (0x7F, 0x80), (0x7FF, 0x800), (0xD7FF, 0xE000), (0xD800, 0xDFFF),
    (0xFFFF, 0x10000), (0x10FFFF, 0x10FFFF), (0x41, 0x10FFFF), (0xE9, 0x4E2D),
    (0x1F600, 0x1F64F),
])
def test_utf8_sequences_of_boundary_ranges(lo, hi):
  _check_sequences(lo, hi)


def test_utf8_sequences_of_random_ranges():
  rng = random.Random(0)
  boundaries = [0, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, _MAX]
  for _ in range(40):
    a = rng.choice([rng.randrange(_MAX + 1), rng.choice(boundaries) + rng.randrange(-2, 3)])
    b = rng.randrange(_MAX + 1)
    lo, hi = sorted((min(max(a, 0), _MAX), b))
    _check_sequences(lo, hi)


def test_char_class_automaton_accepts_exactly_one_utf8_character():
  dfa = _fsa.compile_byte_dfa(ir.char_class([(0, _MAX)]))
  for n, (codes, encoded) in _encodings().items():
    for row in encoded[:: max(1, len(codes) // 2000)]:
      assert dfa.accepts(bytes(row))
  invalid = [b"", b"\x80", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80",
             b"\xf0\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xff",
             b"ab", "é".encode()[:1]]
  for data in invalid:
    assert not dfa.accepts(data), data


def _canonical(dfa: _byte_dfa.ByteDfa) -> tuple:
  """The DFA renumbered in breadth-first order from the start: equal iff isomorphic."""
  if dfa.num_states == 0:
    return ()
  order = {dfa.start: 0}
  queue = [dfa.start]
  for state in queue:
    for target in dfa.transitions[state]:
      if target >= 0 and int(target) not in order:
        order[int(target)] = len(order)
        queue.append(int(target))
  rows = []
  for state in queue:
    row = tuple(order[int(t)] if t >= 0 else -1 for t in dfa.transitions[state])
    rows.append((row, bool(dfa.accepting[state])))
  return tuple(rows)


def _export_slow(fst: pywrapfst.Fst, edges=_nfa.BYTE_EDGES) -> _byte_dfa.ByteDfa:
  """The reference for `_fsa._export_fast`: states and arcs read one by one in Python."""
  zero = pywrapfst.Weight.zero(fst.weight_type())
  accepting, src, labels, dst = [], [], [], []
  for state in fst.states():
    accepting.append(fst.final(state) != zero)
    for arc in fst.arcs(state):
      src.append(state)
      labels.append(arc.ilabel)
      dst.append(arc.nextstate)
  return _fsa._dfa_from_arcs(  # pylint: disable=protected-access
      fst.start(), np.array(accepting, bool), np.array(src, np.int64),
      np.array(labels, np.int32), np.array(dst, np.int32), edges,
  )


_PATTERNS = [
    r"Red|Orange|Yellow|Green|Blue|Indigo|Violet",
    r"\d{4}-[01]\d-[0-3]\dT[0-2]\d:[0-5]\d:[0-5]\d([+][0-2]\d:[0-5]\d|Z)",
    r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)",
    r"[^\"\\]*",
    r"(?:a|bc)*d?",
    r".{0,3}é",
    r"\w+",
    r"(?:\u4e00|[😀-🙏])+",
    r"",
]


@pytest.mark.parametrize("pattern", _PATTERNS)
def test_export_fast_path_agrees_with_slow_path(pattern):
  node = _regex.parse_regex(pattern)
  # Byte labels (the public path) ...
  fst = _fsa._minimize(_fsa.ir_to_fst(node))
  fast, slow = _fsa._export_fast(fst), _export_slow(fst)
  np.testing.assert_array_equal(fast.transitions, slow.transitions)
  np.testing.assert_array_equal(fast.accepting, slow.accepting)
  assert fast.start == slow.start == 0
  # ... and class labels (the fast compile path).
  nfa = _nfa.build_nfa(node)
  finals = _nfa.remove_epsilons(nfa)
  edges = _nfa.byte_classes(nfa.bounds)
  data, deterministic = _nfa_pack.pack_bytes(nfa, edges, finals)
  fst = _fsa._minimize(pywrapfst.Fst.read_from_string(data), has_epsilons=False,
                       deterministic=deterministic)
  fast, slow = _fsa._export_fast(fst, edges), _export_slow(fst, edges)
  np.testing.assert_array_equal(fast.transitions, slow.transitions)
  np.testing.assert_array_equal(fast.accepting, slow.accepting)


@pytest.mark.parametrize("pattern", _PATTERNS)
def test_compile_byte_dfa_equals_the_plain_pipeline(pattern):
  node = _regex.parse_regex(pattern)
  fast = _fsa.compile_byte_dfa(node)
  plain = _fsa.fst_to_byte_dfa(_fsa.ir_to_fst(node))
  assert fast.start == 0
  assert fast.transitions.dtype == np.int32 and fast.transitions.shape[1] == 256
  assert _canonical(fast) == _canonical(plain)


def test_dfa_is_minimal_and_trimmed():
  dfa = _fsa.compile_byte_dfa(_regex.parse_regex(r"(?:ab|cb)d|xyz"))
  # Minimal: a, c -> one state; b -> one; d -> final; x, y, z chain shares the final.
  assert dfa.num_states == 6
  # Trimmed: every state reaches an accepting state.
  live = set(np.flatnonzero(dfa.accepting).tolist())
  changed = True
  while changed:
    changed = False
    for state in range(dfa.num_states):
      if state not in live and any(int(t) in live for t in dfa.transitions[state] if t >= 0):
        live.add(state)
        changed = True
  assert live == set(range(dfa.num_states))


def test_empty_language_gives_zero_states():
  for node in [_regex.parse_regex(r"[^\x00-\U0010ffff]"), ir.NOTHING,
               ir.Concat((ir.Bytes(b"a"), ir.NOTHING)),
               ir.Repeat(ir.Concat((ir.Bytes(b"a"), ir.CharClass(()))), 1, None)]:
    dfa = _fsa.compile_byte_dfa(node)
    assert dfa.num_states == 0
    assert dfa.start == _byte_dfa.NO_STATE
    assert dfa.transitions.shape == (0, 256)
    assert not dfa.accepts(b"") and not dfa.accepts(b"a")
    assert _fsa.fst_to_byte_dfa(_fsa.ir_to_fst(node)).num_states == 0


def test_epsilon_only_language():
  dfa = _fsa.compile_byte_dfa(ir.EPSILON)
  assert dfa.num_states == 1 and dfa.accepts(b"") and not dfa.accepts(b"a")


@pytest.mark.parametrize("node, accepted, rejected", [
    (ir.Repeat(ir.Bytes(b"ab"), 2, 4), [b"abab", b"abababab"], [b"ab", b"ababababab"]),
    (ir.Repeat(ir.Bytes(b"a"), 3, None), [b"aaa", b"a" * 9], [b"aa"]),
    (ir.Repeat(ir.Bytes(b"a"), 0, 0), [b""], [b"a"]),
    (ir.Repeat(ir.Repeat(ir.Bytes(b"a"), 0, 1), 0, None), [b"", b"aaa"], [b"b"]),
    (ir.Repeat(ir.Union((ir.Bytes(b""), ir.Bytes(b"x"))), 2, 2), [b"", b"x", b"xx"],
     [b"xxx"]),
    (ir.byte_class([(0x80, 0xFF)]), [b"\x80", b"\xff"], [b"\x7f", b"\x80\x80"]),
    (ir.Concat((ir.ByteClass(((0, 255),)), ir.Bytes(b"!"))), [b"\x00!", b"\xff!"],
     [b"!", b"ab!"]),
    (ir.Union(()), [], [b"", b"a"]),
    (ir.Concat(()), [b""], [b"a"]),
    (ir.Union((ir.Bytes(b"a"), ir.Repeat(ir.Bytes(b"b"), 0, None))), [b"a", b"", b"bb"],
     [b"ab"]),
])
def test_ir_nodes(node, accepted, rejected):
  for dfa in (_fsa.compile_byte_dfa(node), _fsa.fst_to_byte_dfa(_fsa.ir_to_fst(node))):
    for data in accepted:
      assert dfa.accepts(data), data
    for data in rejected:
      assert not dfa.accepts(data), data


def test_ir_to_fst_labels_are_bytes_plus_one():
  fst = _fsa.ir_to_fst(ir.Concat((ir.Bytes(b"\x00a"), ir.byte_class([(0xFF, 0xFF)]))))
  labels = sorted({arc.ilabel for s in fst.states() for arc in fst.arcs(s)} - {0})
  assert labels == [1, ord("a") + 1, 256]
  assert fst.input_symbols() is None and fst.output_symbols() is None
  assert fst.verify()


def test_fst_to_byte_dfa_does_not_modify_its_input():
  fst = _fsa.ir_to_fst(_regex.parse_regex(r"a?b*"))
  before = fst.write_to_string()
  _fsa.fst_to_byte_dfa(fst)
  assert fst.write_to_string() == before


def test_fst_to_byte_dfa_accepts_fsts_built_with_pynini():
  fst = pynini.accep("ab") | pynini.accep("c").closure()
  # pynini's byte mode labels byte b as b itself; shift to b + 1 as this module expects.
  fst = fst.relabel_pairs(ipairs=[(b, b + 1) for b in b"abc"],
                          opairs=[(b, b + 1) for b in b"abc"])
  dfa = _fsa.fst_to_byte_dfa(fst)
  assert dfa.accepts(b"ab") and dfa.accepts(b"") and dfa.accepts(b"ccc")
  assert not dfa.accepts(b"abc")


def test_fst_to_byte_dfa_ignores_symbol_tables():
  symbols = pynini.SymbolTable()
  symbols.add_symbol("<eps>")
  for b in range(256):
    symbols.add_symbol(f"b{b}")
  fst = _fsa.ir_to_fst(ir.Bytes(b"hi"))
  fst.set_input_symbols(symbols)
  fst.set_output_symbols(symbols)
  dfa = _fsa.fst_to_byte_dfa(fst)
  assert dfa.accepts(b"hi") and not dfa.accepts(b"h")


def test_start_state_is_renumbered_to_zero():
  # A hand-made 3-state DFA whose start is 2: 2 -a-> 0 -b-> 1 (final).
  dfa = _fsa._dfa_from_arcs(2, np.array([False, True, False]), np.array([2, 0]),
                            np.array([ord("a") + 1, ord("b") + 1]), np.array([0, 1]),
                            _nfa.BYTE_EDGES)
  assert dfa.start == 0 and dfa.transitions.dtype == np.int32
  assert dfa.accepts(b"ab") and not dfa.accepts(b"a") and not dfa.accepts(b"b")


def test_terminal_must_be_a_token_class():
  with pytest.raises(errors.UnsupportedFeatureError,
                     match="Terminal 'QUOTED_TEXT' .* is not a token class"):
    _fsa.compile_byte_dfa(ir.Concat((ir.Bytes(b'"'), ir.Terminal("QUOTED_TEXT"))))


def test_large_unicode_classes_compile():
  dfa = _fsa.compile_byte_dfa(_regex.parse_regex(r"\w+", unicode=True))
  for text in ["héllo", "中文", "٣", "x_1"]:
    assert dfa.accepts(text.encode())
  for text in ["a b", "😀", ""]:
    assert not dfa.accepts(text.encode())
  assert dfa.num_states < 1000


def test_labels_of_all_bytes_round_trip():
  node = ir.Union(tuple(ir.Bytes(bytes([b, b])) for b in range(256)))
  dfa = _fsa.compile_byte_dfa(node)
  for b, c in itertools.product([0, 1, 127, 128, 254, 255], repeat=2):
    assert dfa.accepts(bytes([b, c])) == (b == c)
