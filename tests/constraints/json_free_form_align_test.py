"""Free-form calls inlined where they compete (`constraints/_json_free_form_align.py`).

With `free_form_depth=None`, a free-form value next to an inline value of another
branch (a `contains` item, an `anyOf` of objects whose undeclared keys are free-form,
an array item against `prefixItems`) made the push-down grammar nondeterministic; the
compiler now retries with those values written inline down to the competitor's depth,
then calls (`free_form_alignments`). Checked here:
  - schemas whose plain calls are nondeterministic compile, and random instances
    (free-form values up to 30 containers deep, keys in schema order then undeclared
    ones, as the any-order narrowing allows) are accepted exactly when `jsonschema`
    says valid; the bounded default (`free_form_depth=2`) accepts a subset;
  - the rewrite keeps the language: on the IR, texts of the aligned and plain rule
    bodies are the same (exact enumeration of short texts over a small alphabet);
  - it changes nothing where plain calls compile, and a grammar that no inlining makes
    deterministic still raises the original `NondeterministicGrammarError`.
"""

import json
import logging
import random

import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_free_form_align as align
from constrained_decoding.constraints import _json_schema
from constrained_decoding.constraints import _json_values as jv
from constrained_decoding.testing import reference_accepts

_INT_OBJECT = {"type": "object", "properties": {"n": {"type": "integer"}}}
SCHEMAS = {
    # An item is a number >= 5 inline or any value (a call): the suite's case.
    "contains_number": {"type": "array", "contains": {"type": "number", "minimum": 5}},
    # The competitor two levels deep, its own free-form items at level 2.
    "contains_nested": {"type": "array", "minContains": 2,
                        "contains": {"type": "array", "items": {"type": "array"}}},
    # Every item counts: the length, no retry (`_json_array_schemas._lower_contains`).
    "contains_true": {"type": "array", "contains": True},
    # `a` is declared (an object with an integer) in one branch, free-form in the other.
    "union_nested": {"anyOf": [
        {"type": "object", "properties": {"a": _INT_OBJECT}, "required": ["a"]},
        {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}]},
    # A free-form first item against arrays of arrays of booleans.
    "union_prefix": {"anyOf": [
        {"type": "array", "prefixItems": [{}, {**_INT_OBJECT, "required": ["n"]}]},
        {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}}}]},
    # `foo` free-form without `bar`, an object of integers with it.
    "dependent": {"type": "object", "dependentSchemas": {
        "bar": {"properties": {"foo": _INT_OBJECT}}}},
}
# Declared keys first, in this order, undeclared ones after them: the objects' any-order
# narrowing (and `dependentSchemas`' "k, then D's keys" written the other way round).
ORDER = {"union_nested": ["a", "b", "n"], "union_prefix": ["n"], "dependent": ["foo", "bar"]}
_KEYS = ["a", "b", "n", "foo", "bar", "x", ""]


def _nested(depth: int, rng: random.Random):
  value = rng.choice([None, True, 7, 2.5, "s\u00e9\\\"", [], {}])
  for _ in range(depth):
    value = [value, rng.randint(0, 9)] if rng.random() < 0.5 else {"n": value, "x": {}}
  return value


