"""Tests for the JSON Schema front end (`constraints/_json_schema.py`, `cd.JsonSchema`).

Oracles: `jsonschema.validate` and `json.loads` for random walks through the byte DFA
(soundness); hypothesis-generated instances serialized under each whitespace policy
(completeness), also at token level with the Gemma 3 vocabulary; `re.search` for
`pattern`; the standard library (`ipaddress`, `uuid`, `datetime`) for formats; and a
table of every error path.
"""

import datetime
import decimal
import fractions
import ipaddress
import json
import math
import random
import re
import uuid

import hypothesis
import jsonschema
import numpy as np
import pytest

from constrained_decoding.testing import random_accepted_bytes
from constrained_decoding.testing import reference_accepts
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _json_schema as js
from constrained_decoding.testing import TokenIndex, reference_allowed, reference_step

POLICIES = ("compact", "single", "flexible")
FREE_FORM_DEPTH = 2  # JsonSchema's default.

RPG = {  # The paper's JSON object constraint (App. C.4.5).
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "class": {"type": "string", "enum": ["Warrior", "Rogue", "Sorceror"]},
        "life": {"type": "integer"},
        "mana": {"type": "integer"},
        "equipment": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "durability": {"type": "integer"},
                    "quality": {"type": "string", "enum": ["Normal", "Magic", "Unique"]},
                },
            },
        },
    },
}
GPQA = {  # The paper's correctness experiment (App. D).
    "type": "object",
    "properties": {"Final Answer": {"enum": ["A", "B", "C", "D"]}, "Solution": {"type": "string"}},
    "required": ["Final Answer", "Solution"],
}
TREE = {
    "$defs": {"node": {
        "type": "object",
        "properties": {"value": {"type": "integer"},
                       "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["value"], "additionalProperties": False}},
    "$ref": "#/$defs/node",
}
PERSON = {
    "$defs": {"address": {"type": "object", "title": "Address",
                          "properties": {"city": {"type": "string", "maxLength": 4},
                                         "zip": {"type": "string", "pattern": "^\\d{5}$"}},
                          "required": ["city"]}},
    "type": "object",
    "properties": {"home": {"$ref": "#/$defs/address"}, "work": {"$ref": "#/$defs/address"},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["home", "age"],
    "description": "A person.",
}
UNIONS = {
    "type": "object",
    "properties": {
        "id": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "format": "uuid"}]},
        "note": {"type": ["string", "null"], "maxLength": 5},
        "level": {"anyOf": [{"const": "low"}, {"type": "integer", "exclusiveMaximum": 3}]},
    },
    "required": ["id"],
    "additionalProperties": False,
}
ALL_OF = {
    "allOf": [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}},
         "required": ["a"]},
        {"properties": {"a": {"maximum": 9}, "b": {"type": "boolean"}}, "required": ["b"]},
    ],
}
ALL_OF_FLAT = {  # What ALL_OF means, for the instance generator.
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}},
    "required": ["a", "b"],
}
TUPLE = {
    "type": "array",
    "prefixItems": [{"type": "string", "enum": ["x", "y"]},
                    {"type": "integer", "minimum": -5, "maximum": 5}],
    "items": {"type": "boolean"},
    "minItems": 1,
    "maxItems": 4,
}
FORMATS = {
    "type": "object",
    "properties": {"when": {"type": "string", "format": "date-time"},
                   "ip": {"type": "string", "format": "ipv4"},
                   "host": {"type": "string", "format": "hostname"},
                   "mail": {"type": "string", "format": "email"},
                   "day": {"format": "date"}},
    "required": ["when", "ip"],
    "additionalProperties": False,
}
PATTERNS = {
    "type": "object",
    "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"},
                   "tag": {"type": "string", "pattern": "ab|^x"},
                   "quote": {"type": "string", "pattern": "^[\"\\\\\\n]{1,3}$"}},
    "required": ["code", "tag"],
}
NUMBERS = {
    "type": "object",
    "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1},
                   "t": {"type": "number", "exclusiveMinimum": -3, "exclusiveMaximum": 10},
                   "n": {"type": "integer", "exclusiveMinimum": -1000, "maximum": 123456},
                   "h": {"type": "integer", "minimum": 2.5},
                   "r": {"type": "number", "minimum": 0.25, "exclusiveMaximum": 2.5},
                   "q": {"type": "number", "exclusiveMinimum": -1.5, "maximum": -0.05},
                   "x": {"type": "number"}},
    "required": ["p", "t", "n", "x"],
}
CONSTANTS = {
    "type": "object",
    "properties": {"version": {"const": 2},
                   "mode": {"enum": ["a", 1, None, True, {"k": [1, 2]}, [1, "x"], 2.5]}},
    "required": ["version", "mode"],
}
FREE_FORM = {
    "type": "object",
    "properties": {"meta": {}, "list": {"type": "array", "maxItems": 2}},
    "additionalProperties": {"type": "integer"},
}
LENGTHS = {"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 4},
           "maxItems": 3}
DRAFT7 = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {"pt": {"type": "array", "items": [{"type": "number"}, {"type": "number"}],
                           "additionalItems": False, "minItems": 2}},
    "type": "object",
    "properties": {"p": {"$ref": "#/definitions/pt"}},
    "required": ["p"],
}
SCALAR = {"enum": ["a", "b", 3]}
BOOLEAN = {"type": "boolean"}

# (id, schema, schema the instance generator reads).
CASES = [
    ("rpg", RPG, RPG), ("gpqa", GPQA, GPQA), ("tree", TREE, TREE), ("person", PERSON, PERSON),
    ("unions", UNIONS, UNIONS), ("all_of", ALL_OF, ALL_OF_FLAT), ("tuple", TUPLE, TUPLE),
    ("formats", FORMATS, FORMATS), ("patterns", PATTERNS, PATTERNS),
    ("numbers", NUMBERS, NUMBERS), ("constants", CONSTANTS, CONSTANTS),
    ("free_form", FREE_FORM, FREE_FORM), ("lengths", LENGTHS, LENGTHS),
    ("draft7", DRAFT7, DRAFT7), ("scalar", SCALAR, SCALAR), ("boolean", BOOLEAN, BOOLEAN),
]

# Spec options per case: the tree is bounded here (a regular language, walked as a byte
# DFA); its unbounded push-down version is tested in json_schema_recursive_test.py.
_OPTIONS = {"tree": {"max_ref_depth": 3}}
_DFAS = {}


def _dfa(spec: cd.JsonSchema):
  if spec not in _DFAS:
    _DFAS[spec] = compile_byte_dfa(spec.to_ir())
  return _DFAS[spec]


def _validate(instance, schema):
  jsonschema.validate(instance, schema, format_checker=jsonschema.FormatChecker())


# ---- Soundness: random walks validate. ----


