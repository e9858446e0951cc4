"""Tests for the shared JSON pieces (`constraints/_json_values.py`) and `cd.Json`.

Oracles: Python arithmetic for integer and number ranges (exhaustive for small
ranges, random for big and negative ones), `json.loads`/`json.dumps` for strings and
schema-free values, and counting for nesting depth and whitespace runs.
"""

import fractions
import json
import random

import hypothesis
import numpy as np
import pytest

from constrained_decoding.testing import random_accepted_bytes
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_numbers as jn
from constrained_decoding.constraints import _json_values as jv
from constrained_decoding.constraints import _regex


def accepts_many(dfa, texts) -> np.ndarray:
  """Vectorized `dfa.accepts` over many byte strings (bool per text)."""
  texts = [t.encode() if isinstance(t, str) else t for t in texts]
  if dfa.num_states == 0:
    return np.zeros(len(texts), bool)
  lengths = np.array([len(t) for t in texts])
  data = np.zeros((len(texts), max(lengths.max(), 1)), np.int64)
  for i, t in enumerate(texts):
    data[i, :len(t)] = list(t)
  state = np.full(len(texts), dfa.start, np.int64)
  for j in range(data.shape[1]):
    live = (j < lengths) & (state >= 0)
    state[live] = dfa.transitions[state[live], data[live, j]]
  return (state >= 0) & dfa.accepting[np.maximum(state, 0)]




# ---- Integer ranges. ----

_SMALL_BOUNDS = [None, -120, -100, -99, -11, -10, -9, -1, 0, 1, 9, 10, 11, 99, 100, 101, 250]


def test_integer_range_exhaustive_small():
  numbers = list(range(-400, 401))
  texts = [str(n) for n in numbers] + ["-0", "00", "007", "+5", "", "-", "1.0", "-01", "1e2"]
  for lo in _SMALL_BOUNDS:
    for hi in _SMALL_BOUNDS:
      if lo is not None and hi is not None and lo > hi:
        assert jn.integer_range(lo, hi) == ir.NOTHING
        continue
      got = accepts_many(compile_byte_dfa(jn.integer_range(lo, hi)), texts)
      expected = [(lo is None or n >= lo) and (hi is None or n <= hi) for n in numbers]
      assert got[:len(numbers)].tolist() == expected, (lo, hi)
      assert not got[len(numbers):].any(), (lo, hi)


def test_integer_range_every_pair_in_a_window():
  numbers = list(range(-25, 26))
  texts = [str(n) for n in range(-40, 41)]
  for lo in numbers:
    for hi in numbers[numbers.index(lo):]:
      got = accepts_many(compile_byte_dfa(jn.integer_range(lo, hi)), texts)
      assert got.tolist() == [lo <= n <= hi for n in range(-40, 41)], (lo, hi)


def _probes(rng, lo, hi):
  out = []
  for bound in (lo, hi):
    if bound is not None:
      out += [bound - 1, bound, bound + 1, bound + 10, bound - 10]
      out += [bound + rng.randrange(-10**6, 10**6) for _ in range(3)]
  out += [rng.randrange(-10**25, 10**25) for _ in range(10)] + [0, 1, -1]
  if lo is not None and hi is not None and lo <= hi:
    out += [rng.randint(lo, hi) for _ in range(10)]
  return out


@pytest.mark.parametrize("seed", range(4))
def test_integer_range_random_big_and_negative(seed):
  rng = random.Random(seed)
  for _ in range(12):
    digits = rng.randint(1, 22)
    lo = rng.randrange(-10**digits, 10**digits) if rng.random() < 0.85 else None
    hi = rng.randrange(-10**digits, 10**digits) if rng.random() < 0.85 else None
    if lo is not None and hi is not None and lo > hi:
      lo, hi = hi, lo
    dfa = compile_byte_dfa(jn.integer_range(lo, hi))
    probes = _probes(rng, lo, hi)
    got = accepts_many(dfa, [str(n) for n in probes])
    expected = [(lo is None or n >= lo) and (hi is None or n <= hi) for n in probes]
    assert got.tolist() == expected, (lo, hi)


