"""JSON Schema strings: `pattern` (ECMAScript search semantics, against `re.search`),
`format` (examples, counterexamples and random walks against standard-library oracles),
and pattern, format and lengths together (against `jsonschema`).
"""

import json
import random
import re

import hypothesis
import jsonschema
import pytest

from constrained_decoding.testing import random_accepted_bytes
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _json_schema as js

from json_schema_cases import (  # pylint: disable=import-error  (same directory)
    FORMAT_ORACLES, _FORMAT_EXAMPLES, _dfa)


@pytest.mark.parametrize("pattern", [
    "ab", "^ab", "ab$", "^ab$", "a|^b|c$", "", "^", "^$", "(?i)ab", "\\d+", "^[^a]", "a.c",
    "(ab|ba)+$", "^(?:a|b)c", "\\$", "a\\$$", "x*", "[|]", "\\|a", "(a|b)|c$",
])
def test_pattern_has_search_semantics(pattern):
  dfa = compile_byte_dfa(js.pattern_ir(pattern))
  rng = random.Random(pattern)
  alphabet = "abcAB1$|x\né"
  texts = {"", "ab", "ba", "abc", "xab", "abx", "c", "b", "$", "a$", "|a"}
  texts |= {"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(300)}
  for text in texts:
    if text.endswith("\n"):
      continue  # Python's `$` also matches before a final newline; ECMAScript's does not.
    expected = re.search(pattern, text, re.ASCII) is not None
    assert dfa.accepts(text.encode()) == expected, (pattern, text)


def test_pattern_dollar_is_the_very_end():
  dfa = compile_byte_dfa(js.pattern_ir("a$"))
  assert dfa.accepts(b"xa") and not dfa.accepts(b"a\n")


def test_patterned_strings_are_canonically_escaped():
  dfa = _dfa(cd.JsonSchema({"type": "string", "pattern": '^["\\\\]+$'}))
  assert dfa.accepts(b'"\\"\\\\"')
  assert not dfa.accepts(b'"\\u0022"')


_FORMAT_NEGATIVES = {
    "duration": ["P", "PT", "P1DT", "P1Y2D", "P1.5D", "P1W2D", "PT1S2M", "1D", "P-1D", "p1d"],
    "password": [],
    "binary": [],
    "path": [],
    "date": ["2023-02-29", "1900-02-29", "2024-13-01", "2024-04-31", "0000-01-01", "2024-1-01",
             "20240101", "2024-01-01T00:00:00Z"],
    "time": ["24:00:00Z", "12:60:00Z", "12:00:60Z", "12:00:00", "12:00:00z", "12:00Z"],
    "date-time": ["2024-01-01 00:00:00Z", "2024-01-01T00:00:00", "2024-02-30T00:00:00Z"],
    "ipv4": ["256.0.0.1", "1.2.3", "01.2.3.4", "1.2.3.4.5", "1.2.3.-4"],
    "ipv6": [":::", "1:2:3:4:5:6:7:8:9", "12345::", "1::2::3", "::ffff:1.2.3.256", "g::1"],
    "uuid": ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"],
    "hostname": ["-a.com", "a-.com", "a..b", "a_b.com", ".com", "a" * 64, ""],
    "email": ["a@", "@b.com", "a..b@c.com", "a@b@c.com", "a b@c.com", ".a@b.com"],
    "uri": ["no scheme", "1http://x", "http://exa mple.com", "//x/y", "http://x/%zz"],
}


@pytest.mark.parametrize("name", sorted(js.FORMATS))
def test_formats_against_examples_and_oracles(name):
  dfa = compile_byte_dfa(js.format_ir(name))
  oracle = FORMAT_ORACLES[name]
  for text in _FORMAT_EXAMPLES.get(name, []):
    assert dfa.accepts(text.encode()), text
    assert oracle(text), text
  for text in _FORMAT_NEGATIVES[name]:
    assert not dfa.accepts(text.encode()), text
  rng = random.Random(name)
  for _ in range(60):
    text = random_accepted_bytes(dfa, rng, stop=0.1, soft_limit=120).decode()
    assert oracle(text), text


def test_format_example_lists_cover_every_format():
  assert set(FORMAT_ORACLES) == set(js.FORMATS) == set(_FORMAT_NEGATIVES)
  assert set(_FORMAT_EXAMPLES) <= set(js.FORMATS)


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 4},
    {"type": "string", "pattern": "b", "maxLength": 3},
    {"type": "string", "pattern": "(é|ab)$", "minLength": 3},
    {"type": "string", "format": "ipv4", "maxLength": 9},
    {"type": "string", "format": "date", "pattern": "-12-"},
], ids=["anchored", "search", "unicode-suffix", "format-length", "format-pattern"])
def test_string_keywords_combine_exactly(schema):
  """pattern, format and lengths together: the intersection, checked against `re.search`,
  `len` (code points) and jsonschema's format checker on many candidate strings."""
  dfa = _dfa(cd.JsonSchema(schema))
  checker = jsonschema.Draft202012Validator(
      schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
  rng = random.Random(0)
  alphabet = "abé-12.0x"
  candidates = {"".join(rng.choice(alphabet) for _ in range(rng.randrange(7)))
                for _ in range(3000)}
  candidates |= {"1.2.3.4", "10.0.0.1", "0.0.0.0", "9.9.9.99", "255.255.255.255",
                 "2024-12-01", "2024-01-12", "1999-12-31", "2000-12-12", "2024-13-01",
                 "ab", "abab", "xé", "aé", "zzzab"}
  accepted = 0
  for text in sorted(candidates):
    expected = checker.is_valid(text)
    if "format" in schema and expected:  # The checker knows these formats: be sure.
      assert schema["format"] != "date" or re.fullmatch(r"\d{4}-\d\d-\d\d", text)
    got = dfa.accepts(json.dumps(text, ensure_ascii=False).encode())
    assert got == expected, text
    accepted += got
  assert accepted >= 3  # Not vacuous.


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(text=st.text(alphabet="abcx-\u00e9", max_size=8))
def test_all_of_applies_every_pattern(text):
  schema = {"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "^[^x]*$"},
                      {"allOf": [{"pattern": "b"}, {"pattern": "a"}]}]}
  expected = all(re.search(p, text) for p in ("a", "^[^x]*$", "b"))
  assert _dfa(cd.JsonSchema(schema)).accepts(json.dumps(text, ensure_ascii=False).encode()) \
      == expected