@pytest.mark.parametrize("strict", [False, True], ids=["extras", "strict"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name, schema, _", CASES, ids=[c[0] for c in CASES])
def test_random_walks_validate(name, schema, _, policy, strict):
  spec = cd.JsonSchema(schema, policy, strict_properties=strict, **_OPTIONS.get(name, {}))
  dfa = _dfa(spec)
  rng = random.Random(f"{name}-{policy}-{strict}")
  for _ in range(12):
    text = random_accepted_bytes(dfa, rng, soft_limit=120).decode("utf-8")
    instance = spec.parse(text)
    _validate(instance, schema)
    if policy == "compact":
      assert not _whitespace_outside_strings(text), text
    if name in ("formats",):
      _check_formats(instance, schema)


def _check_formats(instance, schema):
  for key, value in instance.items():
    assert FORMAT_ORACLES[schema["properties"][key]["format"]](value), (key, value)


# ---- Completeness: generated instances are accepted. ----


_FORMAT_EXAMPLES = {
    "duration": ["P1Y2M3DT4H5M6S", "P2W", "PT0.5S", "P1DT5.5S", "P1M", "PT1H30M", "P14D",
                 "PT0S", "P3Y6M4DT12H30M5S"],
    "password": ["", "hunter2", "é \n\"\\"],
    "binary": ["", "bytes"],
    "path": ["/tmp/x", "a/b c"],
    "date-time": ["2024-02-29T23:59:59Z", "1999-12-31T00:00:00.123+05:30",
                  "0001-01-01T00:00:00-23:59"],
    "date": ["2024-02-29", "2023-02-28", "2000-02-29", "1900-02-28", "0004-02-29", "9999-12-31"],
    "time": ["00:00:00Z", "23:59:59.5-01:00"],
    "ipv4": ["0.0.0.0", "255.255.255.255", "192.168.1.10", "10.0.0.1"],
    "ipv6": ["::", "::1", "2001:db8::ff00:42:8329", "fe80::1:2:3:4", "1:2:3:4:5:6:7:8",
             "::ffff:192.168.1.1", "1::", "1:2:3:4:5:6:7::", "ABCD:ef01::9"],
    "hostname": ["localhost", "example.com", "a-b.c-d.example.co.uk", "x1", "0.com"],
    "email": ["a@b.c", "first.last+tag@example.com", "x!#$%&'*+/=?^_`{|}~-@host"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"],
    "uri": ["https://example.com/a/b?c=d#e", "mailto:a@b.c", "urn:isbn:0451450523",
            "http://[::1]:8080/", "file:///etc/hosts", "s:", "http://user:pw@h:1/%20x"],
}


def _resolve(root, ref):
  node = root
  for token in ref[2:].split("/"):
    node = node[token]
  return node


def _strategy(schema, root, *, extras: bool, depth: int = 0):
  """Instances of the schemas of CASES in our generation order (not a general generator)."""
  if schema is True or schema == {}:
    return _free_values(FREE_FORM_DEPTH)
  if "$ref" in schema:
    return _strategy(_resolve(root, schema["$ref"]), root, extras=extras, depth=depth + 1)
  if "enum" in schema:
    return st.sampled_from(schema["enum"])
  if "const" in schema:
    return st.just(schema["const"])
  for key in ("anyOf", "oneOf"):
    if key in schema:
      return st.one_of([_strategy(s, root, extras=extras, depth=depth) for s in schema[key]])
  types = schema.get("type", "string" if "format" in schema else None)
  if isinstance(types, list):
    return st.one_of([_strategy({**schema, "type": t}, root, extras=extras, depth=depth)
                      for t in types])
  if types == "string":
    if "format" in schema:
      return st.sampled_from(_FORMAT_EXAMPLES[schema["format"]])
    if "pattern" in schema:
      pattern = schema["pattern"]
      ecma = pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern
      return st.from_regex(re.compile(schema["pattern"], re.ASCII)).filter(
          lambda s: re.search(ecma, s, re.ASCII) is not None)
    return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 5), 5))
  if types == "integer":
    lo, hi = schema.get("minimum"), schema.get("maximum")
    lo = -10**12 if lo is None else -(-lo // 1)
    hi = 10**12 if hi is None else hi
    if "exclusiveMinimum" in schema:
      lo = schema["exclusiveMinimum"] + 1
    if "exclusiveMaximum" in schema:
      hi = schema["exclusiveMaximum"] - 1
    return st.integers(int(lo), int(hi))
  if types == "number":
    if not any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
      return st.floats(allow_nan=False, allow_infinity=False) | st.integers(-10**20, 10**20)
    lo = schema.get("minimum", schema.get("exclusiveMinimum"))
    hi = schema.get("maximum", schema.get("exclusiveMaximum"))
    above, below = "exclusiveMinimum" in schema, "exclusiveMaximum" in schema
    int_lo = math.floor(lo) + 1 if above else math.ceil(lo)
    int_hi = math.ceil(hi) - 1 if below else math.floor(hi)
    integers = st.integers(int_lo, int_hi) if int_lo <= int_hi else st.nothing()
    return st.floats(lo, hi, exclude_min=above, exclude_max=below) | integers
  if types == "boolean":
    return st.booleans()
  if types == "null":
    return st.none()
  if types == "array" or "prefixItems" in schema or "items" in schema:
    return _array_strategy(schema, root, extras=extras, depth=depth)
  return _object_strategy(schema, root, extras=extras, depth=depth)


def _array_strategy(schema, root, *, extras, depth):
  prefix = schema.get("prefixItems", [])
  items = schema.get("items", True)
  if isinstance(items, list):
    prefix, items = items, schema.get("additionalItems", True)
  lo, hi = schema.get("minItems", 0), schema.get("maxItems", 3)
  if depth > 2:  # Recursive schemas: stop growing.
    hi = lo
    if hi == 0:
      return st.just([])
  prefix_strategies = [_strategy(s, root, extras=extras, depth=depth) for s in prefix]
  rest = None if items is False else _strategy(items, root, extras=extras, depth=depth)

  @st.composite
  def build(draw):
    top = min(hi, len(prefix)) if rest is None else hi
    n = draw(st.integers(lo, max(lo, top)))
    return [draw(prefix_strategies[i] if i < len(prefix) else rest) for i in range(n)]

  return build()


def _object_strategy(schema, root, *, extras, depth):
  properties = schema.get("properties", {})
  required = schema.get("required", [])
  values = {k: _strategy(s, root, extras=extras, depth=depth + 1) for k, s in properties.items()}
  additional = schema.get("additionalProperties", True)
  declares = bool(properties) or bool(required)
  if additional is False or (additional is True and not extras and declares):
    extra = None
  else:
    extra = _strategy(additional, root, extras=extras, depth=depth + 1)

  @st.composite
  def build(draw):
    out = {}
    for key, value in values.items():
      if key in required or draw(st.booleans()):
        out[key] = draw(value)
    if extra is not None:
      keys = draw(st.lists(st.text(max_size=3).filter(lambda k: k not in properties),
                           max_size=2, unique=True))
      for key in keys:
        out[key] = draw(extra)
    return out

  return build()


def _free_values(depth):
  scalars = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000),
                      st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3))
  if depth == 0:
    return scalars
  inner = _free_values(depth - 1)
  return st.one_of(scalars, st.lists(inner, max_size=2),
                   st.dictionaries(st.text(max_size=2), inner, max_size=2))


def _number_text(value) -> str:
  """Numbers as our languages write them: positional floats (bounded numbers have no
  exponent), no negative zero."""
  if isinstance(value, float):
    text = repr(0.0 if value == 0 else value)
    return format(decimal.Decimal(text), "f") if "e" in text else text
  return str(value)


def dump(value, policy: str, rng: random.Random, cap: int = 2) -> str:
  """Serializes `value` under a whitespace policy (flexible: random runs of <= cap)."""

  def gap():
    if policy != "flexible":
      return ""
    return "".join(rng.choice(" \t\n\r") for _ in range(rng.randint(0, cap)))

  def colon():
    return ": " if policy == "single" else gap() + ":" + gap()

  def comma():
    return ", " if policy == "single" else gap() + "," + gap()

  if isinstance(value, (dict, list)):
    brackets = "{}" if isinstance(value, dict) else "[]"
    if not value:
      return brackets[0] + gap() + brackets[1]
    if isinstance(value, dict):
      items = [json.dumps(k, ensure_ascii=False) + colon() + dump(v, policy, rng, cap)
               for k, v in value.items()]
    else:
      items = [dump(v, policy, rng, cap) for v in value]
    out = brackets[0] + gap() + items[0]
    for item in items[1:]:
      out += comma() + item
    return out + gap() + brackets[1]
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return _number_text(value)
  return json.dumps(value, ensure_ascii=False)


def _whitespace_outside_strings(text: str) -> bool:
  in_string = escaped = False
  for ch in text:
    if in_string:
      escaped, in_string = (not escaped and ch == "\\"), in_string and (escaped or ch != '"')
    elif ch == '"':
      in_string = True
    elif ch in " \t\n\r":
      return True
  return False


@pytest.mark.parametrize("strict", [False, True], ids=["extras", "strict"])
@pytest.mark.parametrize("name, schema, generator", CASES, ids=[c[0] for c in CASES])
def test_generated_instances_are_accepted(name, schema, generator, strict):
  specs = {p: cd.JsonSchema(schema, p, strict_properties=strict, **_OPTIONS.get(name, {}))
           for p in POLICIES}

  @hypothesis.settings(max_examples=20, deadline=None, database=None,
                       suppress_health_check=list(hypothesis.HealthCheck))
  @hypothesis.given(_strategy(generator, generator, extras=not strict),
                    st.randoms(use_true_random=False))
  def check(instance, rng):
    _validate(instance, schema)
    for policy, spec in specs.items():
      text = dump(instance, policy, rng)
      assert _dfa(spec).accepts(text.encode()), (policy, text)

  check()


def test_rpg_examples_by_hand():
  spec = cd.JsonSchema(RPG, strict_properties=True)
  dfa = _dfa(spec)
  good = ['{}', '{"name":"Ann","class":"Rogue"}',
          '{"life":-3,"equipment":[{"name":"Axe","durability":10,"quality":"Magic"},{}]}']
  bad = ['{"class":"Bard"}', '{"mana":1.5}', '{"name":"a","name":"b"}',
         '{"equipment":[{"quality":"Rare"}]}', '{"extra":1}', '{,}', '{"name":"a",}']
  assert all(dfa.accepts(t.encode()) for t in good)
  assert not any(dfa.accepts(t.encode()) for t in bad)
  # The items are small objects: any order. The top level's five members, one a nested
  # array, would exceed the any-order budget: its keys are checked in registers.
  assert dfa.accepts(b'{"equipment":[{"quality":"Magic","name":"Axe"}]}')
  assert dfa.accepts(b'{"life":1,"name":"x"}')
  assert not dfa.accepts(b'{"life":1,"name":"x","life":2}')
  assert not _dfa(cd.JsonSchema(RPG, strict_properties=True, property_order="any_bounded")
                  ).accepts(b'{"life":1,"name":"x"}')
  assert not _dfa(cd.JsonSchema(RPG, strict_properties=True, property_order="schema")).accepts(
      b'{"equipment":[{"quality":"Magic","name":"Axe"}]}')
  loose = _dfa(cd.JsonSchema(RPG))
  assert loose.accepts(b'{"name":"a","extra":[1,{"k":null}],"more":"x"}')
  assert not loose.accepts(b'{"name":"a","extra":1,"name":"b"}')  # Declared keys not repeated.
  assert not loose.accepts(b'{"n\\u0061me":1}')  # Another spelling of a declared key.


# ---- Token level, with the Gemma 3 vocabulary. ----

TOKEN_CASES = [
    ({"type": "object",
      "properties": {"answer": {"enum": ["A", "B", "C", "D"]},
                     "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
                     "sure": {"type": "boolean"}},
      "required": ["answer", "confidence"], "additionalProperties": False}, "flexible"),
    ({"type": "array", "items": {"type": "number", "minimum": -1, "maximum": 1}, "maxItems": 3},
     "single"),
    ({"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                       "n": {"type": "integer"}},
      "required": ["day"], "additionalProperties": False}, "compact"),
]


@pytest.fixture(scope="module")
def index(gemma_vocab):
  return TokenIndex(gemma_vocab)


@pytest.mark.parametrize("schema, policy", TOKEN_CASES, ids=["answer", "numbers", "date"])
def test_token_level_random_tokenizations_and_walks(schema, policy, gemma_compiler, gemma_vocab,
                                                    index):
  spec = cd.JsonSchema(schema, policy)
  tables = gemma_compiler.compile(spec)
  rng = random.Random(policy)
  eos = set(gemma_vocab.eos_ids)

  def accepted(tokens):
    return reference_accepts(tables, tokens)

  instances = _strategy(schema, schema, extras=False)

  @hypothesis.settings(max_examples=10, deadline=None, database=None,
                       suppress_health_check=list(hypothesis.HealthCheck))
  @hypothesis.given(instances)
  def completeness(instance):
    data = dump(instance, policy, rng).encode()
    for _ in range(3):
      assert accepted(index.random_tokenization(data, rng)), data
    assert not accepted(index.longest_tokenization(data[:-1]))

  completeness()
  for _ in range(5):  # Soundness: random allowed tokens until a stop in an accepting state.
    state, data = int(tables.start[0]), b""
    while True:
      allowed = [t for t in np.nonzero(reference_allowed(tables, state))[0].tolist()
                 if t not in eos]
      if tables.accepting[state] and (rng.random() < 0.3 or len(data) > 200 or not allowed):
        break
      token = rng.choice(allowed)
      data += gemma_vocab.token_bytes[token]
      state = reference_step(tables, state, token)
    _validate(json.loads(data.decode()), schema)


