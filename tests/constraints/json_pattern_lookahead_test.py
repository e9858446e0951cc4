"""Lookaheads right after `^` in JSON Schema `pattern`s (`_json_formats.pattern_ir`).

Patterns from public schemas (AWS CloudFormation, SAM) exclude prefixes with `^(?!X)`;
they are lowered exactly, as intersections with (complements of) automata.

Oracles: `re.search` (and `jsonschema`, which uses it) on the JSON texts of many strings,
checked against the byte DFA of the whole `cd.JsonSchema` and, for a few patterns, the
compiled byte-vocabulary tables. Alphabets hold no newline: Python's `$` also matches
before a final newline, ECMAScript's (and the lowering's) does not.
"""

import functools
import json
import random
import re

import hypothesis
import jsonschema
import pytest
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _intersect
from constrained_decoding.testing import _reference as ref

# (pattern, alphabet, pieces that random texts start with or contain).
_CASES = [
    ("^(?!aurora).*$", "aurorx-", ["aurora", "auror", "aurora-mysql"]),
    ("^(?!aws:).+$", "aws:x", ["aws:", "aws", "aw:"]),
    ("^(?!^AWS::Serverless).*", "AWS:erl", ["AWS::Serverless", "AWS::Serverles", "AWS::S3"]),
    ("^(?!arn:[a-zA-Z0-9-]+:lambda:::awslayer:)", "arn:-9lmbdwsyeZ",
     ["arn:aws:lambda:::awslayer:", "arn::lambda:::awslayer:", "arn:a-9:lambda:::awslaye"]),
    ("^(?=.*[a-z])(?!.*--)[a-z-]+$", "ab-9", ["--", "a-b", "-"]),
    ("^(?!a$)", "ab", ["a"]),
    ("^(?=a|b$)x*", "abx", ["a", "b"]),
    ("^(?!(?=a)ab)", "abc", ["ab", "a"]),
    ("x|^(?!ab)b", "abx", ["ab", "b"]),
    ("(?i)^(?!ab)[a-z]", "abAB", ["ab", "Ab", "aB"]),
    ("\\A(?=ab)a", "ab", ["ab"]),
    ("^(?!a$|b)c?", "abc", ["a", "b", "c"]),
    ("^(?=a)(?=.b)(?!..c)", "abc", ["ab", "abc"]),
    ("^(?!é)[^b]{1,3}$", "éab\u4e2d", ["é"]),
    ("^(?![0-9]+$)[a-z0-9]{2,}$", "a19z", ["12", "1a"]),
]
_DFAS = {}


def _schema_dfa(schema: dict):
  key = json.dumps(schema, sort_keys=True)
  if key not in _DFAS:
    _DFAS[key] = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  return _DFAS[key]


def _string_accepted(pattern: str, text: str) -> bool:
  dfa = _schema_dfa({"type": "string", "pattern": pattern})
  return dfa.accepts(json.dumps(text, ensure_ascii=False).encode())


def _texts(alphabet: str, pieces: list[str]):
  plain = st.text(alphabet, max_size=10)
  return st.one_of(plain, st.builds(lambda p, s: p + s, st.sampled_from(pieces), plain),
                   st.builds(lambda a, p, s: a + p + s, plain, st.sampled_from(pieces), plain))


@pytest.mark.parametrize("pattern, alphabet, pieces", _CASES)
def test_lookahead_strings_match_re_search(pattern, alphabet, pieces):
  seen = set()

  @hypothesis.settings(max_examples=150, deadline=None, derandomize=True,
                       suppress_health_check=list(hypothesis.HealthCheck))
  @hypothesis.given(_texts(alphabet, pieces))
  def check(text):
    expected = re.search(pattern, text) is not None
    assert _string_accepted(pattern, text) == expected, (pattern, text, expected)
    seen.add(expected)

  check()
  for piece in pieces + [""]:
    for text in (piece, piece + alphabet[0], alphabet[-1] + piece):
      assert _string_accepted(pattern, text) == (re.search(pattern, text) is not None), text
      seen.add(re.search(pattern, text) is not None)
  assert seen == {True, False}  # The oracle saw both sides.


@pytest.mark.parametrize("pattern, text, expected", [
    ("^(?!aurora).*$", "aurora-mysql", False),
    ("^(?!aurora).*$", "mysql", True),
    ("^(?!aurora).*$", "auror", True),
    ("^(?!aws:).+$", "aws:cloudformation:stack-name", False),
    ("^(?!aws:).+$", "", False),
    ("^(?!aws:).+$", "Environment", True),
    ("^(?!^AWS::Serverless).*", "AWS::Serverless::Function", False),
    ("^(?!^AWS::Serverless).*", "AWS::S3::Bucket", True),
    ("^(?!arn:[a-zA-Z0-9-]+:lambda:::awslayer:)",
     "arn:aws:lambda:::awslayer:AWSLambda-Python37-SciPy1x", False),
    ("^(?!arn:[a-zA-Z0-9-]+:lambda:::awslayer:)",
     "arn:aws:lambda:us-east-1:123456789012:layer:my-layer:1", True),
])
def test_cloudformation_examples(pattern, text, expected):
  assert (re.search(pattern, text) is not None) == expected  # The oracle agrees.
  assert _string_accepted(pattern, text) == expected


