"""JSON Schema keywords at the level of Python values: tables, drafts and merging.

What the lowering (`_json_schema.py`) needs to know about keywords before any IR is
built: which are annotations, which constrain which type, which are refused; draft
spellings rewritten to 2020-12 (`dependencies`, array-form `items`,
`unevaluated*`); keyword values read and checked; and `allOf` merging at the level of
Python values.

Public functions:
  schema_dict(schema, pointer)         `schema`, checked to be an object.
  type_names(value, pointer)           a `type` value as a list of type names.
  enum_values(schema, pointer)         the values `enum` and `const` both allow.
  count(schema, key, pointer)          a non-negative integer keyword, bounded.
  merge(a, b, pointer)                 one schema equivalent to `allOf: [a, b]`, or False.
  unsatisfiable(schema)                the error for a schema that accepts nothing.
"""

import fractions
import json
import math
import re
import urllib.parse

from constrained_decoding import errors

_ANNOTATIONS = frozenset({
    "title", "description", "examples", "default", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly",
    "contentEncoding", "contentMediaType", "contentSchema",  # Annotations since 2019-09.
    "discriminator",  # OpenAPI's hint on a oneOf (pydantic's discriminated unions).
    "id",  # Draft-04's `$id`.
    # Identifiers and vocabulary declarations: they name places, they assert nothing.
    "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary",
    "$resolved",  # Internal: this `$ref` is a JSON pointer from the root already.
})
_DEFINITIONS = frozenset({"$defs", "definitions"})
_NO_CONSTRAINT = _ANNOTATIONS | _DEFINITIONS
# Keyword -> the instance type it constrains (used when `type` is absent).
_TYPE_OF_KEYWORD = {
    "minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
    "$notPattern": "string", "$notFormat": "string",
    "minimum": "number", "maximum": "number", "exclusiveMinimum": "number",
    "exclusiveMaximum": "number", "multipleOf": "number",
    "properties": "object", "required": "object", "additionalProperties": "object",
    "propertyNames": "object", "patternProperties": "object",
    "unevaluatedProperties": "object", "$unevaluatedProperties": "object",
    "dependentRequired": "object", "dependentSchemas": "object", "dependencies": "object", "$notMultipleOf": "number",
    "contains": "array", "minContains": "array", "maxContains": "array",
    "$alsoContains": "array",
    "items": "array", "prefixItems": "array", "additionalItems": "array",
    "unevaluatedItems": "array", "$unevaluatedItems": "array",
    "minItems": "array", "maxItems": "array", "uniqueItems": "array",
    "minProperties": "object", "maxProperties": "object",
    "$someUndeclared": "object",  # Internal: `not` of additionalProperties.
    # Internal: `dependentSchemas` whose schemas bound the object's size (key -> bound,
    # `_json_negation.rewrite_boolean`), lowered with the object (`_json_counted_objects`).
    "$dependentMinProperties": "object", "$dependentMaxProperties": "object",
}
_SUPPORTED = frozenset({
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$notIn", "$fromNot",
    *_TYPE_OF_KEYWORD,
})
# Standard assertion keywords this library does not enforce: refused unless lenient.
# `_json_refs._dynamic_ref` turns these into `$ref`s where that is exact (and refuses
# the rest); only a value that is not a string is left for this refusal.
_UNSUPPORTED = frozenset({"$dynamicRef", "$recursiveRef"})
# Rewritten into allOf/anyOf by `_json_negation.rewrite_boolean` before lowering.
_BOOLEAN = ("not", "if", "dependentSchemas")
# Keywords whose subschemas' annotations `unevaluatedProperties`/`Items` also see.
_APPLICATORS = ("$ref", "allOf", "anyOf", "oneOf", "if", "dependentSchemas", "not")
# Keywords that have no effect without another one (`then` without `if`, ...).
_NEEDS = {"then": "if", "else": "if", "minContains": "contains", "maxContains": "contains"}
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
# Keywords that decide which schema a property's value must satisfy.
_OBJECT_MEMBER_KEYWORDS = ("properties", "additionalProperties", "patternProperties")
# Keywords `propertyNames` may use (a schema for strings, applied to each key).
_NAME_KEYWORDS = frozenset({"type", "pattern", "format", "minLength", "maxLength", "enum",
                            "const"})