# ---- pattern: search semantics. ----


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


# ---- Formats. ----


def _is_hostname(text: str) -> bool:
  labels = text.split(".")
  return len(text) <= 253 and all(
      re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", label) for label in labels)


def _is_email(text: str) -> bool:
  local, _, domain = text.rpartition("@")
  atom = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
  return bool(re.fullmatch(rf"{atom}(?:\.{atom})*", local)) and _is_hostname(domain)


def _is_uri(text: str) -> bool:
  import urllib.parse  # pylint: disable=g-import-not-at-top
  scheme = urllib.parse.urlsplit(text).scheme
  allowed = re.fullmatch(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*", text)
  return bool(scheme) and bool(allowed) and text.count("#") <= 1


def _is_uuid(text: str) -> bool:
  try:
    uuid.UUID(text)
  except ValueError:
    return False
  return len(text) == 36 and all(text[i] == "-" for i in (8, 13, 18, 23))


def _oracle(parse):
  def check(text):
    try:
      parse(text)
    except ValueError:
      return False
    return True
  return check


def _is_duration(text: str) -> bool:
  """RFC 3339 Appendix A durations (plus decimal seconds), by units in sequence."""
  if not text.startswith("P") or text == "P":
    return False
  date, has_time, time = text[1:].partition("T")
  if has_time and not time:
    return False

  def units(part):
    found = re.findall(r"(\d+(?:\.\d+)?)([A-Z])", part)
    if "".join(n + u for n, u in found) != part:
      return None
    if any("." in n and u != "S" for n, u in found):
      return None
    return "".join(u for _, u in found)

  date_units, time_units = units(date), units(time)
  if date_units is None or time_units is None:
    return False
  if date_units == "W":
    return not has_time
  return (date_units in ("", "Y", "YM", "YMD", "M", "MD", "D")
          and time_units in ("", "H", "HM", "HMS", "M", "MS", "S")
          and bool(date_units or time_units))


def _any_string(text: str) -> bool:
  return isinstance(text, str)


FORMAT_ORACLES = {
    "duration": _is_duration,
    "password": _any_string,
    "binary": _any_string,
    "path": _any_string,
    "date": lambda t: _oracle(datetime.date.fromisoformat)(t) and len(t) == 10,
    "time": lambda t: _oracle(datetime.datetime.fromisoformat)("2000-01-01T" + t),
    "date-time": _oracle(datetime.datetime.fromisoformat),
    "ipv4": _oracle(ipaddress.IPv4Address),
    "ipv6": _oracle(ipaddress.IPv6Address),
    "uuid": _is_uuid,
    "hostname": _is_hostname,
    "email": _is_email,
    "uri": _is_uri,
}

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


# ---- $ref recursion bounds and allOf merging. ----


def _tree_depth(node) -> int:
  return 1 + max((_tree_depth(c) for c in node.get("children", [])), default=0)


def _tree(depth: int):
  return {"value": depth, "children": [_tree(depth - 1)] if depth > 1 else []}


@pytest.mark.parametrize("max_ref_depth", [1, 2, 3])
def test_recursive_ref_depth_bound(max_ref_depth):
  dfa = _dfa(cd.JsonSchema(TREE, max_ref_depth=max_ref_depth))
  for depth in range(1, 5):
    text = json.dumps(_tree(depth), separators=(",", ":"))
    assert dfa.accepts(text.encode()) == (depth <= max_ref_depth), (depth, text)
  rng = random.Random(max_ref_depth)
  for _ in range(20):
    assert _tree_depth(json.loads(random_accepted_bytes(dfa, rng, soft_limit=120))) <= max_ref_depth


def test_recursive_ref_in_any_of_keeps_the_base_case():
  schema = {"$defs": {"list": {"anyOf": [{"type": "null"}, {
      "type": "object",
      "properties": {"head": {"type": "integer"}, "tail": {"$ref": "#/$defs/list"}},
      "required": ["head", "tail"], "additionalProperties": False}]}}, "$ref": "#/$defs/list"}
  dfa = _dfa(cd.JsonSchema(schema, max_ref_depth=3))  # The final `null` is an expansion too.
  assert dfa.accepts(b"null") and dfa.accepts(b'{"head":1,"tail":{"head":2,"tail":null}}')
  assert not dfa.accepts(b'{"head":1,"tail":{"head":2,"tail":{"head":3,"tail":null}}}')


def test_all_of_with_ref_base_and_extension():
  schema = {"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}},
                               "required": ["id"]}},
            "allOf": [{"$ref": "#/$defs/base"},
                      {"properties": {"tag": {"enum": ["a", "b"]}}, "required": ["tag"]}]}
  dfa = _dfa(cd.JsonSchema(schema, strict_properties=True))
  assert dfa.accepts(b'{"id":1,"tag":"a"}') and dfa.accepts(b'{"tag":"a","id":1}')
  assert not dfa.accepts(b'{"id":1}') and not dfa.accepts(b'{"tag":"a"}')
  in_order = _dfa(cd.JsonSchema(schema, strict_properties=True, property_order="schema"))
  assert in_order.accepts(b'{"id":1,"tag":"a"}') and not in_order.accepts(b'{"tag":"a","id":1}')


def test_all_of_respects_each_sides_additional_properties():
  schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                       "additionalProperties": False},
                      {"properties": {"b": {"type": "integer"}}}]}
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b'{"a":1}') and dfa.accepts(b"{}")
  assert not dfa.accepts(b'{"a":1,"b":2}') and not dfa.accepts(b'{"b":2}')
  for text in (b'{"a":1}', b"{}"):
    _validate(json.loads(text), schema)


def test_all_of_intersects_types_and_bounds():
  schema = {"allOf": [{"type": ["integer", "string"], "minimum": 0},
                      {"type": "number", "maximum": 5}]}
  dfa = _dfa(cd.JsonSchema(schema))
  assert [dfa.accepts(str(n).encode()) for n in range(-2, 8)] == [0 <= n <= 5 for n in range(-2, 8)]
  assert not dfa.accepts(b'"a"') and not dfa.accepts(b"2.5")


def test_any_of_with_sibling_keywords_distributes():
  schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "additionalProperties": False, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b'{"a":1}') and dfa.accepts(b'{"b":1}') and dfa.accepts(b'{"a":1,"b":2}')
  assert not dfa.accepts(b"{}")


# ---- Errors, lenient mode and the spec. ----

