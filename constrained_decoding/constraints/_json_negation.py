"""Boolean structure of JSON Schema as positive schemas: `not`, `if`/`then`/`else`,
exact `oneOf`, `dependentSchemas`.

Public functions:
  negate(schema, resolve)       a schema whose instances are exactly those `schema` rejects.
  rewrite_boolean(schema, resolve, pointer)
                                `schema` with `not`, `if`/`then`/`else` and
                                `dependentSchemas` turned into `allOf`/`anyOf`.
  exact_one_of(alternatives, resolve)
                                `oneOf` as an `anyOf` of "this one and none of the others".

Why at the schema level. Complementing the *language* the lowering builds would be exact
only if that language were complete (every valid spelling of every valid value) over
some universe of texts, and it is not: it narrows number and string spellings, property
order, duplicate keys. Negating the *schema* instead uses the specification's meaning
of each keyword: a value violates `{"minimum": 5}` exactly when it is a number below 5,
violates `{"required": ["a"]}` exactly when it is an object without `a`, and so on. The
result is an ordinary (positive) schema, lowered with the usual narrowings, so every
generated text is valid for the original: soundness never depends on completeness.

A value violates a schema when it violates one of its keywords, so `negate` is the
`anyOf` of each keyword's violations (type-specific keywords are violated only by
values of their type). Internal keywords express what no standard keyword can: `$notIn` (the value is none
of these scalars), `$notMultipleOf` (a number that is not a multiple of the step),
`$notPattern` and `$notFormat` (a string outside the language: the complement of its
character automaton, `_intersect.complement_text`); `_json_scalar_schemas.py` lowers
them exactly; `$someUndeclared` (an object with a key that `properties` and
`patternProperties` do not declare whose value violates `additionalProperties`, or,
with `names`, a key outside the `propertyNames` schema),
lowered by `_json_object_schemas.py`. Keywords whose violations are not expressible
here (`uniqueItems`, `patternProperties`, ...) raise
`UnsupportedSchemaError` naming the keyword.
"""

import json
from collections.abc import Callable

from constrained_decoding import errors
from constrained_decoding.constraints import _json_formats

_TYPES = ("null", "boolean", "object", "array", "number", "string")
_ANNOTATIONS_AND_DEFS = frozenset({
    "title", "description", "examples", "default", "$schema", "$id", "id", "$comment",
    "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType",
    "contentSchema", "discriminator", "$anchor", "$dynamicAnchor", "$recursiveAnchor",
    "$vocabulary", "$defs", "definitions",
    "$fromNot", "$resolved",
})
# Assertions whose violations `negate` cannot express (any other unknown keyword is an
# annotation, which nothing violates).
_REFUSED = frozenset({"patternProperties", "unevaluatedProperties",
                      "$someUndeclared",
                      "unevaluatedItems", "$dynamicRef", "$recursiveRef",
                      "$unevaluatedProperties", "$unevaluatedItems"})
_MAX_ONE_OF = 8  # Most `oneOf` alternatives made exact (n * (n - 1) negations).

Resolve = Callable[[str], object]


def _unsupported(keyword: str, pointer: str, why: str) -> errors.UnsupportedSchemaError:
  return errors.UnsupportedSchemaError(
      f"{keyword} at {pointer} cannot be enforced exactly: {why}. Expected a subschema"
      " built from type, enum, const, numeric and length bounds, multipleOf, required,"
      " properties, items, prefixItems, contains, dependentRequired and the boolean"
      " keywords. Simplify the subschema, or pass lenient=True to ignore the keyword.")


def negate(schema, resolve: Resolve, pointer: str = "#", active: tuple = ()):
  """A schema accepting exactly the JSON values `schema` rejects.

  Args:
    schema: A (sub)schema: a dict or a bool.
    resolve: `$ref` -> the subschema it points to.
    pointer: Where `schema` sits (for error messages).
    active: The `$ref`s being negated (one met again is recursion: refused).

  Raises:
    UnsupportedSchemaError: a keyword's violations cannot be expressed (see module doc),
      or the negated schema is recursive.
  """
  if schema is True:
    return False
  if schema is False:
    return True
  if not isinstance(schema, dict):
    raise errors.SchemaError(
        f"Schema {schema!r} at {pointer} is a {type(schema).__name__}. Expected an object"
        " or a boolean.")
  if "unevaluatedProperties" in schema:
    schema = _static_unevaluated(schema, pointer)
  violations = []
  for key, value in schema.items():
    if key in _ANNOTATIONS_AND_DEFS or key.startswith("x-"):
      continue
    where = f"{pointer}/{key}"
    violations.extend(_violations(key, value, schema, resolve, where, active))
  violations = _merge_type_only(violations)
  if not violations:
    return False
  if len(violations) == 1:
    return violations[0]
  return {"anyOf": violations}