_NUMBER = (int, float, fractions.Fraction)  # Fractions: merged `multipleOf`s.
# Keyword -> (types, description) its value must have for `allOf` merging.
_MERGE_SHAPES = {
    "type": ((str, list), "a type name or list"), "enum": (list, "an array"),
    "required": (list, "an array of names"), "anyOf": (list, "an array of schemas"),
    "oneOf": (list, "an array of schemas"),
    "properties": (dict, "an object"), "prefixItems": (list, "an array of schemas"),
    **{k: (_NUMBER, "a number") for k in ("minimum", "maximum", "exclusiveMinimum",
                                          "exclusiveMaximum", "minLength", "maxLength",
                                          "minItems", "maxItems", "multipleOf",
                                          "minProperties", "maxProperties")},
    **{k: (dict, "an object") for k in ("$dependentMinProperties",
                                        "$dependentMaxProperties")},
}


def _short(value, limit: int = 60) -> str:
  text = json.dumps(value, ensure_ascii=False)
  return text if len(text) <= limit else text[: limit - 3] + "..."


def _pointer(base: str, *parts) -> str:
  """`base` extended by JSON pointer tokens (`~` and `/` escaped as `~0`, `~1`)."""
  return base + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _same_value(a, b) -> bool:
  """JSON equality that keeps booleans apart from numbers (`true` is not `1`)."""
  return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _json_type(value) -> str:
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "boolean"
  if isinstance(value, int):
    return "integer"
  if isinstance(value, float):
    return "integer" if value.is_integer() else "number"
  if isinstance(value, str):
    return "string"
  if isinstance(value, list):
    return "array"
  return "object"


def _has_type(value, types) -> bool:
  t = _json_type(value)
  return t in types or (t == "integer" and "number" in types)


def _constraining(schema: dict) -> bool:
  return any(k not in _NO_CONSTRAINT for k in schema)


def _merged_values(schema: dict, key: str) -> tuple:
  """A keyword's values: () when absent, the tuple `allOf` merging made, or (value,)."""
  if key not in schema:
    return ()
  value = schema[key]
  return value if isinstance(value, tuple) else (value,)


def _exact(value) -> fractions.Fraction:
  """A JSON number as an exact fraction. A float is read as the decimal it was written
  as (0.1 is 1/10, not the nearest binary fraction), so bounds and steps compare
  exactly with the decimal texts generated."""
  return fractions.Fraction(repr(value) if isinstance(value, float) else value)


def _items(schema: dict):
  """The schema of the items after `prefixItems` (`unevaluatedItems` when `items` is absent)."""
  return schema.get("items", schema.get("$unevaluatedItems", True))


_LEGACY_DRAFTS = ("draft-03", "draft-04", "draft-06", "draft-07")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def _own_id(node) -> str | None:
  """The `$id` (draft-04: `id`) of a subschema that names a resource (not `#anchor`)."""
  if not isinstance(node, dict):
    return None
  ident = node.get("$id", node.get("id") if not isinstance(node.get("id"), dict) else None)
  return ident if isinstance(ident, str) and not ident.startswith("#") else None


def _join_uri(base: str, ref: str) -> str:
  """`ref` resolved against `base` (RFC 3986; URNs and other opaque URIs as they are)."""
  if _SCHEME.match(ref):
    return ref
  if ref.startswith("#"):
    return base.partition("#")[0] + ref
  if _SCHEME.match(base) and "/" not in base.split(":", 1)[1][:1]:
    return ref  # An opaque base (urn:...) has no relative references.
  return urllib.parse.urljoin(base, ref)


def _legacy_draft(root) -> bool:
  """Whether the root's `$schema` names draft 7 or older (`$ref` overrides siblings)."""
  uri = root.get("$schema") if isinstance(root, dict) else None
  return isinstance(uri, str) and any(d in uri for d in _LEGACY_DRAFTS)