def test_integer_range_unbounded_is_canonical_json_integers():
  dfa = compile_byte_dfa(jn.integer_range(None, None))
  assert accepts_many(dfa, ["0", "-1", "123456789012345678901234567890"]).all()
  assert not accepts_many(dfa, ["-0", "01", "+1", "1.0", "1e3", ""]).any()


# ---- Number ranges. ----


def _decimal_value(text: str):
  """The value of a `-?I(.F)?` text with canonical I and no negative zero, else None."""
  body = text[1:] if text.startswith("-") else text
  integer, _, fraction = body.partition(".")
  if not integer.isdigit() or (len(integer) > 1 and integer[0] == "0"):
    return None
  if "." in body and not fraction.isdigit():
    return None
  value = fractions.Fraction(text)
  if text.startswith("-") and value == 0:
    return None
  return value


_DECIMALS = [sign + str(i) + f for i in range(0, 14) for f in
             ["", ".0", ".00", ".5", ".05", ".50", ".9", ".001"] for sign in ("", "-")]
_DECIMALS += ["-0", "-0.0", "00", "1.", ".5", "1e5", "01.5", "+1", ""]


_FRACTIONAL_DECIMALS = [sign + str(i) + f for i in range(0, 5) for f in
                        ["", ".0", ".2", ".25", ".250", ".2500001", ".249", ".3", ".05",
                         ".049", ".051", ".5", ".50", ".9", ".99", ".999"]
                        for sign in ("", "-")] + ["-0", "-0.0", "0.", ".25", "1e0"]
_INTEGER_BOUNDS = [None, -10, -1, 0, 1, 3, 10]
# Fraction digits: compared digit by digit at the bound's own integer part (0.25 vs
# 0.250, 0.249, 0.2500001), on both signs.
_FRACTIONAL_BOUNDS = [None] + [fractions.Fraction(b) for b in (
    "-3.5", "-1.25", "-0.05", "0", "0.05", "0.25", "1.999", "2.5", "3")]


@pytest.mark.parametrize("lo_exclusive", [False, True])
@pytest.mark.parametrize("hi_exclusive", [False, True])
@pytest.mark.parametrize("bounds,texts", [(_INTEGER_BOUNDS, _DECIMALS),
                                          (_FRACTIONAL_BOUNDS, _FRACTIONAL_DECIMALS)],
                         ids=["integer-bounds", "fractional-bounds"])
def test_number_range_exhaustive_small(bounds, texts, lo_exclusive, hi_exclusive):
  values = [_decimal_value(t) for t in texts]
  for lo in bounds:
    for hi in bounds:
      node = jn.number_range(lo, hi, lo_exclusive=lo_exclusive, hi_exclusive=hi_exclusive)
      got = accepts_many(compile_byte_dfa(node), texts)
      expected = [v is not None
                  and (lo is None or (v > lo if lo_exclusive else v >= lo))
                  and (hi is None or (v < hi if hi_exclusive else v <= hi)) for v in values]
      assert got.tolist() == expected, (lo, hi)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    lo=st.one_of(st.none(), st.decimals(-1000, 1000, places=4)),
    hi=st.one_of(st.none(), st.decimals(-1000, 1000, places=4)),
    lo_exclusive=st.booleans(), hi_exclusive=st.booleans(),
    probes=st.lists(st.decimals(-1100, 1100, places=6), min_size=1, max_size=20))
