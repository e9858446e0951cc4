"""`allOf` of `if`/`then`/`else` conditionals on one property's value, split by that value.

Public function:
  split_conditionals(schema, objects_only)   `schema` with such conditionals replaced
                                             by one `anyOf`, one branch per value.

Why. SchemaStore, CloudFormation and OpenAPI-style schemas select a variant with one
property: `allOf: [{if: {properties: {type: {const: "a"}}}, then: A}, {if: ... "b" ...,
then: B}, ...]`. Lowered one conditional at a time, each `if I then T` is `anyOf: [I and
T, not-I]` and their conjunction multiplies out to 2^k (3^k with `required`) branches, so
past a handful of conditionals the schema was refused. Split by the property's value
instead: when property P holds value v, a conditional whose `if` asks `P in S` reduces
to its other conditions (v in S) or to its `else` (v not in S). So the conjunction is
exactly

  anyOf: [ P = v  and  (each conditional given v)      for each value v named,
           P absent  and  (each conditional given "absent"),
           P present, none of the values  and  every `else` ]

whose branches are disjoint and linear in the number of conditionals and values.

A value that is not an object passes every `if`'s `properties` and `required`
vacuously: unless the schema generates objects only (`objects_only`: `type: object`, or
implied types and no keyword of another type), one more branch takes the other types
with each conditional's remaining (non-object) conditions.

Exact under these conditions, checked before rewriting (else the schema is unchanged):
each conditional is an `allOf` part made only of `if`/`then`/`else` (and
annotations) whose `if` gives P a `const` or `enum` of strings, booleans or null (a `type` next to it
that admits them all is redundant; no
numbers: JSON Schema equates `1` and `1.0`); `unevaluatedProperties`/`Items` are absent
(the rewrite would change what counts as evaluated). A P that is not `required` by an
`if` passes it when absent.
"""

import collections

from constrained_decoding.constraints._json_keywords import (
    _NO_CONSTRAINT,
    _TYPE_OF_KEYWORD,
    _same_value,
)

# Fewest conditionals on one property worth splitting (one alone is just `if`).
_MIN_CONDITIONALS = 2
_CONDITIONAL_KEYS = frozenset({"if", "then", "else"})


class _Conditional:
  """One `if`/`then`/`else` whose `if` selects on property `key` being one of `values`."""

  def __init__(self, part: dict, key: str, values: list):
    condition = part["if"]
    self.key, self.values = key, values
    self.then, self.otherwise = part.get("then", True), part.get("else", True)
    self.requires_key = key in condition.get("required", [])
    rest = dict(condition)
    properties = {k: v for k, v in rest.pop("properties").items() if k != key}
    if properties:
      rest["properties"] = properties
    required = [k for k in rest.pop("required", []) if k != key]
    if required:
      rest["required"] = required
    self.rest = rest  # The `if` without its condition on `key`.

  def given(self, value) -> object:
    """What the conditional asserts when `key` holds `value` (a 1-tuple `(v,)`, so that
    JSON null is `(None,)`) or is absent (`value` None)."""
    if value is None and self.requires_key:
      return self.otherwise
    return self._if_rest(value, self.rest)

  def given_non_object(self) -> object:
    """What it asserts on a value that is not an object: `properties`, `required` and
    the other object keywords of its `if` pass vacuously."""
    return self._if_rest(None, {k: v for k, v in self.rest.items()
                                if _TYPE_OF_KEYWORD.get(k) != "object"})

  def _if_rest(self, value, rest: dict) -> object:
    if value is not None and not any(_same_value(value[0], v) for v in self.values):
      return self.otherwise
    if not any(k not in _NO_CONSTRAINT for k in rest):
      return self.then  # The other conditions hold vacuously.
    return {"if": rest, "then": self.then, "else": self.otherwise}