def _unevaluated(schema: dict) -> dict:
  """`unevaluatedProperties`/`unevaluatedItems` rewritten for lowering.

  Without applicators, the properties (items) a schema evaluates are those its own
  `properties`, `patternProperties` and `additionalProperties` (`prefixItems`, `items`)
  name, so `unevaluatedProperties` is `additionalProperties` when that is absent and has
  no effect otherwise. With applicators (`allOf`, `$ref`, `anyOf`, ...) it applies to
  what the conjunction evaluates once merged: it is kept as `$unevaluatedProperties`,
  which `_json_object_schemas.lower_object` reads after `allOf` merging and, for
  `anyOf`/`oneOf`, per alternative (the alternative that matched is the one whose
  properties count: exact when no two alternatives match, narrower otherwise).
  """
  out = dict(schema)
  has_applicators = any(k in schema for k in _APPLICATORS)
  for keyword, own, covered in (
      ("unevaluatedProperties", "additionalProperties", ("additionalProperties",)),
      ("unevaluatedItems", "items", ("items", "additionalItems"))):
    if keyword not in out:
      continue
    value = out.pop(keyword)
    if keyword == "unevaluatedItems" and isinstance(schema.get("items"), list):
      covered = ("additionalItems",)  # Draft-07 array-form items: the rest is uncovered.
      own = "additionalItems"
    if any(k in schema for k in covered):
      continue  # Everything is evaluated already.
    out["$" + keyword if has_applicators else own] = value
  return out


def _normalize(schema: dict, pointer: str) -> dict:
  """Rewrites draft-07 array-form `items` (+ `additionalItems`) as `prefixItems` + `items`."""
  items = schema.get("items")
  if isinstance(items, list):
    if "prefixItems" in schema:
      raise errors.SchemaError(
          f"Schema at {pointer} has both prefixItems and array-form items. Expected one"
          " of them. Use prefixItems plus a schema-form items (draft 2020-12)."
      )
    normalized = {k: v for k, v in schema.items() if k not in ("items", "additionalItems")}
    normalized["prefixItems"] = items
    if "additionalItems" in schema:
      normalized["items"] = schema["additionalItems"]
    return normalized
  if "additionalItems" in schema:  # No effect without array-form items.
    schema = {k: v for k, v in schema.items() if k != "additionalItems"}
  return schema


def _split_dependencies(schema: dict, pointer: str) -> dict:
  dependencies = schema["dependencies"]
  if not isinstance(dependencies, dict):
    raise errors.SchemaError(
        f"dependencies at {_pointer(pointer, 'dependencies')} is {_short(dependencies)}."
        " Expected an object mapping property names to arrays or schemas. Fix the value.")
  out = {k: v for k, v in schema.items() if k != "dependencies"}
  for key, value in dependencies.items():
    kind = "dependentRequired" if isinstance(value, list) else "dependentSchemas"
    out[kind] = {**out.get(kind, {}), key: value}
  return out


def _type_list(value) -> list:
  return [value] if isinstance(value, str) else list(value)


def _intersect_types(a: list, b: list) -> list:
  out = []
  for t in a:
    if t in b:
      out.append(t)
    elif t == "integer" and "number" in b or t == "number" and "integer" in b:
      out.append("integer")
  return list(dict.fromkeys(out))


def _lazy_all_of(x, y):
  """`allOf: [x, y]`, simplified when one side is trivial."""
  if x is True or x == {}:
    return y
  if y is True or y == {}:
    return x
  if x is False or y is False:
    return False
  if _same_value(x, y):
    return x
  return {"allOf": [x, y]}


