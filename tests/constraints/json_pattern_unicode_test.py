"""ECMAScript Unicode property escapes in JSON Schema patterns (`\\p{L}`, `\\P{Nd}`, ...).

`_regex_classes.expand_property_escapes` writes each escape as the class of the code points
whose `unicodedata.category` is in the General_Category; the oracles are
`unicodedata.category` itself over sampled code points (every range boundary of the
class and random ones) and, where installed, the `regex` package's own `\\p{...}` on
characters assigned since Unicode 6 (both agree on them whatever their Unicode versions).
"""

import functools
import json
import random
import unicodedata

import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _regex_classes

_GROUPS = {"L": "Lu Ll Lt Lm Lo", "Letter": "Lu Ll Lt Lm Lo", "Lu": "Lu",
           "Uppercase_Letter": "Lu", "Nd": "Nd", "gc=Nd": "Nd", "N": "Nd Nl No",
           "P": "Pc Pd Ps Pe Pi Pf Po", "Zs": "Zs", "General_Category=Sm": "Sm",
           "LC": "Lu Ll Lt", "Mn": "Mn", "C": "Cc Cf Co Cn"}
# Characters assigned long ago (Latin, Greek, Cyrillic, Arabic, CJK, digits, punctuation,
# symbols, marks): every Unicode version agrees on their categories.
_OLD = "aZéßǅΣωЖж٣٠中日あ0९_-—«».,;!?+×∑$€ ́\u00a0 \u2028\t~^`"


@functools.cache
def _dfa(pattern: str):
  return compile_byte_dfa(cd.JsonSchema({"type": "string", "pattern": pattern}).to_ir())


def _accepts(pattern: str, text: str) -> bool:
  return _dfa(pattern).accepts(json.dumps(text, ensure_ascii=False).encode())


def _samples(ranges, seed: int) -> list[int]:
  rng = random.Random(seed)
  points = {c for lo, hi in ranges[:200] for c in (lo - 1, lo, hi, hi + 1)}
  points |= {rng.randrange(0x110000) for _ in range(300)}
  points |= {rng.randrange(0x3000) for _ in range(300)}
  return sorted(c for c in points if 0x20 <= c <= 0x10FFFF and not 0xD800 <= c <= 0xDFFF
                and c not in (0x22, 0x5C))


@pytest.mark.parametrize("name", sorted(_GROUPS))
def test_property_classes_follow_unicodedata(name):
  categories = set(_GROUPS[name].split())
  ranges = _regex_classes.property_ranges(name)
  pattern, negated = f"^\\p{{{name}}}$", f"^\\P{{{name}}}$"
  for c in _samples(ranges, hash(name) % 1000):
    inside = unicodedata.category(chr(c)) in categories
    assert _accepts(pattern, chr(c)) == inside, (name, hex(c))
    assert _accepts(negated, chr(c)) == (not inside), (name, hex(c))


def test_property_escapes_inside_classes_and_sequences():
  cases = [  # (pattern, accepted, rejected)
      ("^[\\p{Lu}\\d_]+$", ["ABC_1", "ΣΩ9"], ["aB", "١", "A-"]),
      ("^[^\\p{L}\\s]+$", ["12-!", "١٢"], ["a1", "1 2", "ж"]),
      ("^[\\P{L}a]+$", ["a1-", "a"], ["ab", "é"]),
      ("^\\p{Lu}\\p{Ll}*$", ["Ωmega", "A"], ["omega", "AB", ""]),
      ("\\p{Nd}", ["x٣y", "9"], ["abc", "Ⅻ"]),
      ("^\\p{L}+$|^\\p{N}+$", ["abc", "123", "Ⅻ"], ["a1", ""]),
      ("^\\\\p{L}$", ["\\p{L}"], ["a"]),  # An escaped backslash: no property.
  ]
  for pattern, accepted, rejected in cases:
    for text in accepted:
      assert _accepts(pattern, text), (pattern, text)
    for text in rejected:
      assert not _accepts(pattern, text), (pattern, text)


def test_agrees_with_the_regex_package():
  regex = pytest.importorskip("regex")
  for name in ("L", "Lu", "Ll", "N", "Nd", "P", "S", "Z", "M", "Letter", "Punctuation"):
    for text in _OLD:
      expected = regex.fullmatch(f"\\p{{{name}}}", text) is not None
      assert _accepts(f"^\\p{{{name}}}$", text) == expected, (name, text)
      assert _accepts(f"^\\P{{{name}}}$", text) == (not expected), (name, text)


def test_pattern_properties_with_a_property_escape():
  schema = {"type": "object", "patternProperties": {"^\\p{Lu}": {"type": "integer"},
                                                    "^\\p{Ll}": {"type": "string"}},
            "additionalProperties": False}
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())

  def valid(instance: dict) -> bool:  # The schema, read with `unicodedata`.
    kinds = {"Lu": int, "Ll": str}
    return all(type(v) is kinds.get(unicodedata.category(k[0]) if k else "", type(None))
               for k, v in instance.items())

  instances = [{"Ab": 1}, {"ab": "x"}, {"Ab": "x"}, {"ab": 1}, {"Ωx": 2, "ωx": "y"},
               {"1": 1}, {}, {"Ωx": 2.5}, {"ǅ": 1}, {"Жж": 3, "1": "a"}]
  for instance in instances:
    text = json.dumps(instance, ensure_ascii=False, separators=(",", ":")).encode()
    assert dfa.accepts(text) == valid(instance), instance


@pytest.mark.parametrize("pattern, error", [
    ("\\p{Script=Greek}", errors.UnsupportedSchemaError),
    ("\\p{Alphabetic}", errors.UnsupportedSchemaError),
    ("(?i)\\p{Lu}", errors.UnsupportedSchemaError),
    ("\\p{Cs}", errors.UnsupportedSchemaError),
    ("\\p{Foo=Bar}", errors.SchemaError),
])
def test_refused_properties_name_the_escape(pattern, error):
  escape = pattern[pattern.index("\\p"):]
  with pytest.raises(error, match="pattern") as raised:
    cd.JsonSchema({"type": "string", "pattern": pattern}).to_ir()
  assert "at #/pattern" in str(raised.value) and escape in str(raised.value)