def _merge_type_only(violations: list) -> list:
  """`{"type": a}, {"type": b}, ...` as one `{"type": [a, b, ...]}` (fewer `anyOf`
  alternatives, so fewer products when negations are merged under `allOf`)."""
  names = []
  for v in violations:
    if isinstance(v, dict) and set(v) == {"type"}:
      names += [v["type"]] if isinstance(v["type"], str) else v["type"]
  if len(names) <= 1 and len(violations) > 1 or not names:
    return violations
  if True in violations:
    return [True]
  others = [v for v in violations if not (isinstance(v, dict) and set(v) == {"type"})]
  names = list(dict.fromkeys(names))
  merged = {"type": names[0] if len(names) == 1 else names}
  return [merged, *others] if len(names) < len(_TYPES) else [True]


def _typed(type_name: str, **keywords) -> dict:
  return {"type": type_name, **keywords}


def _violations(key: str, value, schema: dict, resolve: Resolve, where: str,
                active: tuple) -> list:
  """The schemas of the values that violate keyword `key` of `schema` (an `anyOf`)."""
  sub = lambda s, p=where: negate(s, resolve, p, active)  # noqa: E731
  match key:
    case "type":
      names = {value} if isinstance(value, str) else set(value)
      out = [_typed(t) for t in _TYPES if t not in names and not (
          t == "number" and "integer" in names)]
      if "integer" in names and "number" not in names:
        out.append(_typed("number", **{"$notMultipleOf": 1}))
      return out
    case "enum" | "const":
      values = [value] if key == "const" else value
      return _not_in(values, where)
    case "$notIn":
      return [{"enum": list(value)}]
    case "$notMultipleOf":
      return [_typed("number", multipleOf=value)]
    case "minimum" | "exclusiveMinimum" | "maximum" | "exclusiveMaximum":
      return _bound_violation(key, value, schema)
    case "multipleOf":
      return [_typed("number", **{"$notMultipleOf": value})]
    case "minLength" | "minItems" | "minProperties":
      kind = {"minLength": "string", "minItems": "array", "minProperties": "object"}[key]
      upper = {"minLength": "maxLength", "minItems": "maxItems",
               "minProperties": "maxProperties"}[key]
      return [_typed(kind, **{upper: value - 1})] if value > 0 else []
    case "maxLength" | "maxItems" | "maxProperties":
      kind = {"maxLength": "string", "maxItems": "array", "maxProperties": "object"}[key]
      lower = {"maxLength": "minLength", "maxItems": "minItems",
               "maxProperties": "minProperties"}[key]
      return [_typed(kind, **{lower: value + 1})]
    case "required":
      return [_typed("object", properties={name: False}) for name in value]
    case "dependentRequired":
      return [_typed("object", required=[name], properties={other: False})
              for name, others in value.items() for other in others if other != name]
    case "dependentSchemas":
      return [_typed("object", required=[name], allOf=[sub(d, f"{where}/{name}")])
              for name, d in value.items()]
    case "$dependentMinProperties":
      return [_typed("object", required=[name], maxProperties=bound - 1)
              for name, bound in value.items() if bound > 0]
    case "$dependentMaxProperties":
      return [_typed("object", required=[name], minProperties=bound + 1)
              for name, bound in value.items()]
    case "properties":
      if "patternProperties" in schema:
        raise _unsupported("not", where, "properties next to patternProperties")
      return [_typed("object", required=[name], properties={name: sub(s, f"{where}/{name}")})
              for name, s in value.items() if s is not True and s != {}]
    case "propertyNames":
      if value is True or value == {}:
        return []
      return [_typed("object", **{"$someUndeclared": {
          "names": value, "schema": True, "at": where}})]
    case "additionalProperties":
      if value is True or value == {}:
        return []
      negated = sub(value)
      if negated is False:
        return []
      properties = schema.get("properties", {})
      patterns = schema.get("patternProperties", {})
      return [_typed("object", **{"$someUndeclared": {
          "declared": list(properties) if isinstance(properties, dict) else [],
          "patterns": list(patterns) if isinstance(patterns, dict) else [],
          "schema": negated, "at": where}})]
    case "items":
      if isinstance(value, list):  # Draft-07 array form: positions.
        return _prefix_violations(value, sub, where)
      if "prefixItems" in schema:
        raise _unsupported("not", where, "items next to prefixItems")
      negated = sub(value)
      return [] if negated is False else [_typed("array", contains=negated)]
    case "prefixItems":
      return _prefix_violations(value, sub, where)
    case "additionalItems":
      if isinstance(schema.get("items"), list) and value is not True and value != {}:
        raise _unsupported("not", where, "additionalItems after array-form items")
      return []
    case "contains":
      if "minContains" in schema or "maxContains" in schema:
        raise _unsupported("not", where, "contains with minContains/maxContains")
      return [_typed("array", items=sub(value))]
    case "minContains" | "maxContains":
      return []  # With `contains`: refused above; alone: no effect.
    case "allOf":
      return [sub(s, f"{where}/{i}") for i, s in enumerate(value)]
    case "anyOf":
      return [{"allOf": [sub(s, f"{where}/{i}") for i, s in enumerate(value)]}]
    case "oneOf":
      return _one_of_violations(value, sub, where)
    case "not":
      return [value]
    case "if":
      if "then" not in schema and "else" not in schema:
        return []
      then, otherwise = schema.get("then", True), schema.get("else", True)
      return [{"allOf": [value, sub(then, where[:-2] + "then")]},
              {"allOf": [sub(value), sub(otherwise, where[:-2] + "else")]}]
    case "then" | "else":
      return []  # With `if`: above; alone: no effect.
    case "$ref":
      if value in active:
        raise _unsupported("not", where, f"it negates the recursive $ref {value!r}")
      return [negate(resolve(value), resolve, value, (*active, value))]
    case "pattern":
      return [_typed("string", **{"$notPattern": value})]
    case "$notPattern":
      return [_typed("string", pattern=value)]
    case "format":
      if value not in _json_formats.FORMATS:
        return []  # An unknown format is an annotation: nothing violates it.
      return [_typed("string", **{"$notFormat": value})]
    case "$notFormat":
      return [_typed("string", format=value)]
    case "uniqueItems":
      if value is False:
        return []
      raise _unsupported("not", where, "an array with a repeated item is not regular")
    case _ if key in _REFUSED:
      raise _unsupported("not", where, f"the violations of {key!r} are not expressible")
    case _:
      return []  # An unknown keyword is an annotation: nothing violates it.