ERROR_CASES = [
    ({"type": "array", "uniqueItems": True}, cd.UnsupportedSchemaError,
     r"uniqueItems at #/uniqueItems needs items with at most 8 possible values"),
    ({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
     cd.UnsupportedSchemaError, r"uniqueItems at #/properties/tags/uniqueItems needs items"),
    ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
      "uniqueItems": True}, cd.UnsupportedSchemaError, r"at most 8 possible values"),
    ({"type": "array", "prefixItems": [{"const": 1}], "items": {"type": "number"},
      "uniqueItems": True}, cd.UnsupportedSchemaError, r"prefixItems count too"),
    ({"type": "array", "uniqueItems": 1}, cd.SchemaError,
     r"uniqueItems at #/uniqueItems is 1. Expected true or false"),
    ({"type": "array", "items": {"const": 1}, "uniqueItems": True, "minItems": 2},
     cd.SchemaError, r"accepts no JSON value"),
    ({"properties": {"a/b~c": {"not": {"patternProperties": {"x": {"type": "string"}}}}}},
     cd.UnsupportedSchemaError,
     r"not at #/properties/a~1b~0c/not/patternProperties cannot be enforced exactly"),
    ({"not": {"type": "array", "uniqueItems": True}}, cd.UnsupportedSchemaError,
     r"not at #/not/uniqueItems cannot be enforced exactly: an array with a repeated"),
    ({"$defs": {"t": {"properties": {"k": {"$ref": "#/$defs/t"}}}},
      "not": {"$ref": "#/$defs/t"}},
     cd.UnsupportedSchemaError, r"it negates the recursive \$ref '#/\$defs/t'"),
    ({"not": {"enum": [[1]]}}, cd.UnsupportedSchemaError, r"excluding array values"),
    ({"type": "object", "dependentSchemas": []}, cd.SchemaError,
     r"dependentSchemas at #/dependentSchemas is \[\]. Expected an object"),
    ({"not": 3}, cd.SchemaError, r"Schema 3 at #/not is a int"),
    ({"type": "array", "contains": {}, "uniqueItems": True}, cd.UnsupportedSchemaError,
     r"contains at #/contains next to uniqueItems is not supported"),
    ({"unevaluatedProperties": False, "not": {"patternProperties": {"^a": {}}}},
     cd.UnsupportedSchemaError,
     r"unevaluatedProperties at #/unevaluatedProperties next to not or if"),
    ({"type": "integer", "multipleOf": 3.000001},
     cd.UnsupportedSchemaError, r"multipleOf 3.000001 at #/multipleOf .* too large"),
    ({"type": "integer", "multipleOf": -2}, cd.SchemaError, r"multipleOf -2 at #/multipleOf is"),
    ({"type": "object", "minProperties": 2, "patternProperties": {"^x": {}}},
     cd.UnsupportedSchemaError,
     r"minProperties 2 at #/minProperties needs 2 additional properties with distinct keys"),
    ({"type": "object", "minProperties": 65}, cd.UnsupportedSchemaError,
     r"minProperties 65 at #/minProperties .* a row keeps the hashes of at most 64 keys"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": False,
      "minProperties": 2}, cd.SchemaError, r"accepts no JSON value"),
    ({"type": "object", "maxProperties": -1}, cd.SchemaError,
     r"maxProperties -1 at #/maxProperties is not a non-negative integer"),
    ({"type": "object", "patternProperties": {c: {} for c in "abcdefg"}},
     cd.UnsupportedSchemaError,
     r"patternProperties at #/patternProperties: keys match more than 64 distinct sets"),
    ({"type": "object", "patternProperties": {f"^{i}$": {} for i in range(65)}},
     cd.UnsupportedSchemaError,
     r"patternProperties at #/patternProperties has 65 patterns. Expected at most 64"),
    ({"type": "object", "patternProperties": ["^x"]}, cd.SchemaError,
     r"patternProperties at #/patternProperties is \[\"\^x\"\]. Expected an object"),
    ({"type": "object", "patternProperties": {"(": {}}}, cd.SchemaError,
     r"pattern '\(' at #/patternProperties/\( is not a valid"),
    ({"type": "object", "propertyNames": {"$ref": "#/$defs/a"},
      "$defs": {"a": {"not": {"$ref": "#/$defs/a"}}}}, cd.UnsupportedSchemaError,
     r"refers back to itself"),
    ({"type": "object", "propertyNames": {"enum": "a"}}, cd.SchemaError,
     r"enum at #/propertyNames/enum is \"a\". Expected an array"),
    ({"allOf": [{"patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
                {"properties": {"a": {}}}]},
     cd.UnsupportedSchemaError, r"allOf at #/allOf combines patternProperties with another"),
    ({"type": "object", "required": ["Zed"], "propertyNames": {"pattern": "^[a-z]+$"}},
     cd.SchemaError, r"accepts no JSON value"),
    ({"type": "strin"}, cd.SchemaError, r"type \"strin\" at #/type is not a JSON Schema type"),
    ({"$ref": "#/$defs/missing"},
     cd.SchemaError, r"\$ref '#/\$defs/missing' at #/\$ref does not resolve"),
    ({"$ref": "http://example.com/s.json"},
     cd.UnsupportedSchemaError, r"is not a local JSON pointer"),
    ({"$ref": 3}, cd.SchemaError, r"\$ref 3 at #/\$ref is not a string"),
    ({"type": "string", "pattern": "(?=a)"}, cd.UnsupportedSchemaError,
     r"pattern '\(\?=a\)' at #/pattern cannot be compiled"),
    ({"type": "string", "pattern": "a(?<=b)"},
     cd.UnsupportedSchemaError, r"at #/pattern cannot be compiled: .*lookbehind"),
    ({"type": "string", "pattern": "a^b"},
     cd.UnsupportedSchemaError, r"\^ and \$ belong at the start and end"),
    ({"type": "string", "pattern": "(^a|b)c"}, cd.UnsupportedSchemaError, r"pattern '\(\^a\|b\)c'"),
    ({"type": "string", "pattern": "(?x)a b"}, cd.UnsupportedSchemaError, r"verbose flag"),
    ({"type": "string", "pattern": "("},
     cd.SchemaError, r"pattern '\(' at #/pattern is not a valid"),
    ({"type": "string", "pattern": 5}, cd.SchemaError, r"pattern 5 at #/pattern is not a string"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 100_000}, cd.UnsupportedSchemaError,
     r"string constraints at # \(pattern, format, lengths\) are too large to combine"),
    ({"type": "number", "minimum": 2.5, "exclusiveMaximum": 2.5}, cd.SchemaError,
     r"accepts no JSON value"),
    ({"enum": [{"a": 1}], "properties": {"a": {}}}, cd.UnsupportedSchemaError,
     r"'properties' at #/properties is combined with enum/const"),
    ({"enum": ["abc"], "maxLength": 2}, cd.SchemaError, r"accepts no JSON value"),
    ({"enum": "a"}, cd.SchemaError, r"enum at #/enum is \"a\". Expected an array"),
    ({"type": "integer", "minimum": 5, "maximum": 3}, cd.SchemaError, r"accepts no JSON value"),
    ({"enum": [1, 2], "type": "string"}, cd.SchemaError, r"accepts no JSON value"),
    (False, cd.SchemaError, r"JSON Schema false accepts no JSON value"),
    ({"type": "object", "additionalProperties": False,
      "allOf": [{"properties": {"a": {}}, "required": ["a"]}]},
     cd.SchemaError, r"accepts no JSON value"),
    ({"type": "object", "required": ["a"], "additionalProperties": False}, cd.SchemaError,
     r"accepts no JSON value"),
    ({"type": "string", "minLength": -1},
     cd.SchemaError, r"minLength -1 at #/minLength is not a non-negative"),
    ({"type": "array", "maxItems": 1.5}, cd.SchemaError, r"maxItems 1.5 at #/maxItems"),
    ({"type": "object", "required": "a"}, cd.SchemaError, r"required at #/required is \"a\""),
    ({"type": "object", "properties": [1]}, cd.SchemaError, r"properties at #/properties is \[1\]"),
    ({"properties": {"a": 5}}, cd.SchemaError, r"Schema 5 at #/properties/a is a int"),
    ({"type": "array", "prefixItems": {}}, cd.SchemaError, r"prefixItems at #/prefixItems"),
    ({"anyOf": []}, cd.SchemaError, r"anyOf at #/anyOf is \[\]. Expected a non-empty array"),
    ({"allOf": {}}, cd.SchemaError, r"allOf at #/allOf is \{\}"),
    ({"allOf": [{"pattern": "a"}, {"pattern": 5}]}, cd.SchemaError,
     r"pattern 5 at #/pattern is not a string"),
    ({"type": "string", "format": ["date"]}, cd.SchemaError,
     r"format \[\"date\"\] at #/format is not a string"),
    ({"allOf": [{"required": ["a"]}, {"required": "a"}]}, cd.SchemaError,
     r"allOf at #/allOf has 'required' values \[\"a\"\] and \"a\". Expected an array of names"),
    ({"allOf": [{"minimum": 0, "exclusiveMinimum": True},
                {"minimum": 1, "exclusiveMinimum": False}]},
     cd.UnsupportedSchemaError,
     r"allOf at #/allOf combines 'exclusiveMinimum' values true and false"),
    ({"type": "number", "exclusiveMinimum": True}, cd.SchemaError,
     r"exclusiveMinimum true at #/exclusiveMinimum has no minimum"),
    ({"type": "number", "maximum": "3"},
     cd.SchemaError, r"maximum '3' at #/maximum is not a number"),
    ({"items": [{}], "prefixItems": [{}]},
     cd.SchemaError, r"both prefixItems and array-form items"),
    ({"type": "object", "dependentRequired": {"a": "b"}}, cd.SchemaError,
     r"dependentRequired at #/dependentRequired is \{\"a\": \"b\"\}. Expected an object"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}, "minProperties": 1,
      "patternProperties": {"^x": {}}},
     cd.UnsupportedSchemaError, r"dependentRequired at #/dependentRequired next to"),
]


@pytest.mark.parametrize("schema, error, message", ERROR_CASES,
                         ids=[m[:40] for _, _, m in ERROR_CASES])
def test_error_messages(schema, error, message):
  with pytest.raises(error, match=message):
    cd.JsonSchema(schema).to_ir()


def test_bounded_recursion_without_a_base_case():
  schema = {"$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
                            "required": ["n"]}}, "$ref": "#/$defs/n"}
  with pytest.raises(cd.UnsupportedSchemaError, match=(
      r"Recursive \$ref '#/\$defs/n' has no non-recursive alternative within max_ref_depth=3")):
    cd.JsonSchema(schema, max_ref_depth=3).to_ir()


@pytest.mark.parametrize("schema, message", [
    ("{not json", r"JSON Schema text '\{not json' is not valid JSON"),
    (5, r"JSON Schema 5 is a int. Expected a dict"),
    ({"enum": [float("nan")]}, r"holds a value that is not JSON"),
    ({"enum": [{1, 2}]}, r"holds a value that is not JSON"),
])
def test_malformed_schema_values(schema, message):
  with pytest.raises(cd.SchemaError, match=message):
    cd.JsonSchema(schema)


@pytest.mark.parametrize("kwargs, message", [
    ({"whitespace": "pretty"}, r"Whitespace policy 'pretty' is not known"),
    ({"max_ref_depth": 0}, r"JsonSchema max_ref_depth 0 is not an int >= 1"),
    ({"free_form_depth": -1}, r"JsonSchema free_form_depth -1 is not an int >= 0"),
    ({"whitespace": "flexible", "max_whitespace": -2}, r"max_whitespace -2 is not a non-negative"),
])
def test_spec_argument_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    cd.JsonSchema({"type": "integer"}, **kwargs)


def test_errors_are_in_the_hierarchy():
  assert issubclass(cd.UnsupportedSchemaError, cd.UnsupportedFeatureError)
  assert issubclass(cd.SchemaError, cd.ConstraintError)


