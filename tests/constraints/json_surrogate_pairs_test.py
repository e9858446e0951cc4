"""Surrogate pair escapes (`"\\ud83d\\ude00"`) in JSON strings.

A high surrogate escape followed by a low one is one character, its code point above
U+FFFF, as `json.loads` reads it and as `json.dumps` writes astral characters by default.
Accepted wherever a string's spelling is free (`jv.STRING_CHAR`: `{"type": "string"}`,
`minLength`/`maxLength` counting the pair as one character, free-form values and keys);
a lone surrogate escape never (not a Unicode scalar value, though RFC 8259's grammar and
`json.loads` take it). Strings written canonically (patterns, formats, enum/const,
declared keys, distinct string items) take astral characters as UTF-8 only. Oracles:
`json.loads` + `jsonschema`, on random astral strings in both spellings and random
tokenizations (byte vocabulary; Gemma 3 for the counted chain).
"""

import json
import random

import hypothesis
from hypothesis import strategies as st
import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding.testing import TokenIndex
from constrained_decoding.testing import reference_accepts

_PAIR = "\\ud83d\\ude00"  # U+1F600 as `json.dumps` writes it.

# (text, whether `{"type": "string"}` accepts it).
_SYNTAX = [
    (f'"{_PAIR}"', True),
    ('"\\uD83D\\uDE00"', True),                  # Upper-case hex.
    ('"\\uD800\\uDC00"', True),                  # U+10000, the first astral one.
    ('"\\uDBFF\\uDFFF"', True),                  # U+10FFFF, the last.
    (f'"a{_PAIR}b{_PAIR}"', True),
    ('"\\ud83d"', False),                        # Lone high surrogate.
    ('"\\ude00"', False),                        # Lone low surrogate.
    ('"\\ude00\\ud83d"', False),                 # Low then high.
    ('"\\ud83d\\ud83d"', False),                 # Two highs.
    ('"\\ud83dx\\ude00"', False),                # Something in between.
    ('"\\ud83d\\u0041"', False),                 # High, then no low.
    ('"\\ud83d\\ude0"', False),                  # Cut short.
]


@pytest.mark.parametrize("text, accepted", _SYNTAX)
def test_plain_strings_take_pairs_and_never_lone_surrogates(text, accepted, byte_compiler):
  tables = byte_compiler.compile(cd.JsonSchema({"type": "string"}))
  assert reference_accepts(tables, list(text.encode())) == accepted
  try:
    value = json.loads(text)  # Python reads lone surrogates too (as lone surrogates).
  except json.JSONDecodeError:
    assert not accepted
    return
  assert accepted == all(not 0xD800 <= ord(c) <= 0xDFFF for c in value)


def test_a_lone_surrogate_is_a_documented_narrowing(byte_compiler):
  """`jsonschema` accepts a lone surrogate (a one-character str): refused here, as no
  Unicode text (nor UTF-8) holds one."""
  schema = {"type": "string", "maxLength": 1}
  assert jsonschema.Draft202012Validator(schema).is_valid(json.loads('"\\ud83d"'))
  tables = byte_compiler.compile(cd.JsonSchema(schema))
  assert not reference_accepts(tables, list(b'"\\ud83d"'))


_ASTRAL = st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF)
_TEXT = st.text(st.one_of(_ASTRAL, st.characters(max_codepoint=0xFFFF,
                                                 blacklist_categories=("Cs",))),
                max_size=8)


def _spellings(value: str) -> list[bytes]:
  """The value as `json.dumps` writes it by default (pairs) and with UTF-8."""
  return [json.dumps(value).encode(), json.dumps(value, ensure_ascii=False).encode()]


@pytest.mark.parametrize("bounds", [(0, None), (2, 4), (0, 3), (5, None)])
def test_lengths_count_a_pair_as_one_character(bounds, byte_compiler):
  low, high = bounds
  schema = {"type": "string", "minLength": low}
  if high is not None:
    schema["maxLength"] = high
  tables = byte_compiler.compile(cd.JsonSchema(schema))
  validator = jsonschema.Draft202012Validator(schema)

  @hypothesis.settings(max_examples=60, deadline=None, database=None)
  @hypothesis.given(_TEXT)
  def check(value):
    for text in _spellings(value):
      assert json.loads(text) == value
      assert reference_accepts(tables, list(text)) == validator.is_valid(value), text

  check()  # pylint: disable=no-value-for-parameter


