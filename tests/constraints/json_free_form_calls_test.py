"""Push-down tables (`JsonSchema(free_form_depth=None)`) against `jsonschema`.

With `free_form_depth=None` every free-form value calls one shared JSON rule, and the
schema compiles to push-down tables with counted chains (`automata/_pda_chains.py`:
`maxLength` strings, `format` parts, bounded pattern repeats read by counting
terminals, some with a bias) and any-order objects checked in registers. These tests
exercise all of them in one schema at a time, mostly with the byte vocabulary:
  - random instances (strings around their length bounds, with escapes and multi-byte
    characters; UUIDs and hex codes one character off; free-form values 0-30 levels
    deep; keys in random order, some missing or unknown) must be accepted exactly when
    `jsonschema` (with its format checker) says valid; the bounded default
    (`free_form_depth=2`) accepts a subset, and the same set where every free-form
    value is a scalar;
  - random walks of the tables must decode to texts that `jsonschema` validates;
  - free-form values 30 levels deep in every free-form slot are accepted, unclosed ones
    rejected;
  - with Gemma 3, deep values and random instances under random tokenizations.
`dependentRequired` beside free-form values (refused under `free_form_depth=None` until
the free-form rule's calls stopped counting as recursion in `_any_order`) and a
`contains` item next to free-form items (refused until the compiler retried with the
free-form values inlined where they compete, `_json_free_form_align.py`; more such
schemas in `json_free_form_align_test.py`) are checked against `jsonschema` (both
found with the JSON-Schema-Test-Suite, 2026-11-28).
"""

import json
import random
import uuid

import json_schema_recursive_test as recursive  # pylint: disable=import-error  (same directory)
import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding.testing import TokenIndex
from constrained_decoding.testing import reference_accepts