def test_lenient_mode_records_what_it_ignored():
  schema = {"type": "object", "properties": {
      "tags": {"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True},
      "p": {"type": "number", "minimum": 0.5, "maximum": 2.5},
      "s": {"type": "string", "format": "color"},
      "x": {"x-custom": 1, "type": "integer"}}, "required": ["tags", "p"]}
  spec = cd.JsonSchema(schema, lenient=True, strict_properties=True)
  assert spec.ignored_keywords() == (
      "#/properties/tags/uniqueItems", "#/properties/s/format", "#/properties/x/x-custom")
  # Unknown keywords and formats are annotations: recorded in strict mode too.
  strict = cd.JsonSchema({**schema, "properties": {**schema["properties"], "tags": {}}},
                         strict_properties=True)
  assert strict.ignored_keywords() == ("#/properties/s/format", "#/properties/x/x-custom")
  dfa = _dfa(spec)
  assert dfa.accepts(b'{"tags":["a","a"],"p":1.5}')  # uniqueItems ignored: wider.
  assert dfa.accepts(b'{"tags":[],"p":0.5}') and not dfa.accepts(b'{"tags":[],"p":0.49}')
  assert dfa.accepts(b'{"tags":[],"p":2,"s":"anything"}')
  no_op = schema["properties"]["tags"] | {"uniqueItems": False}
  assert cd.JsonSchema(no_op).ignored_keywords() == ()


def test_annotations_are_ignored_silently():
  schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "title": "T",
            "description": "d", "examples": [1], "default": 1, "$comment": "c",
            "deprecated": False, "readOnly": True, "writeOnly": False, "type": "integer"}
  spec = cd.JsonSchema(schema)
  assert spec.ignored_keywords() == ()
  assert _dfa(spec).accepts(b"-12")
  content = {"type": "string", "contentEncoding": "base64",  # Annotations since 2019-09.
             "contentMediaType": "application/json", "contentSchema": {"type": "integer"}}
  assert cd.JsonSchema(content).ignored_keywords() == ()
  assert _dfa(cd.JsonSchema(content)).accepts(b'"not base64!"')


def test_strict_properties_keeps_free_form_objects_and_explicit_schemas():
  any_object = _dfa(cd.JsonSchema({"type": "object"}, strict_properties=True))
  assert any_object.accepts(b'{"a":[1]}')
  typed = _dfa(cd.JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}},
                              "additionalProperties": {"type": "boolean"}}, strict_properties=True))
  assert typed.accepts(b'{"a":1,"b":true}') and not typed.accepts(b'{"a":1,"b":1}')


def test_whitespace_policies_on_gpqa():
  text = {"compact": '{"Final Answer":"B","Solution":"x"}',
          "single": '{"Final Answer": "B", "Solution": "x"}',
          "flexible": '{\n "Final Answer" : "B",\n "Solution":"x" }'}
  for policy in POLICIES:
    dfa = _dfa(cd.JsonSchema(GPQA, policy, strict_properties=True))
    for other, t in text.items():
      assert dfa.accepts(t.encode()) == (other == policy or policy == "flexible"), (policy, other)
  capped = _dfa(cd.JsonSchema(GPQA, "flexible", max_whitespace=1, strict_properties=True))
  assert not capped.accepts(b'{  "Final Answer":"B","Solution":"x"}')


def test_spec_is_canonical_hashable_and_parses():
  a = cd.JsonSchema(GPQA)
  b = cd.JsonSchema(json.dumps(GPQA, indent=2))
  assert a == b and hash(a) == hash(b) and a.schema == json.dumps(GPQA, separators=(",", ":"))
  assert a != cd.JsonSchema(GPQA, "single")
  assert a.schema_value == GPQA
  assert a.parse('{"Final Answer":"A","Solution":"s"}') == {"Final Answer": "A", "Solution": "s"}
  assert a.describe().startswith('JsonSchema({"type":"object","properties":')
  assert a.to_ir() is a.to_ir()  # Lowered once.


def test_compiles_through_the_compiler(byte_compiler):
  tables = byte_compiler.compile(cd.JsonSchema({"type": "array", "items": {"type": "boolean"},
                                                "maxItems": 2}))
  assert int(np.asarray(tables.accepting).sum()) >= 1


def test_pydantic_model_through_its_json_schema():
  pydantic = pytest.importorskip("pydantic")
  import enum  # pylint: disable=g-import-not-at-top
  import typing  # pylint: disable=g-import-not-at-top

  class Quality(enum.Enum):
    NORMAL = "Normal"
    MAGIC = "Magic"

  class Item(pydantic.BaseModel):
    name: str
    durability: int = pydantic.Field(ge=0, le=100)
    quality: Quality
    note: typing.Optional[str] = None

  class Character(pydantic.BaseModel):
    name: str
    items: list[Item]

  spec = cd.JsonSchema(Character, strict_properties=True)
  dfa = _dfa(spec)
  rng = random.Random(0)
  for _ in range(20):
    text = random_accepted_bytes(dfa, rng, soft_limit=120).decode()
    Character.model_validate_json(text)
  example = Character(name="A", items=[Item(name="x", durability=3, quality=Quality.MAGIC)])
  assert dfa.accepts(example.model_dump_json().encode())


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


@pytest.mark.parametrize("schema", [
    {"type": "integer", "multipleOf": 5},
    {"type": "integer", "multipleOf": 2.5, "minimum": -20, "maximum": 20},
    {"type": "number", "multipleOf": 0.25, "exclusiveMinimum": -1, "maximum": 2.5},
    {"type": "number", "multipleOf": 0.01},
    {"type": "number", "multipleOf": 1.5, "minimum": 0.5},
    {"allOf": [{"type": "integer", "multipleOf": 4}, {"multipleOf": 6}]},
], ids=["int-5", "int-2.5-bounded", "quarter-bounded", "cents", "1.5-min", "allOf-lcm"])
def test_multiple_of_against_jsonschema(schema):
  """Every decimal text in a grid of candidates: accepted exactly when it is in the
  generated number format, jsonschema validates the rest of the schema, and the value
  is a multiple of every step (exact fractions: float `%` is not)."""
  dfa = _dfa(cd.JsonSchema(schema))
  parts = [schema, *schema.get("allOf", [])]
  steps = [fractions.Fraction(str(p["multipleOf"])) for p in parts if "multipleOf" in p]
  strip = lambda p: {k: v for k, v in p.items() if k != "multipleOf"}  # pylint: disable=unnecessary-lambda-assignment
  rest = strip(schema) | ({"allOf": [strip(p) for p in schema["allOf"]]}
                          if "allOf" in schema else {})
  validator = jsonschema.Draft202012Validator(rest)
  integer = any(p.get("type") == "integer" for p in parts)
  candidates = set()
  for whole in range(-25, 26):
    for fraction in ("", ".0", ".00", ".01", ".1", ".25", ".5", ".50", ".75", ".125", ".3"):
      candidates.add(f"{whole}{fraction}")
  candidates |= {"-0", "-0.0", "1e2", "007", "0.250", "-0.25", "-0.5"}
  accepted = 0
  for text in sorted(candidates):
    canonical = bool(re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?", text)) and not re.fullmatch(
        r"-0(\.0*)?", text) and not (integer and "." in text)  # Integers: no fraction.
    expected = canonical and validator.is_valid(int(text) if integer else float(text)) and all(
        (fractions.Fraction(text) / step).denominator == 1 for step in steps)
    assert dfa.accepts(text.encode()) == expected, text
    accepted += expected
  assert accepted >= 5


def test_multiple_of_errors():
  with pytest.raises(cd.SchemaError, match=r"multipleOf 0 at #/multipleOf is not positive"):
    cd.JsonSchema({"type": "number", "multipleOf": 0}).to_ir()
  with pytest.raises(cd.UnsupportedSchemaError, match=r"multipleOf 123457 at #/multipleOf"):
    cd.JsonSchema({"type": "integer", "multipleOf": 123457}).to_ir()


# ---- propertyNames and patternProperties. ----

_NAMED = {"type": "object", "properties": {"id": {"type": "integer"}, "Zed": {"type": "null"}},
          "propertyNames": {"pattern": "^[a-z]", "maxLength": 4}}
_PATTERNED = {"type": "object", "properties": {"ab": {"type": "integer", "minimum": 5},
                                               "az": {"type": "integer"}},
              "patternProperties": {"^a[a-c]*x?$": {"type": "integer", "maximum": 9}},
              "additionalProperties": False}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("schema", [_NAMED, _PATTERNED], ids=["names", "patterned"])
def test_key_constraints_random_walks_validate(schema, policy):
  dfa = _dfa(cd.JsonSchema(schema, policy))
  rng = random.Random(policy)
  for _ in range(30):
    _validate(json.loads(random_accepted_bytes(dfa, rng, soft_limit=100)), schema)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(key=st.one_of(st.text(max_size=6),
                                st.sampled_from(["id", "Zed", "ab", "az", "a", "abx", "ax"])),
                  value=st.sampled_from([1, 7, 12, -3, "s", None]))
def test_key_constraints_agree_with_jsonschema(key, value):
  # One property, so no narrowing applies (order, extras after declared): accepted
  # exactly when valid.
  for schema in (_NAMED, _PATTERNED):
    instance = {key: value}
    text = json.dumps(instance, ensure_ascii=False, separators=(",", ":")).encode()
    valid = jsonschema.Draft202012Validator(schema).is_valid(instance)
    if not key.isascii():
      try:
        key.encode()
      except UnicodeEncodeError:
        valid = False  # Lone surrogates are not text: never generated.
    assert _dfa(cd.JsonSchema(schema)).accepts(text) == valid, (schema, instance)


def test_pattern_properties_narrowing_and_pydantic_dicts():
  import pydantic  # pylint: disable=import-outside-toplevel
  import typing  # pylint: disable=import-outside-toplevel

  class Model(pydantic.BaseModel):
    labels: dict[typing.Literal["x", "y"], int]
    words: dict[pydantic.constr(pattern=r"^[a-z]+$"), str]

  schema = Model.model_json_schema()
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b'{"labels":{"x":1,"y":2},"words":{"cat":"a"}}')
  assert not dfa.accepts(b'{"labels":{"z":1},"words":{}}')  # propertyNames: exact.
  # A key matching no pattern is valid (additionalProperties defaults to true) but not
  # generated: the documented narrowing.
  assert jsonschema.Draft202012Validator(schema).is_valid({"labels": {}, "words": {"Cat": 1}})
  assert not dfa.accepts(b'{"labels":{},"words":{"Cat":1}}')
  rng = random.Random(0)
  for _ in range(30):
    Model.model_validate_json(random_accepted_bytes(dfa, rng, soft_limit=80))