def _merge_properties(a: dict, b: dict, merged: dict) -> None:
  """Each property must satisfy both sides; a side's `additionalProperties` governs the
  properties it does not declare (so `allOf` with `additionalProperties: false` is exact)."""
  a_props, b_props = a.get("properties", {}), b.get("properties", {})
  if not isinstance(a_props, dict) or not isinstance(b_props, dict):
    return  # Malformed: lowering reports it.
  a_more, b_more = a.get("additionalProperties", True), b.get("additionalProperties", True)
  names = list(dict.fromkeys([*a_props, *b_props]))
  merged["properties"] = {n: _lazy_all_of(a_props.get(n, a_more), b_props.get(n, b_more))
                          for n in names}
  if "additionalProperties" in a or "additionalProperties" in b:
    merged["additionalProperties"] = _lazy_all_of(a_more, b_more)


def _merge_items(a: dict, b: dict, merged: dict) -> None:
  """Position-wise `allOf` of `prefixItems`, each side's `items` covering the rest."""
  a_prefix, b_prefix = a.get("prefixItems", []), b.get("prefixItems", [])
  if not isinstance(a_prefix, list) or not isinstance(b_prefix, list):
    return  # Malformed: lowering reports it.
  a_items, b_items = a.get("items", True), b.get("items", True)
  if a_prefix or b_prefix:
    merged["prefixItems"] = [
        _lazy_all_of(a_prefix[i] if i < len(a_prefix) else a_items,
                     b_prefix[i] if i < len(b_prefix) else b_items)
        for i in range(max(len(a_prefix), len(b_prefix)))]
  if "items" in a or "items" in b:
    merged["items"] = _lazy_all_of(a_items, b_items)


def _conjunction_key(flat: list) -> str:
  """The content of flattened (schema, pointer) conjuncts, as JSON text."""
  return json.dumps([s for s, _ in flat], ensure_ascii=False, separators=(",", ":"))


def unsatisfiable(schema) -> errors.SchemaError:
  return errors.SchemaError(
      f"JSON Schema {_short(schema)} accepts no JSON value. Expected a satisfiable"
      " schema. Look for contradictory keywords (minimum > maximum, an empty enum, a"
      " required property whose schema is false, ...)."
  )


# ---------------------------------------------------------------------------------------
# Keyword values, read and checked.

# Most items, characters or properties a `min*`/`max*` keyword may count (one automaton
# state each, the default `CompileOptions.max_states`); checked before anything is built.
MAX_COUNT = 100_000
_MAX_PRODUCT = 64  # Most alternatives `allOf` of two `anyOf`s may multiply into.


def schema_dict(schema, pointer: str) -> dict:
  """`schema` itself, once checked to be an object (not a list, string, ...)."""
  if not isinstance(schema, dict):
    raise errors.SchemaError(
        f"Schema {_short(schema)} at {pointer} is a {type(schema).__name__}. Expected"
        " an object or a boolean. Wrap constraints in an object, e.g. {\"type\": ...}."
    )
  return schema