def _not_in(values: list, where: str) -> list:
  """Values of any type that are none of `values`."""
  out = []
  for t in _TYPES:
    same = [v for v in values if _json_type(v) == t]
    if not same:
      out.append(_typed(t))
    elif t == "boolean":
      rest = [b for b in (False, True) if b not in same]
      if rest:
        out.append({"enum": rest})
    elif t in ("string", "number"):
      out.append(_typed(t, **{"$notIn": same}))
    elif t in ("object", "array"):
      raise _unsupported("not", where, f"excluding {t} values from an enum or const")
  return out


def _json_type(value) -> str:
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "boolean"
  if isinstance(value, (int, float)):
    return "number"
  if isinstance(value, str):
    return "string"
  return "array" if isinstance(value, list) else "object"


def _bound_violation(key: str, value, schema: dict) -> list:
  if isinstance(value, bool):  # Draft-04 modifier: violations come with the bound.
    return []
  exclusive_flag = {"minimum": "exclusiveMinimum", "maximum": "exclusiveMaximum"}.get(key)
  strict = exclusive_flag is not None and schema.get(exclusive_flag) is True
  if key in ("minimum", "exclusiveMinimum"):
    opposite = "maximum" if key == "exclusiveMinimum" or strict else "exclusiveMaximum"
  else:
    opposite = "minimum" if key == "exclusiveMaximum" or strict else "exclusiveMinimum"
  return [_typed("number", **{opposite: value})]


def _prefix_violations(prefix: list, sub, where: str) -> list:
  out = []
  for i, s in enumerate(prefix):
    negated = sub(s, f"{where}/{i}")
    if negated is not False:
      out.append(_typed("array", prefixItems=[True] * i + [negated], minItems=i + 1))
  return out


def _one_of_violations(alternatives: list, sub, where: str) -> list:
  """Values matching none of the alternatives, or two of them."""
  if len(alternatives) > _MAX_ONE_OF:
    raise _unsupported("not", where, f"more than {_MAX_ONE_OF} oneOf alternatives")
  none = {"allOf": [sub(s, f"{where}/{i}") for i, s in enumerate(alternatives)]}
  pairs = [{"allOf": [a, b]} for i, a in enumerate(alternatives)
           for b in alternatives[i + 1:]]
  return [none, *pairs]