def test_key_constraints_in_lenient_mode():
  schema = {"type": "object", "patternProperties": {c: {} for c in "abcdefg"},
            "propertyNames": {"pattern": "^[xy]", "x-note": 1}}
  spec = cd.JsonSchema(schema, lenient=True)
  assert spec.ignored_keywords() == ("#/propertyNames/x-note", "#/patternProperties")
  dfa = _dfa(spec)
  assert dfa.accepts(b'{"x1":[],"y":{}}') and not dfa.accepts(b'{"z":1}')


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(text=st.text(alphabet="abcx-\u00e9", max_size=8))
def test_all_of_applies_every_pattern(text):
  schema = {"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "^[^x]*$"},
                      {"allOf": [{"pattern": "b"}, {"pattern": "a"}]}]}
  expected = all(re.search(p, text) for p in ("a", "^[^x]*$", "b"))
  assert _dfa(cd.JsonSchema(schema)).accepts(json.dumps(text, ensure_ascii=False).encode()) \
      == expected


_ENUM_VALUES = st.one_of(st.integers(-20, 20),
                         st.sampled_from([0.5, 2.5, 1.25, -0.75, 3.0, 0.3, 1.1]),
                         st.text(alphabet="ab\u00e9-", max_size=4), st.booleans(), st.none())


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(values=st.lists(_ENUM_VALUES, min_size=1, max_size=6, unique_by=json.dumps),
                  keywords=st.sampled_from([
                      {"minLength": 2, "pattern": "a"}, {"maxLength": 1, "format": "date"},
                      {"minimum": 0, "exclusiveMaximum": 2.5},
                      {"multipleOf": 0.25, "maximum": 3}, {"type": "number", "minimum": 1},
                      {"exclusiveMinimum": -1, "maxLength": 3, "pattern": "^[ab]"}]))
def test_enum_is_filtered_by_string_and_number_keywords(values, keywords):
  schema = {"enum": values, **keywords}
  validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
  valid = [v for v in values if validator.is_valid(v)]
  if not valid:
    with pytest.raises(cd.SchemaError, match="accepts no JSON value"):
      cd.JsonSchema(schema).to_ir()
    return
  dfa = _dfa(cd.JsonSchema(schema))
  valid_texts = {json.dumps(v) for v in valid}  # Not `in`: True == 1 in Python.
  for v in values:
    text = json.dumps(v, ensure_ascii=False).encode()
    assert dfa.accepts(text) == (json.dumps(v) in valid_texts), (schema, v)


# ---- uniqueItems over a few values. ----

_UNIQUE_ITEMS = [
    {"enum": ["red", "green", "blue"]},
    {"type": "boolean"},
    {"type": "integer", "minimum": 1, "maximum": 3},
    {"enum": [1, 1.5, None, "1", [1, 2], {"a": [True]}]},
]


@pytest.mark.parametrize("policy", ["compact", "single"])
@pytest.mark.parametrize("bounds", [{}, {"minItems": 1, "maxItems": 2}], ids=["any", "1-2"])
@pytest.mark.parametrize("items", _UNIQUE_ITEMS, ids=range(len(_UNIQUE_ITEMS)))
def test_unique_items_walks_validate(items, bounds, policy):
  schema = {"type": "array", "items": items, "uniqueItems": True, **bounds}
  dfa = _dfa(cd.JsonSchema(schema, policy))
  rng = random.Random(f"{policy}{bounds}")
  seen = set()
  for _ in range(40):
    text = random_accepted_bytes(dfa, rng, soft_limit=80)
    _validate(json.loads(text), schema)
    seen.add(len(json.loads(text)))
  assert len(seen) > 1  # Arrays of several sizes: not vacuous.


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(data=st.data())
def test_unique_items_agree_with_jsonschema(data):
  items = data.draw(st.sampled_from(_UNIQUE_ITEMS))
  values = [json.loads(t) for t in ('"red"', '"green"', '"blue"', "true", "false", "1",
                                    "2", "3", "1.5", "null", '"1"', "[1,2]", '{"a":[true]}')]
  array = data.draw(st.lists(st.sampled_from(values), max_size=5))
  schema = {"type": "array", "items": items, "uniqueItems": True, "maxItems": 4}
  text = json.dumps(array, ensure_ascii=False, separators=(",", ":")).encode()
  valid = jsonschema.Draft202012Validator(schema).is_valid(array)
  assert _dfa(cd.JsonSchema(schema)).accepts(text) == valid, (items, array)


def test_unique_items_merge_under_all_of_and_lenient():
  schema = {"allOf": [{"type": "array", "items": {"type": "boolean"}},
                      {"uniqueItems": True}, {"uniqueItems": False}]}
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b"[true,false]") and not dfa.accepts(b"[true,true]")
  lenient = cd.JsonSchema(
      {"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True}, lenient=True)
  assert lenient.ignored_keywords() == ("#/uniqueItems",)
  assert _dfa(lenient).accepts(b'["a","a"]')  # Ignored: wider, as documented.


# ---- minProperties and maxProperties. ----

_COUNTED = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "null"},
                                             "c": {"const": "c"}},
            "required": ["b"], "additionalProperties": {"type": "boolean"}}


@pytest.mark.parametrize("policy", ["compact", "flexible"])
@pytest.mark.parametrize("bounds", [{"minProperties": 2}, {"maxProperties": 2},
                                    {"minProperties": 3, "maxProperties": 4},
                                    {"maxProperties": 0}], ids=["min", "max", "both", "zero"])
def test_property_counts_walks_validate(bounds, policy):
  schema = {**_COUNTED, **bounds}
  if bounds == {"maxProperties": 0}:  # "b" is required: nothing fits.
    with pytest.raises(cd.SchemaError, match="accepts no JSON value"):
      cd.JsonSchema(schema, policy).to_ir()
    return
  dfa = _dfa(cd.JsonSchema(schema, policy))
  rng = random.Random(policy)
  sizes = set()
  for _ in range(40):  # Repeated extra keys collapse when parsed: still valid.
    instance = json.loads(random_accepted_bytes(dfa, rng, soft_limit=100))
    _validate(instance, schema)
    sizes.add(len(instance))
  assert len(sizes) > 1


def test_repeated_additional_keys_do_not_count_towards_min_properties():
  # One possible extra key: walks repeat it often, and a parser keeps one.
  schema = {"type": "object", "properties": {"a": {"type": "null"}},
            "propertyNames": {"enum": ["a", "x"]}, "additionalProperties": {"type": "boolean"},
            "minProperties": 2, "maxProperties": 3}
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b'{"a":null,"x":true}') and not dfa.accepts(b'{"x":true,"x":false}')
  rng = random.Random(0)
  for _ in range(60):
    _validate(json.loads(random_accepted_bytes(dfa, rng, soft_limit=60)), schema)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(declared=st.lists(st.sampled_from("abc"), unique=True),
                  extras=st.lists(st.sampled_from(["x", "y", "zz"]), unique=True, max_size=3),
                  lo=st.integers(0, 4), hi=st.integers(0, 5))
def test_property_counts_agree_with_jsonschema(declared, extras, lo, hi):
  schema = {**_COUNTED, "minProperties": lo, "maxProperties": hi}
  values = {"a": 1, "b": None, "c": "c"}
  instance = {k: values[k] for k in "abc" if k in declared} | {k: True for k in extras}
  text = json.dumps(instance, separators=(",", ":")).encode()
  valid = jsonschema.Draft202012Validator(schema).is_valid(instance)
  # The documented narrowing: towards minProperties one additional property counts.
  generated = valid and len(declared) + min(len(extras), 1) >= lo
  try:
    dfa = _dfa(cd.JsonSchema(schema))
  except cd.UnsupportedSchemaError:
    assert lo > 3 + 1  # More than the declared properties and one extra.
    return
  except cd.SchemaError:
    assert not generated
    return
  assert dfa.accepts(text) == generated, (schema, instance)


def test_pydantic_discriminated_union():
  import pydantic  # pylint: disable=import-outside-toplevel
  import typing  # pylint: disable=import-outside-toplevel

  class Cat(pydantic.BaseModel):
    kind: typing.Literal["cat"]
    lives: int

  class Dog(pydantic.BaseModel):
    kind: typing.Literal["dog"]
    bark: str

  class Owner(pydantic.BaseModel):
    pet: typing.Union[Cat, Dog] = pydantic.Field(discriminator="kind")

  schema = Owner.model_json_schema()
  assert "discriminator" in schema["properties"]["pet"]
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b'{"pet":{"kind":"cat","lives":9}}')
  assert not dfa.accepts(b'{"pet":{"kind":"cat","bark":"woof"}}')
  rng = random.Random(0)
  for _ in range(30):
    Owner.model_validate_json(random_accepted_bytes(dfa, rng, soft_limit=60))


# ---- Annotations, drafts and unevaluated* (issue "JSON Schema semantics"). ----

# Keywords seen in real schemas that assert nothing here (draft-04 `id`, OpenAPI and
# Kubernetes extensions, hyper-schema links, misspellings): the spec makes them annotations.
UNKNOWN_KEYWORDS = ["name", "self", "links", "readonly", "example", "javaType",
                    "x-kubernetes-int-or-string", "x-nullable", "decsription", "nullable"]


@pytest.mark.parametrize("keyword", UNKNOWN_KEYWORDS)
def test_unknown_keywords_are_ignored_and_listed(keyword):
  schema = {"type": "object", "id": "http://example.com/a",
            "properties": {"n": {"type": "integer", keyword: {"any": ["thing"]}}},
            "required": ["n"], "additionalProperties": False}
  spec = cd.JsonSchema(schema)
  assert spec.ignored_keywords() == (f"#/properties/n/{keyword}",)
  dfa = _dfa(spec)
  assert dfa.accepts(b'{"n":12}') and not dfa.accepts(b'{"n":"x"}')