def merge(a: dict, b: dict, pointer: str):
  """One schema equivalent to `allOf: [a, b]` (both without `$ref`/`allOf`), or False.

  Subschemas under the same keyword become a lazy `{"allOf": [x, y]}`, merged when
  (and if) they are lowered, so recursive schemas are merged one level at a time.
  """
  a, b = _without_free_patterns(a), _without_free_patterns(b)
  for one, other in ((a, b), (b, a)):
    if ("patternProperties" in one and any(k in other for k in _OBJECT_MEMBER_KEYWORDS)
        # `properties` beside patterns with additional keys free: a key both name
        # takes its pattern schemas (as any declared key does) and its other schema.
        and not ("additionalProperties" not in one and "patternProperties" not in other
                 and "additionalProperties" not in other)):
      raise errors.UnsupportedSchemaError(
          f"allOf at {_pointer(pointer, 'allOf')} combines patternProperties with another"
          " side's properties, additionalProperties or patternProperties, which is not"
          " supported. Expected patternProperties on one side only. Merge the subschemas"
          " by hand.")
  merged = dict(a)
  counted = [k for s in (a, b) for k in ("minContains", "maxContains") if k in s]
  if counted and any("$alsoContains" in s for s in (a, b)):
    _merge_conflict("contains", _pointer(pointer, "allOf"), a.get("contains"),
                    b.get("contains"))
  for key, vb in b.items():
    if key == "$alsoContains":
      merged[key] = (*merged.get(key, ()), *vb)
      continue
    if key == "contains" and key in merged and not counted and not _same_value(
        merged[key], vb):  # Both must be met, each by at least one item.
      merged["$alsoContains"] = (*merged.get("$alsoContains", ()), vb)
      continue
    if key not in merged or key in _NO_CONSTRAINT:
      merged.setdefault(key, vb)
      continue
    va = merged[key]
    where = _pointer(pointer, "allOf")
    expected = _MERGE_SHAPES.get(key)
    if expected and not (isinstance(va, expected[0]) and isinstance(vb, expected[0])):
      raise errors.SchemaError(
          f"allOf at {where} has {key!r} values {_short(va, 30)} and {_short(vb, 30)}."
          f" Expected {expected[1]} on both sides. Fix the subschemas."
      )
    if key == "type":
      types = _intersect_types(_type_list(va), _type_list(vb))
      if not types:
        return False
      merged[key] = types
    elif key == "enum":
      merged[key] = [v for v in va if any(_same_value(v, w) for w in vb)]
    elif key == "const":
      if not _same_value(va, vb):
        return False
    elif key == "required":
      merged[key] = list(dict.fromkeys([*va, *vb]))
    elif key == "$notIn":
      merged[key] = [*va, *vb]
    elif key == "$notMultipleOf":
      merged[key] = (*_merged_values(merged, key), *_merged_values(b, key))
    elif key == "dependentRequired" and isinstance(va, dict) and isinstance(vb, dict):
      merged[key] = {k: list(dict.fromkeys([*va.get(k, []), *vb.get(k, [])]))
                     for k in dict.fromkeys([*va, *vb])}
    elif key in ("$dependentMinProperties", "$dependentMaxProperties"):
      tighter = max if key == "$dependentMinProperties" else min
      merged[key] = {k: tighter(va[k], vb[k]) if k in va and k in vb else va.get(k, vb.get(k))
                     for k in dict.fromkeys([*va, *vb])}
    elif key in ("minimum", "minLength", "minItems", "minProperties", "exclusiveMinimum"):
      if isinstance(va, bool) or isinstance(vb, bool):
        _merge_conflict(key, where, va, vb)
      merged[key] = max(va, vb)
    elif key in ("maximum", "maxLength", "maxItems", "maxProperties", "exclusiveMaximum"):
      if isinstance(va, bool) or isinstance(vb, bool):
        _merge_conflict(key, where, va, vb)
      merged[key] = min(va, vb)
    elif key == "multipleOf":  # Multiples of both: of their least common multiple.
      a_step, b_step = _exact(va), _exact(vb)
      if a_step <= 0 or b_step <= 0:
        _merge_conflict(key, where, va, vb)
      numerator = math.lcm(a_step.numerator, b_step.numerator)
      merged[key] = fractions.Fraction(
          numerator, math.gcd(a_step.denominator, b_step.denominator))
    elif key in ("anyOf", "oneOf"):
      if len(va) * len(vb) > _MAX_PRODUCT:
        _merge_conflict(key, where, va, vb)
      merged[key] = [_lazy_all_of(x, y) for x in va for y in vb]
    elif key == "uniqueItems" and isinstance(va, bool) and isinstance(vb, bool):
      merged[key] = va or vb
    elif key in ("pattern", "format", "$notPattern", "$notFormat",
                 "$someUndeclared"):  # Tuple: all apply.
      values = []
      for value in (*_merged_values(merged, key), *_merged_values(b, key)):
        if not any(_same_value(value, v) for v in values):
          values.append(value)
      merged[key] = tuple(values) if len(values) > 1 else values[0]
    elif key in ("properties", "additionalProperties", "items", "prefixItems"):
      pass  # Below: they interact across keywords.
    elif not _same_value(va, vb):  # pattern, format, ...
      _merge_conflict(key, where, va, vb)
  if any(k in s for s in (a, b) for k in ("properties", "additionalProperties")):
    _merge_properties(a, b, merged)
  if any(k in s for s in (a, b) for k in ("items", "prefixItems")):
    _merge_items(a, b, merged)
  return merged