def _value(rng: random.Random, depth: int):
  """A random JSON value; some deep, most shallow, with the schemas' keys."""
  if depth <= 0 or rng.random() < 0.3:
    if rng.random() < 0.1:
      return _nested(rng.choice([3, 30]), rng)
    return rng.choice([None, False, rng.randint(-2, 9), 5.5, 4.5, "x", "\u00e9"])
  if rng.random() < 0.5:
    return [_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
  keys = rng.sample(_KEYS, rng.randint(0, 3))
  return {k: _value(rng, depth - 1) for k in keys}


def _text(value, name: str = "") -> bytes:
  """Compact JSON, the keys of schema `name` first in `ORDER` (the any-order narrowing)."""
  rank = {k: i for i, k in enumerate(ORDER.get(name, []))}

  def order(v):
    if isinstance(v, list):
      return [order(x) for x in v]
    if isinstance(v, dict):
      return {k: order(v[k]) for k in sorted(v, key=lambda k: rank.get(k, len(rank)))}
    return v
  return json.dumps(order(value), separators=(",", ":"), ensure_ascii=False).encode()


def _items(rng: random.Random, make) -> list:
  return [make() if rng.random() < 0.6 else _value(rng, 3) for _ in range(rng.randint(0, 4))]


def _members(rng: random.Random, declared: dict) -> dict:
  """Some of the `declared` members (made by their functions) and random others."""
  out = {k: make() for k, make in declared.items() if rng.random() < 0.7}
  out.update({k: _value(rng, 3) for k in rng.sample(["x", "", "n"], rng.randint(0, 2))
              if k not in out})
  return out


_MAKERS = {  # Values near each schema's shape, valid or one detail off.
    "contains_number": lambda rng: _items(rng, lambda: rng.choice([5, 7.5, 4, "9"])),
    "contains_nested": lambda rng: _items(
        rng, lambda: [rng.choice([[], [_value(rng, 3)], 1]) for _ in range(rng.randint(0, 2))]),
    "contains_true": lambda rng: _items(rng, lambda: _value(rng, 3)),
    "union_nested": lambda rng: _members(rng, {
        "a": lambda: _members(rng, {"n": lambda: rng.choice([1, -2, "1", 2.5])}),
        "b": lambda: rng.choice(["s", 1])}),
    "union_prefix": lambda rng: rng.choice([
        [_value(rng, 3), _members(rng, {"n": lambda: rng.choice([3, "3"])}), _value(rng, 3)],
        _items(rng, lambda: [rng.choice([True, False, 0]) for _ in range(rng.randint(0, 2))])]),
    "dependent": lambda rng: _members(rng, {
        "foo": lambda: _members(rng, {"n": lambda: rng.choice([1, 1.5, None])}),
        "bar": lambda: _value(rng, 2)}),
}


@pytest.mark.parametrize("name", SCHEMAS)
def test_random_instances_exactly_when_valid(name, byte_compiler, caplog):
  schema = SCHEMAS[name]
  with caplog.at_level(logging.INFO, logger="constrained_decoding._compiler"):
    tables = byte_compiler.compile(cd.JsonSchema(schema, free_form_depth=None))
  assert tables.is_pushdown
  # Plain calls were refused (all but `contains: true`, a length).
  assert ("inlined where they compete" in caplog.text) == (name != "contains_true")
  bounded = byte_compiler.compile(cd.JsonSchema(schema))
  validator = jsonschema.Draft202012Validator(schema)
  rng, verdicts = random.Random(f"align-{name}"), set()
  for i in range(150):
    value = _value(rng, 4) if i % 4 == 0 else _MAKERS[name](rng)
    text, valid = _text(value, name), validator.is_valid(value)
    accepted = reference_accepts(tables, list(text))
    assert accepted == valid, (text, valid)
    assert not reference_accepts(bounded, list(text)) or accepted, text
    verdicts.add(valid)
  assert verdicts == {True, False}


_DEEP = {
    "contains_number": lambda v: [v, 5, v],
    "contains_nested": lambda v: [[[v]], [], v],
    "contains_true": lambda v: [v, v],
    "union_nested": lambda v: {"a": {"n": 1, "x": v}, "z": v},
    "union_prefix": lambda v: [v, {"n": 2, "x": v}, v],
    "dependent": lambda v: {"foo": v, "x": v},
}


@pytest.mark.parametrize("name", SCHEMAS)
def test_free_form_values_thirty_deep(name, byte_compiler):
  tables = byte_compiler.compile(cd.JsonSchema(SCHEMAS[name], free_form_depth=None))
  validator = jsonschema.Draft202012Validator(SCHEMAS[name])
  rng = random.Random(f"deep-{name}")
  for depth in (0, 1, 2, 5, 30):
    value = _DEEP[name](_nested(depth, rng))
    assert validator.is_valid(value), value
    text = _text(value, name)
    assert reference_accepts(tables, list(text)), text
    assert not reference_accepts(tables, list(text[:-1])), text


# ---- The rewrite itself, on the IR. ----

_FREE = _json_schema.FREE_FORM_RULE
_WS = jv.Whitespace()


def _texts(node: ir.Node, rules: dict, max_len: int) -> set[bytes]:
  """Every text of `node` of at most `max_len` bytes, character classes read as the
  bytes `1`, `5` and `x` they hold (rule calls expanded): exact enumeration."""
  def expand(n: ir.Node, budget: int) -> set[bytes]:
    if budget < 0:
      return set()
    match n:
      case ir.Bytes(data):
        return {data} if len(data) <= budget else set()
      case ir.CharClass(ranges):
        return {bytes([c]) for c in b"15x" if any(lo <= c <= hi for lo, hi in ranges)}
      case ir.Concat(parts):
        out = {b""}
        for part in parts:
          out = {a + b for a in out for b in expand(part, budget - len(a))}
          if not out:
            break
        return out
      case ir.Union(alternatives):
        return set().union(*(expand(a, budget) for a in alternatives))
      case ir.Repeat(body, lo, hi):
        out, layer = set(), {b""}
        for count in range(budget + 1):
          if count >= lo:
            out |= layer
          if hi is not None and count >= hi:
            break
          layer = {a + b for a in layer for b in expand(body, budget - len(a)) if b}
          if not layer:
            break
        return out
      case ir.Graph(_, arcs, finals):
        out, frontier = set(), {(0, b"")}
        seen = set(frontier)
        while frontier:
          nxt = set()
          for state, text in frontier:
            if state in finals:
              out.add(text)
            for source, label, target in arcs:
              if source == state:
                nxt |= {(target, text + t) for t in expand(label, budget - len(text))}
          frontier = nxt - seen
          seen |= frontier
        return out
      case ir.RuleRef(name):
        return expand(rules[name], budget)
    raise AssertionError(n)

  return {t for t in expand(node, max_len) if len(t) <= max_len}


def test_inline_levels_keep_the_language():
  rules = {_FREE: jv.json_value_rule(_WS, _FREE)}
  free = ir.RuleRef(_FREE)
  for levels in (1, 2, 3):
    assert (_texts(jv.json_value_inline(_WS, _FREE, levels), rules, 7)
            == _texts(free, rules, 7))


@pytest.mark.parametrize("scope", ["points", "rule"])
def test_aligned_bodies_keep_the_language(scope):
  """A contains-like graph and an anyOf of arrays: rewritten, with the same texts up
  to 7 bytes."""
  free = ir.RuleRef(_FREE)
  rules = {_FREE: jv.json_value_rule(_WS, _FREE)}
  hit = ir.union(ir.Bytes(b"5"), jv.delimited(b"[", b"]", ir.Bytes(b"1"), _WS))
  contains = ir.Graph(5, ((0, ir.Bytes(b"["), 1), (1, free, 2), (1, hit, 3),
                          (2, ir.concat(ir.Bytes(b","), free), 2),
                          (2, ir.concat(ir.Bytes(b","), hit), 3),
                          (3, ir.concat(ir.Bytes(b","), free), 3), (3, ir.Bytes(b"]"), 4)),
                      (4,))
  arrays = ir.union(free, jv.delimited(b"[", b"]", jv.delimited(b"[", b"]", free, _WS), _WS))
  for node in (contains, arrays):
    aligned = align.align_free_form(node, _WS, _FREE, scope)
    assert aligned != node
    assert _texts(aligned, rules, 7) == _texts(node, rules, 7)


def test_nothing_to_align_keeps_the_node():
  """Free-form calls that compete with nothing (different first bytes) stay calls."""
  free = ir.RuleRef(_FREE)
  node = ir.concat(ir.Bytes(b"<"), free, ir.Bytes(b">"))
  assert align.align_free_form(node, _WS, _FREE, "points") is node
  schema = {"type": "array", "maxItems": 3}
  options = cd.JsonSchema(schema, free_form_depth=None).options()
  assert not list(_json_schema.free_form_alignments(schema, options))


def test_recursion_that_no_inlining_fixes_still_raises(byte_compiler):
  """Alike where a recursive `$ref` is entered: the original error, after the retries."""
  schema = {"anyOf": [{"$ref": "#/$defs/tree"}, {"type": "object",
                                                  "properties": {"k": {}}}],
            "$defs": {"tree": {"type": "object", "properties": {
                "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}}}}
  with pytest.raises(cd.NondeterministicGrammarError):
    byte_compiler.compile(cd.JsonSchema(schema, free_form_depth=None))