def test_unknown_formats_are_annotations_and_known_ones_stay_enforced():
  spec = cd.JsonSchema({"type": "object", "properties": {
      "c": {"type": "string", "format": "color"}, "d": {"type": "string", "format": "date"}},
      "additionalProperties": False})
  assert spec.ignored_keywords() == ("#/properties/c/format",)
  dfa = _dfa(spec)
  assert dfa.accepts(b'{"c":"anything at all","d":"2024-02-29"}')
  assert not dfa.accepts(b'{"d":"2023-02-29"}')


@pytest.mark.parametrize("schema", [
    {"type": "integer", "if": {"minimum": 3}},  # `if` alone asserts nothing.
    {"type": "integer", "then": {"minimum": 3}, "else": {"maximum": 0}},  # No `if`.
    {"type": "array", "minContains": 2, "maxContains": 3},  # No `contains`.
])
def test_keywords_without_their_partner_have_no_effect(schema):
  spec = cd.JsonSchema(schema)
  language = (b"[]", b"[1,2]") if schema["type"] == "array" else (b"1", b"7", b"-2")
  dfa = _dfa(spec)
  assert all(dfa.accepts(text) for text in language)


UNEVALUATED_CASES = [
    # (schema, accepted, rejected): checked against jsonschema too.
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "unevaluatedProperties": False},
     ['{"a":1}', "{}"], ['{"a":1,"b":2}', '{"b":2}']),
    ({"allOf": [{"properties": {"a": {"type": "integer"}}}],
      "properties": {"b": {"type": "string"}}, "unevaluatedProperties": False},
     ['{"a":1,"b":"x"}', '{"a":1}'], ['{"a":1,"c":2}']),
    ({"$defs": {"base": {"type": "object", "properties": {"a": {"type": "integer"}}}},
      "$ref": "#/$defs/base", "unevaluatedProperties": {"type": "string"}},
     ['{"a":1,"z":"s"}'], ['{"a":1,"z":2}']),
    ({"anyOf": [{"properties": {"kind": {"const": 1}, "a": {"type": "integer"}},
                 "required": ["kind"]},
                {"properties": {"kind": {"const": 2}, "b": {"type": "integer"}},
                 "required": ["kind"]}],
      "unevaluatedProperties": False},
     ['{"kind":1,"a":1}', '{"kind":2,"b":2}'], ['{"kind":1,"b":1}', '{"kind":1,"c":0}']),
    ({"type": "object", "additionalProperties": True, "unevaluatedProperties": False},
     ['{"x":1}'], []),
    ({"type": "array", "prefixItems": [{"type": "string"}], "unevaluatedItems": False},
     ['["a"]', "[]"], ['["a",1]']),
    ({"type": "array", "items": {"type": "integer"}, "unevaluatedItems": False},
     ["[1,2]"], []),
    ({"allOf": [{"prefixItems": [{"type": "string"}]}], "unevaluatedItems": {"type": "integer"}},
     ['["a",1,2]'], ['["a","b"]']),
]


@pytest.mark.parametrize("schema", [
    # Overlapping alternatives whose evaluated properties depend on a nested anyOf
    # (exact ones: json_unevaluated_regions_test.py).
    {"anyOf": [{"anyOf": [{"required": ["a"]}, {"properties": {"c": {}}}]},
               {"properties": {"b": {"const": 2}}}],
     "unevaluatedProperties": False},
    # A negated `if` whose violations are not expressible (exact `not`/`if` branches:
    # json_unevaluated_regions_test.py).
    {"if": {"patternProperties": {"^a": {"type": "string"}}}, "then": {"required": ["b"]},
     "unevaluatedProperties": False},
    {"allOf": [{"not": {"required": ["a"]}}], "unevaluatedProperties": False},
    # Items evaluated through a nested anyOf (exact next to contains, not, if and flat
    # alternatives: json_unevaluated_items_test.py).
    {"anyOf": [{"anyOf": [{"prefixItems": [True]}, {"minItems": 2}]},
               {"prefixItems": [True, True]}],
     "unevaluatedItems": False},
])
def test_unevaluated_keywords_refused_where_inexact(schema):
  with pytest.raises(cd.UnsupportedSchemaError, match=r"unevaluated(Properties|Items) at #/"):
    cd.JsonSchema(schema).to_ir()


@pytest.mark.parametrize("schema, accepted, rejected", UNEVALUATED_CASES)
def test_unevaluated_keywords_match_jsonschema(schema, accepted, rejected):
  validator = jsonschema.Draft202012Validator(schema)
  dfa = _dfa(cd.JsonSchema(schema))
  for text in accepted:
    assert validator.is_valid(json.loads(text)) and dfa.accepts(text.encode()), text
  for text in rejected:
    assert not validator.is_valid(json.loads(text)) and not dfa.accepts(text.encode()), text
  rng = random.Random(json.dumps(schema))
  for _ in range(40):
    text = random_accepted_bytes(dfa, rng, soft_limit=80).decode()
    assert validator.is_valid(json.loads(text)), text


# ---- Property order and dependentRequired. ----