def exact_one_of(alternatives: list, resolve: Resolve, pointer: str) -> list:
  """The `anyOf` alternatives of `oneOf`: each alternative with none of the others."""
  if len(alternatives) > _MAX_ONE_OF:
    raise _unsupported("oneOf", pointer, f"more than {_MAX_ONE_OF} overlapping"
                       " alternatives (each excludes all the others)")
  negated = [negate(s, resolve, f"{pointer}/{i}") for i, s in enumerate(alternatives)]
  out = []
  for i, alternative in enumerate(alternatives):
    others = [n for j, n in enumerate(negated) if j != i and n is not True]
    if any(n is False for j, n in enumerate(negated) if j != i):
      continue  # Another alternative accepts everything: this one never matches alone.
    out.append({"allOf": [alternative, *others]} if others else alternative)
  return out or [False]


def _unannotated(schema):
  """Marks a negation: its properties and items do not count as evaluated
  (`unevaluated*`), which `_json_refs.py` checks with the `$fromNot` key."""
  return {**schema, "$fromNot": True} if isinstance(schema, dict) else schema


def rewrite_boolean(schema: dict, resolve: Resolve, pointer: str) -> dict:
  """`schema` with `not`, `if`/`then`/`else` and `dependentSchemas` moved into `allOf`.

  `not S` becomes `negate(S)`; `if I then T else E` becomes
  `anyOf: [allOf: [I, T], allOf: [negate(I), E]]`; `dependentSchemas: {k: D}` becomes
  `anyOf: [{properties: {k: false}}, {required: [k], allOf: [D]}]`.
  """
  parts = []
  rest = dict(schema)
  if "not" in rest:
    parts.append(_unannotated(negate(rest.pop("not"), resolve, f"{pointer}/not")))
  if "if" in rest:
    condition = rest.pop("if")
    if "then" not in rest and "else" not in rest:
      pass  # `if` alone asserts nothing.
    else:
      then, otherwise = rest.pop("then", True), rest.pop("else", True)
      parts.append({"anyOf": [{"allOf": [condition, then]},
                              {"allOf": [_unannotated(negate(condition, resolve,
                                                             f"{pointer}/if")),
                                         otherwise]}]})
  if "dependentSchemas" in rest:
    dependents = rest.pop("dependentSchemas")
    if not isinstance(dependents, dict):
      raise errors.SchemaError(
          f"dependentSchemas at {pointer}/dependentSchemas is {json.dumps(dependents)}."
          " Expected an object mapping property names to schemas. Fix the value.")
    sized = _size_dependents(dependents, rest.get("dependentRequired", {}))
    if sized is not None:
      rest.update(sized)
    else:
      for name, dependent in dependents.items():
        parts.append({"anyOf": [{"properties": {name: False}},
                                {"required": [name], "allOf": [dependent]}]})
  if not parts:
    return rest
  rest["allOf"] = [*rest.get("allOf", []), *parts]
  return rest


# Keywords of a dependent schema that `_size_dependents` moves into the object itself.
_SIZE_DEPENDENT = frozenset({"required", "minProperties", "maxProperties"})
# The keywords they become, and back (`expand_size_dependents`).
_DEPENDENT_SIZE = {"$dependentMinProperties": "minProperties",
                   "$dependentMaxProperties": "maxProperties"}


