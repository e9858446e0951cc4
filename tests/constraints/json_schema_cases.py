"""Shared cases and oracles of the JSON Schema front-end tests (`json_schema*_test.py`;
not a test module itself).

The example schemas (`CASES`: the paper's RPG and GPQA objects, recursion, unions,
allOf, tuples, formats, patterns, numbers, constants, free-form values, drafts), the byte
DFA of a spec (`_dfa`, memoized), `jsonschema` validation with formats (`_validate`),
hypothesis strategies of instances in our generation order (`_strategy`), their
serialization under each whitespace policy (`dump`), and format oracles from the
standard library (`FORMAT_ORACLES`: `ipaddress`, `uuid`, `datetime`, RFC grammars).
"""

import datetime
import decimal
import ipaddress
import json
import math
import random
import re
import uuid

import jsonschema

from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa


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