ORDER_CASES = [
    # (schema, texts), every text checked against jsonschema and the automaton.
    ({"type": "object", "properties": {"radius": {"type": "number"},
                                       "shape": {"enum": ["circle", "square"]}},
      "required": ["shape", "radius"]},
     ['{"shape":"circle","radius":5}', '{"radius":5,"shape":"circle"}',
      '{"$schema":"x","radius":5,"shape":"circle"}', '{"radius":5,"shape":"circle","$schema":"x"}',
      '{"radius":5}', '{"shape":"circle"}', '{"shape":"circle","radius":"5"}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                       "c": {"type": "boolean"}},
      "additionalProperties": False},
     ["{}", '{"c":true,"a":1}', '{"b":"x","c":false,"a":2}', '{"a":1,"z":1}', '{"c":1}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "dependentRequired": {"a": ["b"], "b": ["c"]}},
     ['{"a":1}', '{"a":1,"b":2}', '{"c":0,"a":1,"b":2}', '{"b":2,"c":3}', '{"c":3}', "{}",
      '{"x":[],"a":1,"c":1,"b":1}']),
    ({"type": "object", "dependencies": {"credit": ["billing"]},  # Draft-07 spelling.
      "properties": {"credit": {"type": "integer"}, "billing": {"type": "string"}}},
     ['{"credit":1}', '{"billing":"x","credit":1}', '{"billing":"x"}']),
    ({"allOf": [{"dependentRequired": {"a": ["b"]}}, {"dependentRequired": {"a": ["c"]}}]},
     ['{"a":1,"b":1}', '{"a":1,"c":1,"b":1}', '{"b":1}']),
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("schema, texts", ORDER_CASES)
def test_any_property_order_matches_jsonschema(schema, texts, policy):
  draft = jsonschema.Draft7Validator if "dependencies" in schema else jsonschema.Draft202012Validator
  validator = draft(schema)
  spec = cd.JsonSchema(schema, policy)
  dfa = _dfa(spec)
  for text in texts:
    value = json.loads(text)
    dumped = json.dumps(value, separators=(",", ":")) if policy == "compact" else json.dumps(value)
    assert dfa.accepts(dumped.encode()) == validator.is_valid(value), dumped
  rng = random.Random(f"order-{policy}")
  for _ in range(40):
    text = random_accepted_bytes(dfa, rng, soft_limit=80).decode()
    value = json.loads(text)
    assert validator.is_valid(value), text


def test_any_order_never_repeats_a_declared_key():
  spec = cd.JsonSchema({"type": "object", "properties": {"a": {"type": "integer"},
                                                          "b": {"type": "integer"}}})
  dfa = _dfa(spec)
  assert dfa.accepts(b'{"b":1,"a":2}') and dfa.accepts(b'{"x":0,"b":1,"a":2,"y":3}')
  # Additional members between declared ones: a documented narrowing (cost, see
  # _json_objects.py), valid but not accepted.
  assert not dfa.accepts(b'{"b":1,"x":0,"a":2}')
  assert not dfa.accepts(b'{"a":1,"b":2,"a":3}') and not dfa.accepts(b'{"b":1,"b":2}')


def test_large_objects_check_keys_in_registers_or_keep_schema_order(caplog):
  properties = {f"p{i}": {"type": "integer"} for i in range(20)}
  spec = cd.JsonSchema({"type": "object", "properties": properties})
  with caplog.at_level("INFO"):
    dfa = compile_byte_dfa(spec.to_ir())
  assert "checks its 20 keys on the device" in caplog.text
  # Any order, each key at most once, additional members anywhere.
  assert dfa.accepts(b'{"p0":1,"p19":2}') and dfa.accepts(b'{"p19":2,"p0":1}')
  assert dfa.accepts(b'{"p19":2,"x":0,"p0":1}')
  assert not dfa.accepts(b'{"p19":2,"p0":1,"p19":3}')
  bounded = cd.JsonSchema({"type": "object", "properties": properties},
                          property_order="any_bounded")
  with caplog.at_level("INFO"):
    dfa = compile_byte_dfa(bounded.to_ir())
  assert not len(dfa.marker_arcs)
  assert dfa.accepts(b'{"p0":1,"p19":2}') and not dfa.accepts(b'{"p19":2,"p0":1}')
  assert "keeps schema order" in caplog.text
  with pytest.raises(cd.UnsupportedSchemaError, match=r"dependentRequired at #/dependentRequired"):
    cd.JsonSchema({"type": "object", "properties": properties,
                   "dependentRequired": {"p0": ["p1"]}}).to_ir()


def test_property_order_option_is_checked():
  with pytest.raises(ValueError, match=r"property_order is 'sorted'"):
    cd.JsonSchema({}, property_order="sorted")


# ---- References: anchors, embedded resources, drafts. ----

REF_CASES = [
    # (schema, accepted, rejected)
    ({"$defs": {"x": {"$anchor": "pos", "type": "integer", "minimum": 1}}, "$ref": "#pos"},
     ["5"], ["0", '"a"']),
    ({"$id": "http://example.com/root.json", "$defs": {"x": {"type": "integer"}},
      "$ref": "http://example.com/root.json#/$defs/x"}, ["5"], ['"a"']),
    ({"$id": "http://example.com/a/root.json",
      "$defs": {"int": {"$id": "int.json", "type": "integer"},
                "deep": {"$id": "sub/deep.json", "$defs": {"s": {"type": "string"}},
                         "$ref": "#/$defs/s"}},
      "properties": {"i": {"$ref": "int.json"}, "d": {"$ref": "sub/deep.json"},
                     "e": {"$ref": "http://example.com/a/sub/deep.json#/$defs/s"}},
      "type": "object"},
     ['{"i":1,"d":"x","e":"y"}'], ['{"i":"1"}', '{"d":1}', '{"e":1}']),
    ({"$schema": "http://json-schema.org/draft-07/schema#",
      "definitions": {"x": {"type": "integer"}}, "$ref": "#/definitions/x", "maximum": 3},
     ["5", "2"], ['"a"']),  # Draft 7: $ref overrides its siblings.
    ({"definitions": {"x": {"type": "integer"}}, "$ref": "#/definitions/x", "maximum": 3},
     ["2"], ["5"]),  # 2020-12: siblings apply too.
]


@pytest.mark.parametrize("schema, accepted, rejected", REF_CASES)
def test_references_resolve_as_the_specification_says(schema, accepted, rejected):
  draft = (jsonschema.Draft7Validator if "draft-07" in schema.get("$schema", "")
           else jsonschema.Draft202012Validator)
  validator = draft(schema)
  dfa = _dfa(cd.JsonSchema(schema))
  for text in accepted:
    assert validator.is_valid(json.loads(text)) and dfa.accepts(text.encode()), text
  for text in rejected:
    assert not validator.is_valid(json.loads(text)) and not dfa.accepts(text.encode()), text


def test_recursive_ref_resolves_statically_in_one_resource():
  vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                         eos_ids=[256])
  schema = {"$recursiveAnchor": True, "type": "object",
            "properties": {"k": {"$recursiveRef": "#"}}, "additionalProperties": False}
  tables = cd.Compiler(vocab).compile(cd.JsonSchema(schema))
  assert reference_accepts(tables, list(b'{"k":{"k":{}}}'))
  assert not reference_accepts(tables, list(b'{"k":{"j":{}}}'))
  # Another resource with the anchor, never entered: lowered per dynamic scope, where
  # the root (without $id) is the target on every path, for jsonschema too.
  other = {**schema, "$defs": {"o": {"$id": "other.json", "$recursiveAnchor": True}}}
  tables = cd.Compiler(vocab).compile(cd.JsonSchema(other))
  assert reference_accepts(tables, list(b'{"k":{"k":{}}}'))
  assert not reference_accepts(tables, list(b'{"k":{"j":{}}}'))
  assert jsonschema.Draft201909Validator(other).is_valid({"k": {"k": {}}})
  assert not jsonschema.Draft201909Validator(other).is_valid({"k": {"j": {}}})


PATTERN_CASES = [
    # Overlapping patterns: a key matching both needs both schemas.
    ({"type": "object", "patternProperties": {"a*": {"type": "integer"},
                                              "aaa*": {"maximum": 20}}},
     ['{"a":21}', '{"aaaa":18}', '{"b":1}', '{"aaaa":31}', '{"aaa":"x"}']),
    ({"type": "object", "patternProperties": {"^x-": {"type": "string"}, "^[a-z]+$": {}},
      "properties": {"id": {"type": "integer"}}, "additionalProperties": False},
     ['{"id":1,"x-a":"s"}', '{"x-a":1}', '{"abc":[1]}', '{"ABC":1}', '{"id":"1"}']),
]


@pytest.mark.parametrize("schema, texts", PATTERN_CASES)
def test_several_pattern_properties_match_jsonschema(schema, texts):
  # Valid keys that match no pattern are not generated (a documented narrowing), so
  # acceptance implies validity; on these texts, validity implies acceptance too.
  validator = jsonschema.Draft202012Validator(schema)
  dfa = _dfa(cd.JsonSchema(schema))
  for text in texts:
    value = json.loads(text)
    matched = all(any(re.search(p, k) for p in schema["patternProperties"])
                  or k in schema.get("properties", {}) for k in value)
    assert dfa.accepts(text.encode()) == (validator.is_valid(value) and matched), text
  rng = random.Random(json.dumps(schema))
  for _ in range(40):
    text = random_accepted_bytes(dfa, rng, soft_limit=60).decode()
    assert validator.is_valid(json.loads(text)), text


@pytest.mark.parametrize("schema", [
    {"minLength": 2}, {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"minimum": 3, "maxItems": 1}, {"not": {"type": "string"}, "maxLength": 1},
])
def test_implied_types_off_follows_the_specification(schema):
  validator = jsonschema.Draft202012Validator(schema)
  exact = _dfa(cd.JsonSchema(schema, implied_types=False))
  implied = _dfa(cd.JsonSchema(schema))
  for value in [12, -1, 3.5, "x", "xyz", None, True, [], [1, 2], {}, {"a": 1}, {"a": "1"}]:
    text = json.dumps(value, separators=(",", ":")).encode()
    assert exact.accepts(text) == validator.is_valid(value), text
    assert not implied.accepts(text) or validator.is_valid(value), text


@pytest.mark.parametrize("schema, message", [
    ({"type": "string", "maxLength": 10**9},
     r"maxLength 1000000000 at #/maxLength needs an automaton of more than 100000 states"),
    ({"type": "array", "minItems": 200_000}, r"minItems 200000 at #/minItems needs"),
    ({"enum": list(range(30_000))}, r"enum at #/enum has 30000 values; expected at most 20000"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(5_001)}},
     r"The object at # declares 5001 properties; expected at most 5000"),
])
def test_size_limits_raise_before_building(schema, message):
  with pytest.raises(cd.CompileBudgetError, match=message):
    cd.JsonSchema(schema).to_ir()


def test_deep_schemas_raise_a_budget_error():
  schema = {"type": "integer"}
  for _ in range(1000):
    schema = {"type": "array", "items": schema}
  with pytest.raises(cd.CompileBudgetError, match=r"nested too deeply for Python to walk"):
    cd.JsonSchema(schema).to_ir()
  with pytest.raises(cd.GrammarError, match=r"nests groups too deeply for the parser"):
    cd.Grammar("root ::= " + "(" * 600 + '"a"' + ")" * 600).grammar_ir()
  with pytest.raises(cd.CompileBudgetError, match=r"Grammar rule 'root' would expand"):
    cd.Grammar('root ::= "a"{100000000}').grammar_ir()


@pytest.mark.parametrize("other", [
    {"properties": {"a": {"type": "integer"}}},
    {"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
])
def test_all_of_with_patterns_that_constrain_nothing(other):
  # OpenAPI 3.1 mixes `specification-extensions` ({"^x-": true}) into its objects.
  schema = {"type": "object", "allOf": [{"patternProperties": {"^x-": True}}, other]}
  dfa = _dfa(cd.JsonSchema(schema))
  for value in ({}, {"a": 1}, {"a": "1"}, {"x-b": [1]}, {"a": 2, "x-b": {}}, {"b": None}):
    text = json.dumps(value, separators=(",", ":")).encode()
    expected = jsonschema.Draft202012Validator(schema).is_valid(value)
    assert dfa.accepts(text) == expected, value


def test_lenient_names_the_keywords_it_ignores():
  schema = {"type": "object", "properties": {
      "tags": {"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True},
      "n": {"type": "integer", "not": {"patternProperties": {"^a": {"type": "string"}}}}}}
  with pytest.raises(cd.UnsupportedSchemaError, match=r'lenient=\("uniqueItems",\)'):
    cd.JsonSchema({"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True}).to_ir()
  only_unique = cd.JsonSchema(schema, lenient=["uniqueItems"])
  assert only_unique.lenient == ("uniqueItems",)
  with pytest.raises(cd.UnsupportedSchemaError, match=r"not at #/properties/n/not"):
    only_unique.to_ir()  # `not` of patternProperties is still refused.
  both = cd.JsonSchema(schema, lenient=("uniqueItems", "not"))
  assert set(both.ignored_keywords()) == {"#/properties/tags/uniqueItems",
                                          "#/properties/n/not"}
  assert "lenient=('not', 'uniqueItems')" in both.describe()
  dfa = _dfa(cd.JsonSchema({"type": "array", "items": {"enum": ["a", "b"]},
                            "uniqueItems": True, "maxItems": 3}, lenient=("uniqueItems",)))
  assert not dfa.accepts(b'["a","a"]')  # Enforced where it can be: nothing ignored.
  for bad in ("uniqueItems", [1], [""]):
    with pytest.raises(cd.SchemaError, match="Expected True, False, or a collection"):
      cd.JsonSchema(schema, lenient=bad)


def test_many_pattern_properties_split_into_the_regions_keys_fall_in():
  """Eight patterns, some overlapping: a key matching several takes all their schemas;
  random texts validate and hand-picked instances agree with jsonschema."""
  patterns = {"^a": {"type": "integer"}, "^b": {"type": "string"}, "^c": {"type": "boolean"},
              "^d": {"type": "null"}, "x$": {"type": "integer", "minimum": 3},
              "^e": {}, "^f": {"type": "integer"}, "^g": {"enum": [1, "g"]}}
  schema = {"type": "object", "patternProperties": patterns, "additionalProperties": False}
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  rng = random.Random(8)
  for _ in range(40):
    _validate(json.loads(random_accepted_bytes(dfa, rng, soft_limit=60)), schema)
  for instance in [{"ax": 5}, {"ax": 1}, {"ax": "s"}, {"bx": 4}, {"b": "s"}, {"zx": 4},
                   {"zx": 2}, {"g": "g"}, {"gx": 3}, {"gx": 1}, {"q": 1}, {"e": [1]}]:
    text = json.dumps(instance, separators=(",", ":")).encode()
    assert dfa.accepts(text) == jsonschema.Draft202012Validator(schema).is_valid(instance), text