def test_number_range_random_decimal_bounds(lo, hi, lo_exclusive, hi_exclusive, probes):
  lo = None if lo is None else fractions.Fraction(lo)
  hi = None if hi is None else fractions.Fraction(hi)
  dfa = compile_byte_dfa(jn.number_range(lo, hi, lo_exclusive=lo_exclusive,
                                         hi_exclusive=hi_exclusive))
  texts = []
  # The probes (with trailing zeros, as hypothesis writes them) and the bounds themselves,
  # each also a hair above or (by one more digit) next to it.
  for text in [format(p, "f") for p in probes] + [_fraction_text(b) for b in (lo, hi)
                                                 if b is not None]:
    texts += [text, text + "0", text + "01"] if "." in text else [text, text + ".0",
                                                                  text + ".01"]
  for text, ok in zip(texts, accepts_many(dfa, texts)):
    v = _decimal_value(text)
    expected = v is not None and (lo is None or (v > lo if lo_exclusive else v >= lo)) and (
        hi is None or (v < hi if hi_exclusive else v <= hi))
    assert ok == expected, (lo, hi, text)


def _fraction_text(x: fractions.Fraction) -> str:
  """The canonical decimal text of a finite decimal (no exponent)."""
  whole, digits = jn.decimal_digits(abs(x))
  return ("-" if x < 0 else "") + str(whole) + ("." + digits if digits else "")


def test_number_range_random_big():
  rng = random.Random(7)
  for _ in range(10):
    lo = rng.randrange(-10**12, 10**12)
    hi = lo + rng.randrange(0, 10**13)
    lo_exclusive, hi_exclusive = rng.random() < 0.5, rng.random() < 0.5
    dfa = compile_byte_dfa(jn.number_range(lo, hi, lo_exclusive=lo_exclusive,
                                           hi_exclusive=hi_exclusive))
    texts = []
    for n in _probes(rng, lo, hi):
      texts += [str(n), f"{n}.0", f"{n}.25", f"{n}.999"]
    got = accepts_many(dfa, texts)
    for text, ok in zip(texts, got):
      v = _decimal_value(text)
      expected = v is not None and (v > lo if lo_exclusive else v >= lo) and (
          v < hi if hi_exclusive else v <= hi)
      assert ok == expected, (lo, hi, text)


def test_json_number_grammar():
  dfa = compile_byte_dfa(jn.JSON_NUMBER)
  good = ["0", "-0", "12", "-12.50", "1e5", "1E+5", "-2.5e-10", "0.0", "1e400"]
  bad = ["01", "+1", ".5", "1.", "1e", "--1", "0x10", "NaN", "Infinity", "1.5e+"]
  assert accepts_many(dfa, good).all()
  assert not accepts_many(dfa, bad).any()
  for text in good:
    json.loads(text)


# ---- Strings. ----


_STRING = compile_byte_dfa(jv.json_string())


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(st.text(max_size=12), st.booleans())
def test_json_string_accepts_json_dumps(text, ensure_ascii):
  encoded = json.dumps(text, ensure_ascii=ensure_ascii)
  # ensure_ascii writes astral characters as surrogate pairs: one character each.
  lone_surrogates = any(0xD800 <= ord(c) <= 0xDFFF for c in text)
  assert _STRING.accepts(encoded.encode()) == (not lone_surrogates)


@pytest.mark.parametrize("text, accepted", [
    ('""', True), ('"a b"', True), ('"\\"\\\\\\/\\b\\f\\n\\r\\t"', True),
    ('"\\u00e9\\u00E9"', True),
    ('"é中😀"', True), ('"\\ud83d\\ude00"', True), ('"\\ud800"', False), ('"\\uDFFF"', False),
    ('"\\ude00\\ud83d"', False), ('"\\ud83d\\ud83d"', False), ('"\\uD83D\\uDE00"', True),
    ('"a\nb"', False), ('"\x00"', False), ('"a"b"', False), ('"\\x41"', False), ('"\\u12"', False),
    ('"\\', False), ('"abc', False), ("'a'", False), ('"\x7f"', True),
])
def test_json_string_table(text, accepted):
  assert _STRING.accepts(text.encode()) == accepted
  if accepted:
    json.loads(text)