def _without_free_patterns(schema: dict) -> dict:
  """`schema` without `patternProperties` that constrain nothing: every pattern's schema
  accepts any value and additional properties are allowed, so every key may take any
  value either way (OpenAPI 3.1's `specification-extensions`, `{"^x-": true}`)."""
  patterns = schema.get("patternProperties")
  if (not isinstance(patterns, dict) or schema.get("additionalProperties", True) is not True
      or "unevaluatedProperties" in schema or "$unevaluatedProperties" in schema
      or not all(v is True or isinstance(v, dict) and not _constraining(v)
                 for v in patterns.values())):
    return schema
  return {k: v for k, v in schema.items() if k != "patternProperties"}


def _merge_conflict(key: str, where: str, va, vb) -> None:
  raise errors.UnsupportedSchemaError(
      f"allOf at {where} combines {key!r} values {_short(va, 30)} and {_short(vb, 30)},"
      " which cannot be merged. Expected equal values, or bounds that can be"
      " tightened. Merge the two subschemas by hand."
  )


def enum_values(schema: dict, pointer: str) -> list:
  """The values `enum` and `const` both allow (`schema` has at least one of them)."""
  values = None
  if "enum" in schema:
    values = schema["enum"]
    if not isinstance(values, list):
      raise errors.SchemaError(
          f"enum at {_pointer(pointer, 'enum')} is {_short(values)}. Expected an array"
          " of JSON values. Wrap the value in a list, or use const."
      )
  if "const" in schema:
    const = schema["const"]
    values = [const] if values is None or any(_same_value(const, v) for v in values) else []
  return values


def type_names(value, pointer: str) -> list[str]:
  """The type names of a `type` value (a name or a list), checked, without repeats."""
  names = [value] if isinstance(value, str) else value
  if not isinstance(names, list) or any(n not in _TYPES for n in names):
    raise errors.SchemaError(
        f"type {_short(value)} at {_pointer(pointer, 'type')} is not a JSON Schema"
        f" type. Expected one of {list(_TYPES)} or a list of them. Fix the type name."
    )
  return list(dict.fromkeys(names))


def count(schema: dict, key: str, pointer: str) -> int | None:
  """A non-negative integer keyword (`minLength`, ...), or None if absent."""
  if key not in schema:
    return None
  value = schema[key]
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise errors.SchemaError(
        f"{key} {value!r} at {_pointer(pointer, key)} is not a non-negative integer."
        f" Expected e.g. 0 or 10. Fix the value."
    )
  if value > MAX_COUNT:
    raise errors.CompileBudgetError(
        f"{key} {value} at {_pointer(pointer, key)} needs an automaton of more than"
        f" {MAX_COUNT} states (one per counted item or character). Expected at most"
        f" {MAX_COUNT}. Lower it, or drop it if no output comes near it.")
  return value


def evaluated_through(lw, schema, pointer: str, own, nothing, depth: int = 0):
  """What a matching `schema` evaluates for `unevaluatedItems`/`unevaluatedProperties`:
  its own keywords' parts joined with those of its `$ref` targets and `allOf` parts.

  `own(key, value, schema)` gives one keyword's part (`nothing` for a keyword that
  evaluates nothing), or None where that is not static; parts join with `.union`.
  Returns None when any part is None, past 16 levels, or for a non-schema value.
  """
  if isinstance(schema, bool):
    return nothing
  if not isinstance(schema, dict) or depth > 16:
    return None
  out = nothing
  for key, value in schema.items():
    if key == "$ref":
      try:
        target = lw.resolve(value, pointer)
      except errors.ConstraintError:
        return None
      parts = [target]
    elif key == "allOf":
      if not isinstance(value, list):
        return None
      parts = value
    else:
      more = own(key, value, schema)
      if more is None:
        return None
      out = out.union(more)
      continue
    for part in parts:
      more = evaluated_through(lw, part, pointer, own, nothing, depth + 1)
      if more is None:
        return None
      out = out.union(more)
  return out