@pytest.mark.parametrize("pattern, low, high, heads, letters", [
    ("^(?!aws:)[a-z:]+$", 2, 6, ["aws:", "aw", "a:", ""], "aws:b"),
    ("^(?=.*[0-9])(?!.*--)[a-z0-9-]*$", 0, 5, ["1", "a--", "-1", ""], "a19-"),
])
def test_compiled_tables_match_jsonschema(pattern, low, high, heads, letters, byte_compiler,
                                          byte_vocab):
  # Copied from json_string_lengths_test: the compiled tables on random tokenizations.
  schema = {"type": "string", "pattern": pattern, "minLength": low, "maxLength": high}
  tables = byte_compiler.compile(cd.JsonSchema(schema))
  validator = jsonschema.Draft202012Validator(schema)
  index = ref.TokenIndex(byte_vocab)
  rng = random.Random(pattern)
  accepted = 0
  for _ in range(200):
    value = rng.choice(heads) + "".join(rng.choice(letters) for _ in range(rng.randint(0, 5)))
    tokens = index.random_tokenization(json.dumps(value, ensure_ascii=False).encode(), rng)
    valid = validator.is_valid(value)
    assert ref.reference_accepts(tables, tokens) == valid, (value, valid)
    accepted += valid
  assert 10 <= accepted <= 190


_OBJECT = {
    "type": "object",
    "properties": {"aws:x": {"type": "string"}, "name": {"type": "string"}},
    "patternProperties": {"^(?!aws:)[a-z:]+$": {"type": "integer"}, "^aws:": {"type": "boolean"}},
    "additionalProperties": False,
}


@hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
@hypothesis.given(st.dictionaries(
    st.one_of(st.sampled_from(["aws:x", "name", "aws:", "aw", "aws:y", "x", "A"]),
              st.text("aws:", min_size=1, max_size=6)),
    st.sampled_from([1, "s", True]), max_size=3))
def test_pattern_properties_with_a_lookahead_key(instance):
  dfa = _schema_dfa(_OBJECT)
  expected = jsonschema.Draft202012Validator(_OBJECT).is_valid(instance)
  text = json.dumps(instance, ensure_ascii=False, separators=(",", ":")).encode()
  assert dfa.accepts(text) == expected, (instance, expected)


def test_pattern_properties_with_a_lookahead_key_examples():
  dfa = _schema_dfa(_OBJECT)
  for instance, expected in [({"ab": 1}, True), ({"aws:b": 1}, False), ({"aws:b": True}, True),
                             ({"aws:x": "q"}, False), ({"a:b": 2}, True), ({"A": 1}, False)]:
    assert jsonschema.Draft202012Validator(_OBJECT).is_valid(instance) == expected
    assert dfa.accepts(json.dumps(instance, separators=(",", ":")).encode()) == expected


def test_property_names_and_not_with_a_lookahead():
  names = _schema_dfa({"type": "object", "propertyNames": {"pattern": "^(?!x-)"}})
  assert names.accepts(b'{"a":1,"y-":2}') and not names.accepts(b'{"x-a":1}')
  negated = _schema_dfa({"type": "string", "not": {"pattern": "^(?!a)"}})
  assert negated.accepts(b'"ab"') and not negated.accepts(b'"ba"') and not negated.accepts(b'""')


@pytest.mark.parametrize("pattern, construct, position", [
    ("^(?<!a)b", "negative lookbehind", 1),
    ("a(?<=a)", "lookbehind", 1),
    ("^(?<=a+)b", "lookbehind", 1),  # Variable width: only `re.compile` rejects it.
    ("^a(?!b)", "negative lookahead", 2),
    ("(?!a)b", "negative lookahead", 0),
    ("^(?=a(?=b))", "lookahead", 5),
    ("x|^(?:(?!a))", "negative lookahead", 6),
])
def test_other_lookarounds_are_refused(pattern, construct, position):
  with pytest.raises(errors.UnsupportedSchemaError) as info:
    cd.JsonSchema({"type": "string", "pattern": pattern}).to_ir()
  message = str(info.value)
  assert f"uses a {construct} at position {position}" in message
  assert "right after the start anchor" in message and "#/pattern" in message


def test_invalid_lookahead_is_a_schema_error():
  with pytest.raises(errors.SchemaError, match="not a valid regular expression"):
    cd.JsonSchema({"type": "string", "pattern": "^(?!a"}).to_ir()


def test_a_lookahead_too_large_is_refused_with_its_pointer(monkeypatch):
  # `.*a.{17}` needs 2^18 subsets, past the complement's 100000-state budget; a budget
  # of 200 states gives the same error fast.
  monkeypatch.setattr(_intersect, "complement_text",
                      functools.partial(_intersect.complement_text, max_states=200))
  schema = {"type": "object", "properties": {"k": {"type": "string", "pattern": "^(?!.*a.{17})"}}}
  with pytest.raises(errors.UnsupportedSchemaError, match="more than 200 states") as info:
    cd.JsonSchema(schema).to_ir()
  assert "#/properties/k/pattern" in str(info.value) and "^(?!.*a.{17})" in str(info.value)