@pytest.mark.parametrize("lo, hi", [(0, 0), (1, 3), (2, None), (0, 5)])
def test_json_string_lengths_count_code_points(lo, hi):
  dfa = compile_byte_dfa(jv.json_string(lo, hi))
  rng = random.Random(lo * 10 + (hi or 9))
  alphabet = ["a", "é", "中", "😀", "\\n", "\\u00e9", '\\"', "\\\\"]
  for n in range(8):
    body = "".join(rng.choice(alphabet) for _ in range(n))
    text = f'"{body}"'
    assert len(json.loads(text)) == n
    assert dfa.accepts(text.encode()) == (lo <= n and (hi is None or n <= hi)), text


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(st.text(max_size=8))
def test_canonical_encoding_of_any_text(text):
  node = jv.encode_text(ir.Bytes(text.encode()))
  assert node == ir.Bytes(json.dumps(text, ensure_ascii=False)[1:-1].encode())


def test_encode_text_of_classes_is_canonical():
  dfa = compile_byte_dfa(ir.concat(ir.Bytes(b'"'), jv.encode_text(_regex.parse_regex(r"(?s).*")),
                                   ir.Bytes(b'"')))
  for text in ["", "abc", 'a"b', "a\\b", "\n\t\x00\x1f\x7f", "é😀", "/"]:
    canonical = json.dumps(text, ensure_ascii=False)
    assert dfa.accepts(canonical.encode()), text
  for other in ['"\\u0041"', '"\\/"', '"\\u000a"', '"\\u001F"', '"\\ud83d\\ude00"', '"a\nb"']:
    assert not dfa.accepts(other.encode()), other


@pytest.mark.parametrize("keys", [["a"], ["name", "durability", "quality"], ["", "a\nb", "é"],
                                  ["ab", "a", "abc"]])
def test_string_except(keys):
  dfa = compile_byte_dfa(jv.string_except(keys))
  candidates = keys + ["b", "abd", "aa", "", "é\n", "a\nbc", "x" * 5, "nam", "names", "ab"]
  for text in candidates:
    assert dfa.accepts(json.dumps(text, ensure_ascii=False).encode()) == (text not in keys), text
  # Other spellings of an excluded key are not canonical, hence excluded too.
  assert not dfa.accepts(b'"\\u0061"')


# ---- Constants, containers and whitespace. ----


@pytest.mark.parametrize("name, expected", [
    ("compact", '{"a":[1,{"b":null}],"c":{}}'),
    ("single", '{"a": [1, {"b": null}], "c": {}}'),
])
def test_const_value_matches_json_dumps(name, expected):
  value = {"a": [1, {"b": None}], "c": {}}
  dfa = compile_byte_dfa(jv.const_value(value, jv.Whitespace(name)))
  assert dfa.accepts(expected.encode())
  assert json.loads(expected) == value
  assert not dfa.accepts(b'{"c":{},"a":[1,{"b":null}]}')


def test_const_value_flexible_whitespace_is_capped():
  dfa = compile_byte_dfa(jv.const_value({"a": [1, 2]}, jv.Whitespace("flexible", 2)))
  assert dfa.accepts(b'{ "a" :\n[1 ,\t2 ]\r\n}')
  assert dfa.accepts(b'{"a":[1,2]}')
  assert not dfa.accepts(b'{   "a":[1,2]}')
  assert not dfa.accepts(b' {"a":[1,2]}')


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {1, 2}, b"x"])
def test_const_value_rejects_non_json(value):
  with pytest.raises(ValueError, match="Expected"):
    jv.const_value(value, jv.Whitespace())


def test_whitespace_policy_errors():
  with pytest.raises(ValueError, match=r"Whitespace policy 'pretty' is not known"):
    jv.whitespace_policy("pretty")
  with pytest.raises(ValueError, match=r"max_whitespace -1 is not a non-negative int"):
    jv.whitespace_policy("flexible", -1)


# ---- Schema-free JSON (cd.Json). ----


def _depth(value) -> tuple[int, int, int]:
  """(total, object, array) nesting depth of a JSON value."""
  if isinstance(value, dict):
    inner = [_depth(v) for v in value.values()] or [(0, 0, 0)]
    return 1 + max(d[0] for d in inner), 1 + max(d[1] for d in inner), max(d[2] for d in inner)
  if isinstance(value, list):
    inner = [_depth(v) for v in value] or [(0, 0, 0)]
    return 1 + max(d[0] for d in inner), max(d[1] for d in inner), 1 + max(d[2] for d in inner)
  return 0, 0, 0