def _selector_values(subschema) -> list | None:
  """The values a property subschema of an `if` allows, when it is only a const/enum of
  strings, booleans or null."""
  if not isinstance(subschema, dict):
    return None
  keys = [k for k in subschema if k not in _NO_CONSTRAINT and k != "type"]
  if keys == ["const"]:
    values = [subschema["const"]]
  elif keys == ["enum"] and isinstance(subschema["enum"], list):
    values = subschema["enum"]
  else:
    return None
  if not values or not all(v is None or isinstance(v, (str, bool)) for v in values):
    return None
  if "type" in subschema:  # Pydantic's `Literal`: `{"const": "a", "type": "string"}`.
    types = subschema["type"] if isinstance(subschema["type"], list) else [subschema["type"]]
    names = {str: "string", bool: "boolean", type(None): "null"}
    if not all(names[type(v)] in types for v in values):
      return None  # The type excludes a value: not a plain selector.
  return values


def _candidates(part) -> list[tuple[str, list]]:
  """(property, values) pairs a conditional `allOf` part selects on."""
  if not isinstance(part, dict) or "if" not in part or not (
      "then" in part or "else" in part):
    return []
  if any(k not in _CONDITIONAL_KEYS and k not in _NO_CONSTRAINT for k in part):
    return []
  condition = part["if"]
  if not isinstance(condition, dict) or not isinstance(condition.get("properties"), dict):
    return []
  if not isinstance(condition.get("required", []), list):
    return []
  out = []
  for key, subschema in condition["properties"].items():
    values = _selector_values(subschema)
    if values is not None:
      out.append((key, values))
  return out


def _all_of(parts: list) -> object:
  parts = [p for p in parts if p is not True and p != {}]
  if any(p is False for p in parts):
    return False
  if not parts:
    return True
  return parts[0] if len(parts) == 1 else {"allOf": parts}


def split_conditionals(schema: dict, objects_only: bool) -> dict:
  """`schema` with its conditionals on one property as one `anyOf` (see the module doc);
  `schema` itself when nothing qualifies."""
  parts = schema.get("allOf")
  if (not isinstance(parts, list)
      or "unevaluatedProperties" in schema or "unevaluatedItems" in schema):
    return schema
  own = None  # The schema's own conditional, if any, joins the parts.
  if "if" in schema and ("then" in schema or "else" in schema):
    own = len(parts)
    parts = [*parts, {k: schema[k] for k in _CONDITIONAL_KEYS if k in schema}]
  by_key = collections.defaultdict(list)
  for index, part in enumerate(parts):
    for key, values in _candidates(part):
      by_key[key].append(index)
  if not by_key:
    return schema
  key, indices = max(by_key.items(), key=lambda item: len(item[1]))
  if len(indices) < _MIN_CONDITIONALS:
    return schema
  group = [_Conditional(parts[i], key, dict(_candidates(parts[i]))[key]) for i in indices]
  values = []
  for conditional in group:
    for value in conditional.values:
      if not any(_same_value(value, v) for v in values):
        values.append(value)
  branches = []
  for value in values:
    chosen = {"type": "object", "required": [key], "properties": {key: {"const": value}}}
    branches.append(_all_of([chosen, *(c.given((value,)) for c in group)]))
  absent = {"type": "object", "properties": {key: False}}
  branches.append(_all_of([absent, *(c.given(None) for c in group)]))
  other = {"type": "object", "required": [key],
           "properties": {key: {"not": {"enum": values}}}}
  branches.append(_all_of([other, *(c.otherwise for c in group)]))
  if not objects_only:
    not_object = {"type": ["null", "boolean", "number", "string", "array"]}
    branches.append(_all_of([not_object, *(c.given_non_object() for c in group)]))
  branches = [b for b in branches if b is not False]
  kept = [p for i, p in enumerate(parts) if i not in indices and i != own]
  out = {k: v for k, v in schema.items()
         if k != "allOf" and not (own in indices and k in _CONDITIONAL_KEYS)}
  out["allOf"] = [*kept, {"anyOf": branches} if branches else False]
  return out