def test_counted_chain_with_random_gemma_tokenizations(gemma_compiler, gemma_vocab):
  """The counted chain (`automata/_counting.py`) decodes a pair split anywhere by tokens."""
  schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 40}},
            "required": ["s"], "additionalProperties": False}
  tables = gemma_compiler.compile(cd.JsonSchema(schema))
  validator = jsonschema.Draft202012Validator(schema)
  index = TokenIndex(gemma_vocab)
  rng = random.Random("pairs")
  astral = [chr(c) for c in (0x1F600, 0x1F680, 0x10000, 0x10FFFF, 0x20BB7, 0x1D11E)]
  for size in (1, 2, 13, 20, 39, 40, 41, 45):
    value = "".join(rng.choice(astral + list("ab é\"\\")) for _ in range(size))
    for ensure_ascii in (True, False):
      text = json.dumps({"s": value}, ensure_ascii=ensure_ascii, separators=(",", ":"))
      for _ in range(3):
        tokens = index.random_tokenization(text.encode(), rng)
        assert reference_accepts(tables, tokens) == validator.is_valid({"s": value}), text


def test_free_form_values_and_keys_take_pairs(byte_compiler):
  tables = byte_compiler.compile(cd.JsonSchema({"type": "object"}))
  text = json.dumps({"k😀": ["x😀", {"😀": "😀"}]}, separators=(",", ":"))
  assert _PAIR in text
  assert reference_accepts(tables, list(text.encode()))


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^.$"},
    {"type": "string", "pattern": "^[^a]$"},
    {"enum": ["😀", "a"]},
    {"const": "😀"},
    {"type": "object", "properties": {"😀": {"type": "integer"}}, "required": ["😀"],
     "additionalProperties": False},
])
def test_canonical_strings_take_astral_characters_as_utf8_only(schema, byte_compiler):
  """Patterned strings, constants and declared keys are written one way per value
  (`json.dumps(ensure_ascii=False)`): the pair spelling is a documented narrowing."""
  value = {"😀": 1} if schema.get("type") == "object" else "😀"
  assert jsonschema.Draft202012Validator(schema).is_valid(value)
  tables = byte_compiler.compile(cd.JsonSchema(schema))
  utf8, pairs = (json.dumps(value, ensure_ascii=e, separators=(",", ":")).encode()
                 for e in (False, True))
  assert reference_accepts(tables, list(utf8))
  assert not reference_accepts(tables, list(pairs))


def test_distinct_string_items_see_one_spelling_per_value(byte_compiler):
  """Distinct strings are compared by spelling on the device, so their items are written
  canonically: `["😀", "\\ud83d\\ude00"]` (the same string twice) is never accepted."""
  schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
  tables = byte_compiler.compile(cd.JsonSchema(schema))
  validator = jsonschema.Draft202012Validator(schema)
  for text in ['["😀","\\ud83d\\ude00"]', '["\\ud83d\\ude00","\\ud83d\\ude00"]',
               '["😀","😀"]', '["😀","a"]']:
    accepted = reference_accepts(tables, list(text.encode()))
    assert not accepted or validator.is_valid(json.loads(text)), text
  assert reference_accepts(tables, list('["😀","a"]'.encode()))


@pytest.mark.parametrize("text, accepted", [
    ('{"😀":1}', True),
    ('{"\\ud83d\\ude00":"x"}', False),          # The declared key, spelled with a pair.
    ('{"😀":1,"a\\ud83d\\ude00":"x"}', True),    # An additional key, out of the trie.
    ('{"\\ud83d\\ude01":"x"}', False),          # Narrowed: where a declared key goes on.
    ('{"😁":"x"}', True),
])
def test_additional_keys_never_spell_a_declared_key(text, accepted, byte_compiler):
  schema = {"type": "object", "properties": {"😀": {"type": "integer"}}}
  tables = byte_compiler.compile(cd.JsonSchema(schema))
  assert reference_accepts(tables, list(text.encode())) == accepted
  if accepted:
    assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