def _size_dependents(dependents: dict, depends) -> dict | None:
  """`dependentSchemas` whose schemas only bound the object's size and name required
  keys (`{"k": {"minProperties": 4}}`, `{"k": {"required": ["j"]}}`), as keywords of
  the object itself: `dependentRequired` and `$dependentMinProperties`/`MaxProperties`
  (key -> bound). Equivalent, and lowered as one object that counts its members on the
  device (`_json_counted_objects`) rather than a union of objects, below which
  registers are off. None (the `anyOf` rewrite) when a schema has another assertion,
  none bounds the size, or `depends` (the object's own `dependentRequired`) is
  malformed."""
  if not isinstance(depends, dict):
    return None
  required = {k: list(v) for k, v in depends.items()}
  bounds: dict = {key: {} for key in _DEPENDENT_SIZE}
  for name, dependent in dependents.items():
    if dependent is True or dependent == {}:
      continue
    if not isinstance(dependent, dict) or any(
        k not in _SIZE_DEPENDENT and k not in _ANNOTATIONS_AND_DEFS for k in dependent):
      return None
    names = dependent.get("required", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
      return None
    for keyword, plain in _DEPENDENT_SIZE.items():
      if plain in dependent:
        bound = dependent[plain]
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
          return None  # Malformed (or a float): the generic rewrite reports it.
        bounds[keyword][name] = bound
    if names:
      required[name] = list(dict.fromkeys([*required.get(name, []), *names]))
  if not any(bounds.values()):
    return None
  out = {k: v for k, v in bounds.items() if v}
  if required:
    out["dependentRequired"] = required
  return out


def expand_size_dependents(schema: dict) -> dict:
  """`schema` with `$dependentMinProperties`/`$dependentMaxProperties` written back as
  the `allOf` of `anyOf: [{"properties": {k: false}}, {"required": [k], bound}]` that
  `rewrite_boolean` writes for other dependent schemas (for objects that cannot count
  their members on the device)."""
  rest = {k: v for k, v in schema.items() if k not in _DEPENDENT_SIZE}
  parts = [{"anyOf": [{"properties": {name: False}}, {"required": [name], plain: bound}]}
           for keyword, plain in _DEPENDENT_SIZE.items()
           for name, bound in schema.get(keyword, {}).items()]
  if parts:
    rest["allOf"] = [*rest.get("allOf", []), *parts]
  return rest


# Keywords of a subschema that evaluate no property and that `_static_unevaluated`
# passes over (assertions on the object as a whole or on other types).
_NOT_EVALUATING = frozenset({
    "type", "enum", "const", "required", "minProperties", "maxProperties",
    "dependentRequired", "propertyNames", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "pattern", "format",
    "items", "prefixItems", "contains", "minItems", "maxItems", "uniqueItems",
    "minContains", "maxContains"}) | _ANNOTATIONS_AND_DEFS


def _always_evaluated(schema) -> set | None:
  """The properties `schema` evaluates whenever it matches, if they do not depend on
  the instance: its `properties` names and those of its `allOf` parts; None when some
  keyword evaluates dynamically (patterns, additional properties, `anyOf`, `$ref`, ...)."""
  if schema is True or schema is False:
    return set()
  if not isinstance(schema, dict):
    return None
  names = set()
  for key, value in schema.items():
    if key == "properties" and isinstance(value, dict):
      names |= set(value)
    elif key == "allOf" and isinstance(value, list):
      for part in value:
        inner = _always_evaluated(part)
        if inner is None:
          return None
        names |= inner
    elif key not in _NOT_EVALUATING and not key.startswith("x-"):
      return None
  return names


def _always_matches(schema) -> bool:
  """Whether every JSON value matches `schema` (`true`, `{}`, or only `properties` whose
  schemas are all `true`, beside annotations)."""
  if schema is True:
    return True
  return isinstance(schema, dict) and all(
      k in _ANNOTATIONS_AND_DEFS or k.startswith("x-") or k == "properties"
      and isinstance(v, dict) and all(s is True or s == {} for s in v.values())
      for k, v in schema.items())


def _static_unevaluated(schema: dict, pointer: str) -> dict:
  """`schema` with `unevaluatedProperties` U written as `additionalProperties` U, where
  the properties it evaluates do not depend on the instance: its own `properties`, those
  of its `allOf` parts, and those of `anyOf` alternatives that every value matches
  (annotations are collected from every matching alternative, 2020-12 section 10.2.1.2;
  such an `anyOf` asserts nothing and is dropped). Other alternatives may evaluate
  nothing. `additionalProperties` beside U evaluates every property: U is dropped.

  Raises:
    UnsupportedSchemaError: what the schema evaluates depends on the instance.
  """
  rest = {k: v for k, v in schema.items() if k != "unevaluatedProperties"}
  if "additionalProperties" in rest:
    return rest
  where = f"{pointer}/unevaluatedProperties"
  names = set()
  for key in ("anyOf", "allOf"):
    alternatives = rest.get(key, [])
    if not isinstance(alternatives, list):
      return rest  # Malformed: lowering reports it.
    for alternative in alternatives:
      inner = _always_evaluated(alternative)
      if key == "anyOf" and not _always_matches(alternative) and inner:
        inner = None  # Evaluated only when it matches.
      if inner is None or "patternProperties" in rest:
        raise _unsupported("not", where, "the properties it evaluates depend on the"
                           " instance")
      names |= inner
  if "anyOf" in rest and any(_always_matches(a) for a in rest["anyOf"]):
    rest.pop("anyOf")
  own = _always_evaluated({k: v for k, v in rest.items() if k not in ("anyOf", "allOf")})
  if own is None:
    raise _unsupported("not", where, "the properties it evaluates depend on the instance")
  properties = rest.get("properties", {})
  if not isinstance(properties, dict):
    return rest  # Malformed: lowering reports it.
  rest["properties"] = {**{n: True for n in sorted(names - set(properties))}, **properties}
  rest["additionalProperties"] = schema["unevaluatedProperties"]
  return rest