def _json_values(depth: int):
  scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                      st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4))
  if depth == 0:
    return scalars
  inner = _json_values(depth - 1)
  return st.one_of(scalars, st.lists(inner, max_size=3),
                   st.dictionaries(st.text(max_size=3), inner, max_size=3))


def _flexible_dump(value, rng, cap) -> str:
  gap = lambda: "".join(rng.choice(" \t\n\r") for _ in range(rng.randint(0, cap)))  # noqa: E731
  if isinstance(value, dict):
    if not value:
      return "{" + gap() + "}"
    members = [gap() + json.dumps(k, ensure_ascii=False) + gap() + ":" + gap()
               + _flexible_dump(v, rng, cap) + gap() for k, v in value.items()]
    return "{" + ",".join(members) + "}"
  if isinstance(value, list):
    if not value:
      return "[" + gap() + "]"
    return "[" + ",".join(gap() + _flexible_dump(v, rng, cap) + gap() for v in value) + "]"
  return json.dumps(value, ensure_ascii=False)


_JSON_DFAS = {}


def _json_dfa(spec):
  if spec not in _JSON_DFAS:
    _JSON_DFAS[spec] = compile_byte_dfa(spec.to_ir())
  return _JSON_DFAS[spec]


@hypothesis.settings(max_examples=80, deadline=None)
@hypothesis.given(_json_values(3), st.randoms(use_true_random=False))
def test_json_accepts_values_within_depth(value, rng):
  depth = _depth(value)[0]
  for name, text in [("compact", json.dumps(value, separators=(",", ":"), ensure_ascii=False)),
                     ("single", json.dumps(value, ensure_ascii=False)),
                     ("flexible", _flexible_dump(value, rng, 2))]:
    for max_depth in (2, 3):
      assert _json_dfa(cd.Json(max_depth, name)).accepts(text.encode()) == (depth <= max_depth), (
          name, text)


@pytest.mark.parametrize("spec", [
    cd.Json(2), cd.Json(3, "flexible"), cd.Json(3, "single", max_object_depth=1),
    cd.Json(3, max_array_depth=0, root="object"), cd.Json(2, root="array"), cd.Json(0),
], ids=lambda s: s.describe())
def test_json_random_walks_are_json_within_limits(spec):
  dfa = _json_dfa(spec)
  rng = random.Random(spec.describe())
  for _ in range(40):
    text = random_accepted_bytes(dfa, rng).decode()
    value = spec.parse(text)
    total, objects, arrays = _depth(value)
    assert total <= spec.max_depth
    assert objects <= (spec.max_object_depth if spec.max_object_depth is not None else 99)
    assert arrays <= (spec.max_array_depth if spec.max_array_depth is not None else 99)
    if spec.root != "any":
      assert isinstance(value, dict if spec.root == "object" else list)


def test_json_flexible_whitespace_cap():
  dfa = _json_dfa(cd.Json(2, "flexible", max_whitespace=1))
  assert dfa.accepts(b'[ 1, {"a" : 2} ]')
  assert not dfa.accepts(b'[  1]')
  assert not dfa.accepts(b' [1]')


def test_json_spec_errors_and_values():
  with pytest.raises(ValueError, match=r"Json max_depth -1 is not an int >= 0"):
    cd.Json(-1)
  with pytest.raises(ValueError, match=r"Json root 'string' is not known"):
    cd.Json(2, root="string")
  with pytest.raises(ValueError, match=r"Whitespace policy 'tabs' is not known"):
    cd.Json(2, "tabs")
  assert cd.Json(2) == cd.Json(2) and hash(cd.Json(2)) == hash(cd.Json(2))
  assert cd.Json(2).describe() == "Json(max_depth=2, whitespace='compact', root='any')"