SLOT = "^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$"  # A Kubernetes-style name, 1-32 characters.
SCHEMAS = {
    # Free-form calls (`meta`, `tags` items), counted strings (uuid, 32 hex digits,
    # maxLength 20, a bounded slot with a `-` side), an any-order object.
    "counted": {"type": "object", "properties": {
        "id": {"type": "string", "format": "uuid"},
        "code": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "name": {"type": "string", "maxLength": 20},
        "slot": {"type": "string", "pattern": SLOT},
        "mail": {"type": "string", "format": "email"},
        "meta": {}, "tags": {"type": "array"}},
        "required": ["id", "name", "meta"], "additionalProperties": False},
    # A wide any-order object (registers) mixing free-form and counted members.
    "registers": {"type": "object", "properties": {
        f"k{i}": [{}, {"type": "string", "maxLength": 6}, {"type": "integer"}][i % 3]
        for i in range(14)}, "required": ["k0", "k4"], "additionalProperties": False},
    # Recursion through $ref next to free-form calls and a counted label (schema order:
    # "an object inside a recursive schema keeps schema order", JsonSchema's docstring).
    "tree": {"$ref": "#/$defs/node", "$defs": {"node": {
        "type": "object", "properties": {
            "label": {"type": "string", "maxLength": 8}, "meta": {},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["label"], "additionalProperties": False}}},
}
_VALIDATORS = {name: jsonschema.Draft202012Validator(
    schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for name, schema in SCHEMAS.items()}
_COMPILED: dict = {}
# Characters of random strings: ASCII, escaped ones (`"`, `\\`, controls written
# `\\u00XX`), 2-, 3- and 4-byte UTF-8.
_CHARS = "ab-0_ \"\\\x01\x1f\n\u00e9\u4e2d\U0001f600"


def _tables(byte_compiler, name: str, depth: int | None = None):
  key = (name, depth)
  if key not in _COMPILED:
    _COMPILED[key] = byte_compiler.compile(cd.JsonSchema(SCHEMAS[name], free_form_depth=depth))
  return _COMPILED[key]


def _text(rng: random.Random, low: int, high: int, chars: str = _CHARS) -> str:
  return "".join(rng.choice(chars) for _ in range(rng.randint(low, high)))


def _nested(depth: int, rng: random.Random):
  """A JSON value `depth` containers deep, arrays and objects mixed at random."""
  value = rng.choice([None, True, 1.5, -7, "x\u00e9\\\"\x02", [], {}])
  for _ in range(depth):
    value = [value, rng.randint(0, 9)] if rng.random() < 0.5 else {"k\n": value, "": {}}
  return value


def _depth(value) -> int:
  """Containers nested in `value` (the bounded default admits 2)."""
  if isinstance(value, (list, dict)):
    items = value if isinstance(value, list) else value.values()
    return 1 + max(map(_depth, items), default=0)
  return 0


def _free(rng: random.Random, shallow: bool):
  return _nested(0 if shallow else rng.choice([0, 1, 2, 3, 7, 30]), rng)


def _uuid(rng: random.Random) -> str:
  text = str(uuid.UUID(int=rng.getrandbits(128)))
  change = rng.randrange(6)
  if change == 1:
    text = text.upper()
  elif change == 2:
    text = text.replace("-", "", 1)
  elif change == 3:
    text += rng.choice("0a")
  elif change == 4:
    text = text[:-1]
  return text


def _counted(rng: random.Random, shallow: bool) -> dict:
  code = _text(rng, 31, 33, "0123456789abcdef" * 8 + "G")
  members = {"id": _uuid(rng), "code": code, "name": _text(rng, 17, 22),
             "slot": _text(rng, 0, 34, "a0-" * 4 + "A"), "mail": "ann@example.com",
             "meta": _free(rng, shallow),
             "tags": [_free(rng, shallow) for _ in range(rng.randint(0, 3))]}
  return {k: v for k, v in members.items()
          if k in ("id", "name", "meta") and rng.random() < 0.95 or rng.random() < 0.5}


def _registers(rng: random.Random, shallow: bool) -> dict:
  def value(i):
    kind = i % 3 if rng.random() < 0.9 else rng.randrange(3)
    return [_free(rng, shallow), _text(rng, 4, 8), rng.randint(-9, 9)][kind]
  keys = [f"k{i}" for i in range(14) if rng.random() < 0.5 or i in (0, 4) and rng.random() < 0.95]
  if rng.random() < 0.1:
    keys.append("k14")  # Undeclared.
  rng.shuffle(keys)
  return {k: value(int(k[1:])) for k in keys}


def _tree(rng: random.Random, shallow: bool, depth: int = 0) -> dict:
  node = {"label": _text(rng, 6, 9)}
  if rng.random() < 0.5:
    node["meta"] = _free(rng, shallow)
  if depth < 4 and rng.random() < 0.6:
    node["children"] = [_tree(rng, shallow, depth + 1) for _ in range(rng.randint(0, 2))]
  return node  # Schema order: an object inside a recursive schema keeps it (documented).


_MAKERS = {"counted": _counted, "registers": _registers, "tree": _tree}


def _encode(value) -> bytes:
  return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.parametrize("name", SCHEMAS)
def test_random_instances_are_accepted_exactly_when_valid(name, byte_compiler):
  tables, bounded = _tables(byte_compiler, name), _tables(byte_compiler, name, 2)
  assert tables.is_pushdown and tables.terminal_counts.shape[0] > 1  # Counted chains.
  rng, verdicts = random.Random(f"instances-{name}"), set()
  for i in range(120):
    shallow = i % 3 == 0
    value = _MAKERS[name](rng, shallow)
    text, valid = _encode(value), _VALIDATORS[name].is_valid(value)
    accepted = reference_accepts(tables, list(text))
    assert accepted == valid, (text, valid)
    in_bounded = reference_accepts(bounded, list(text))
    assert not in_bounded or accepted, text  # The bounded default is a subset,
    assert not shallow or in_bounded == accepted, text  # equal on scalar free-form values.
    verdicts.add(valid)
  assert verdicts == {False, True}  # Both kinds drawn.


@pytest.mark.parametrize("name", SCHEMAS)
def test_random_walks_validate(name, byte_compiler, byte_vocab):
  rng = random.Random(f"walk-{name}")
  for text in recursive._walks(_tables(byte_compiler, name), rng, byte_vocab, 12,  # pylint: disable=protected-access
                               max_tokens=150):
    _VALIDATORS[name].validate(json.loads(text.decode()))


_DEEP_SLOTS = {
    "counted": lambda v: {"meta": v, "name": "n", "id": str(uuid.UUID(int=7)), "tags": [1, v]},
    "registers": lambda v: {"k3": v, "k4": "abc", "k0": v},
    "tree": lambda v: {"label": "r", "children": [{"label": "\u00e9\x01", "meta": v}]},
}


@pytest.mark.parametrize("name", SCHEMAS)
def test_free_form_values_thirty_levels_deep(name, byte_compiler):
  tables = _tables(byte_compiler, name)
  rng = random.Random(f"deep-{name}")
  for depth in (0, 1, 2, 3, 30):
    free = _nested(depth, rng)
    value = _DEEP_SLOTS[name](free)
    _VALIDATORS[name].validate(value)
    text = _encode(value)
    assert reference_accepts(tables, list(text)), text
    assert not reference_accepts(tables, list(text[:-1])), text  # Unclosed.
    assert reference_accepts(_tables(byte_compiler, name, 2), list(text)) == (_depth(free) <= 2)


@pytest.mark.parametrize("schema,keys", [
    ({"dependentRequired": {"bar": ["foo"]}}, ["bar", "foo"]),  # The suite's case.
    ({"properties": {"a": {"type": "integer"}, "m": {}},
      "dependentRequired": {"m": ["a"], "a": ["z"]}}, ["a", "m", "z"])])
def test_dependent_required_next_to_free_form_values(schema, keys, byte_compiler):
  """The keys' values are free-form calls (or an integer); keys in any order, values
  up to 6 deep. Only the keys the object names are drawn: additional keys between
  them are a documented narrowing of small any-order objects (README)."""
  tables = byte_compiler.compile(cd.JsonSchema(schema, free_form_depth=None))
  validator = jsonschema.Draft202012Validator(schema)
  rng = random.Random(f"dependent-{keys}")
  verdicts = set()
  for _ in range(60):
    members = rng.sample(keys, rng.randint(0, len(keys)))
    data = {k: (_nested(rng.randint(0, 6), rng) if rng.random() < 0.7 else rng.randint(-3, 3))
            for k in members}
    text = _encode(data)
    verdicts.add(validator.is_valid(data))
    assert reference_accepts(tables, list(text)) == validator.is_valid(data), text
  assert verdicts == {True, False}
  last = {**dict.fromkeys(keys, 1), "q": [[{}]]}  # An additional key after the others.
  assert validator.is_valid(last) and reference_accepts(tables, list(_encode(last)))


def test_contains_between_free_form_items(byte_compiler):
  """Suite case draft2020-12/contains.json "contains keyword validation": an item is a
  number >= 5 inline or a free-form call, both may start with a digit. With
  `implied_types=False` (as the specification says: `{"minimum": 5}` passes every
  non-number, so a string item counts too) the verdicts are `jsonschema`'s exactly;
  items are free-form values up to 30 deep, one in four of them a number."""
  schema = {"contains": {"minimum": 5}}
  tables = byte_compiler.compile(cd.JsonSchema(schema, free_form_depth=None,
                                               implied_types=False))
  validator = jsonschema.Draft202012Validator(schema)
  rng, verdicts = random.Random("contains"), set()
  for _ in range(80):
    items = [rng.choice([4, 5, 9.5, -7, 0.25]) if rng.random() < 0.25 else
             _nested(rng.choice([0, 1, 2, 30]), rng) for _ in range(rng.randint(0, 4))]
    text = _encode(items)
    verdicts.add(validator.is_valid(items))
    assert reference_accepts(tables, list(text)) == validator.is_valid(items), text
  assert verdicts == {True, False}
  assert reference_accepts(tables, list(b'[[[[2]]],5,"x"]'))
  assert not reference_accepts(tables, list(b"[2,4.5,-9]"))
  assert reference_accepts(tables, list(b"7"))  # Not an array: valid, as specified.


@pytest.mark.parametrize("name", SCHEMAS)
def test_gemma_random_tokenizations(name, gemma_compiler, gemma_vocab):
  """Deep free-form values and random instances under random Gemma 3 tokenizations
  (multi-character tokens cross the counted chains and the calls' brackets)."""
  tables = gemma_compiler.compile(cd.JsonSchema(SCHEMAS[name], free_form_depth=None))
  index, rng = TokenIndex(gemma_vocab), random.Random(f"gemma-{name}")
  for depth in (3, 30):
    text = _encode(_DEEP_SLOTS[name](_nested(depth, rng)))
    for tokens in (index.longest_tokenization(text), index.random_tokenization(text, rng)):
      assert reference_accepts(tables, tokens), text
  for _ in range(25):
    value = _MAKERS[name](rng, False)
    text = _encode(value)
    assert reference_accepts(tables, index.random_tokenization(text, rng)) == (
        _VALIDATORS[name].is_valid(value)), text
