"""JSON Schema boolean structure while lowering: `anyOf`/`oneOf` alternatives, and
`not`, `if`/`then`/`else`, `dependentSchemas` rewritten as positive schemas.

Functions on the lowering in progress (`_json_schema._Lowerer`, `lw`):
  rewrite_boolean(lw, schema, pointer)   `_json_negation.rewrite_boolean`, with the
                                         `unevaluated*` combinations it cannot keep
                                         exact refused (or dropped when lenient).
  lower_any_of(lw, schema, key, pointer) `anyOf`/`oneOf` (exact: disjoint alternatives
                                         as they are, overlapping ones through
                                         `_json_negation.exact_one_of`).
"""

import json

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_negation
from constrained_decoding.constraints import _json_scalar_schemas
from constrained_decoding.constraints._json_keywords import (
    _ANNOTATIONS,
    _BOOLEAN,
    _DEFINITIONS,
    _TYPES,
    _constraining,
    _json_type,
    _lazy_all_of,
    _pointer,
    _short,
    evaluated_through,
)


def rewrite_boolean(lw, schema: dict, pointer: str) -> dict:
  """`not`, `if`/`then`/`else`, `dependentSchemas` as `allOf` parts (`_json_negation`).

  Annotations from `not` and a failed `if` do not count for `unevaluated*`, but the
  rewritten parts would: `unevaluatedProperties` there is exact where what each branch
  evaluates is static (`_conditions_with_unevaluated`), refused otherwise.
  """
  if ("unevaluatedProperties" in schema and ("not" in schema or "if" in schema)
      and "unevaluatedItems" not in schema):
    rewritten = _conditions_with_unevaluated(lw, schema, pointer)
    if rewritten is not None:
      return rewritten
  for key in ("unevaluatedProperties", "unevaluatedItems"):
    if key in schema and ("not" in schema or "if" in schema or
                          key == "unevaluatedItems" and "contains" in schema):
      where = _pointer(pointer, key)
      lw.unsupported(where, (
          f"{key} at {where} next to not or if is not supported (their annotations do"
          " not count as evaluated). Expected one of them. Remove one, or pass"
          f" lenient=True to ignore {key}."))
      schema = {k: v for k, v in schema.items() if k != key}
  resolve = lambda ref: lw.resolve(ref, pointer)  # noqa: E731
  try:
    return _json_negation.rewrite_boolean(schema, resolve, pointer)
  except errors.UnsupportedSchemaError as e:
    if not all(lw.ignores(_pointer(pointer, key)) for key in _BOOLEAN if key in schema):
      raise
    for key in _BOOLEAN:
      if key in schema:
        lw.unsupported(_pointer(pointer, key), str(e))
    return {k: v for k, v in schema.items()
            if k not in (*_BOOLEAN, "then", "else")}


# Keywords that give a schema its own base URI or anchors: kept where they are, so the
# rewrite below leaves such schemas alone.
_PLACES = ("$id", "id", "$anchor", "$dynamicAnchor", "$recursiveAnchor")


def _conditions_with_unevaluated(lw, schema: dict, pointer: str) -> dict | None:
  """`not` and `if`/`then`/`else` next to `unevaluatedProperties` U, as an `anyOf` of
  branches that each carry U over what they evaluate: `if I then T else E` is
  "I and T" (both evaluate) or "not I, and E" (only E does); `if I` alone is "I" or
  "anything" (no negation: see below); `not N` evaluates nothing. A negation
  (`_json_negation.negate`) is written in disjunctive normal form,
  each property it names held to U unless the branch evaluates it anyway
  (`_carry_unevaluated`). None (the caller refuses) where a part evaluates dynamically
  (`_evaluated_names`), a negation is not plain object keywords, or the schema has
  its own `$id` or anchors.
  """
  if any(k in schema for k in _PLACES):
    return None
  unevaluated = schema["unevaluatedProperties"]
  top = {k: v for k, v in schema.items() if k in _ANNOTATIONS or k in _DEFINITIONS}
  rest = {k: v for k, v in schema.items() if k not in top and k not in (
      "not", "if", "then", "else", "unevaluatedProperties")}
  options = [([], [])]  # (positive parts, negated parts) of each branch.
  if "not" in schema:
    options = [(p, [*n, schema["not"]]) for p, n in options]
  if "if" in schema and "then" not in schema and "else" not in schema:
    # `if` alone asserts nothing, but where it matches its annotations count:
    # (I and U over less) or (not I and U over all), which is (I and U over less) or
    # (U over all), as U over all implies U over less: no negation.
    options = [o for p, n in options for o in (([*p, schema["if"]], n), (p, n))]
  elif "if" in schema:
    condition = schema["if"]
    then, otherwise = schema.get("then", True), schema.get("else", True)
    options = [o for p, n in options
               for o in (([*p, condition, then], n), ([*p, otherwise], [*n, condition]))]
  base = _evaluated_names(lw, rest, pointer)
  if base is None:
    return None
  resolve = lambda ref: lw.resolve(ref, pointer)  # noqa: E731
  alternatives = []
  for positives, negatives in options:
    split = [_split_nots(p) for p in positives]
    positives = [p for p, _ in split]
    negatives = [*negatives, *(x for _, nots in split for x in nots)]
    names = [_evaluated_names(lw, p, pointer) for p in positives]
    if any(v is None for v in names):
      return None
    evaluated = base.union(*names)
    terms = _carried_terms(_negations(negatives, resolve, pointer), unevaluated, evaluated,
                           len(alternatives))
    if terms is None:
      return None
    alternatives += [{"allOf": [rest, *positives, *term],
                      "unevaluatedProperties": unevaluated} for term in terms]
  lw.log.info("JSON Schema: not/if at %s next to unevaluatedProperties is lowered as %d"
              " branches.", pointer, len(alternatives))
  return {**top, "anyOf": alternatives or [False]}


def lower_any_of(lw, schema: dict, key: str, pointer: str) -> ir.Node:
  """`anyOf` or `oneOf` (`key`) of `schema`, its other keywords applied to each
  alternative; `oneOf` made exact unless its alternatives are disjoint."""
  alternatives = schema[key]
  if not isinstance(alternatives, list) or not alternatives:
    raise errors.SchemaError(
        f"{key} at {_pointer(pointer, key)} is {_short(alternatives)}. Expected a"
        " non-empty array of schemas. Fix the value."
    )
  rest = {k: v for k, v in schema.items() if k != key}
  disjoint = _disjoint(lw, alternatives, pointer)
  if not disjoint and "$unevaluatedProperties" in rest and "$unevaluatedItems" not in rest:
    node = _evaluated_regions(lw, rest, alternatives, key, pointer)
    if node is not None:
      return node
  for name in ("$unevaluatedProperties", "$unevaluatedItems"):
    if name in rest and not disjoint:
      where = _pointer(pointer, name[1:])
      lw.unsupported(where, (
          f"{name[1:]} at {where} next to a {key} whose alternatives may overlap is not"
          " supported (what counts as evaluated depends on every matching alternative)."
          f" Expected alternatives of different types or const tags. Pass lenient=True to"
          f" ignore {name[1:]}."))
      rest.pop(name)
  if key == "oneOf" and not disjoint:
    alternatives = _json_negation.exact_one_of(
        alternatives, lambda ref: lw.resolve(ref, pointer), _pointer(pointer, key))
  nodes = []
  registers = lw.use_registers
  # Objects of two alternatives are read in step while their texts agree, and register
  # markers (`_json_objects.register_object`) of one would fire on the other's bytes:
  # below a union of objects, large objects keep schema order.
  if sum("object" in _shape(lw, a, pointer)[0] for a in alternatives) > 1:
    lw.use_registers = False
  try:
    for i, alternative in enumerate(alternatives):
      where = _pointer(pointer, key, i)
      if _constraining(rest):
        nodes.append(lw.lower_conjunction([(rest, pointer), (alternative, where)], where))
      else:
        nodes.append(lw.lower(alternative, where))
  finally:
    lw.use_registers = registers
  return ir.union(*nodes)


# Most alternatives whose regions (`_evaluated_regions`) are built: 2^n - 1 for anyOf.
_MAX_REGION_ALTERNATIVES = 4
# Most conjunctions (regions times the violations of their negated alternatives).
_MAX_REGION_TERMS = 128
# Keywords past which the properties a (positive) schema evaluates are not its
# `properties` names, or a negation's parts are not plain object keywords.
_DYNAMIC_EVALUATION = frozenset({
    "patternProperties", "additionalProperties", "unevaluatedProperties",
    "$unevaluatedProperties", "anyOf", "oneOf", "not", "if", "then", "else",
    "dependentSchemas", "dependencies", "$dynamicRef", "$recursiveRef", "$someUndeclared",
    "$fromNot", "$unevaluatedItems", "unevaluatedItems"})


def _evaluated_regions(lw, rest: dict, alternatives: list, key: str,
                       pointer: str) -> ir.Node | None:
  """`anyOf`/`oneOf` (`key`) next to `$unevaluatedProperties` U, exactly, where the
  alternatives may overlap: the union over the sets T of alternatives that can match
  together (every non-empty set for anyOf, single ones for oneOf) of "the alternatives
  in T, and none of the others". In region T the evaluated properties are known: the
  `properties` names of `rest` and of T's alternatives. The negated others
  (`_json_negation.negate`) are written in disjunctive normal form, each property they
  name carrying U unless it is evaluated anyway, so merging them evaluates nothing
  that the specification would not. None (the caller refuses) when an alternative or
  `rest` evaluates dynamically (nested anyOf, not, if, ...),
  a negation is not plain object keywords, or past `_MAX_REGION_*`.
  """
  unevaluated = rest["$unevaluatedProperties"]
  n = len(alternatives)
  if n > _MAX_REGION_ALTERNATIVES and key == "anyOf":
    return None
  base = _evaluated_names(lw, {k: v for k, v in rest.items()
                               if k != "$unevaluatedProperties"}, pointer)
  split = [_split_nots(a) for a in alternatives]  # (positive part, its `not`s).
  names = [_evaluated_names(lw, a, pointer) for a, _ in split]
  if base is None or any(v is None for v in names):
    return None
  resolve = lambda ref: lw.resolve(ref, pointer)  # noqa: E731
  try:
    negated = [_json_negation.negate(a, resolve, _pointer(pointer, key, i))
               for i, a in enumerate(alternatives)]
    inner = [[_json_negation.negate(x, resolve, _pointer(pointer, key, i))
              for x in nots] for i, (_, nots) in enumerate(split)]
  except errors.UnsupportedSchemaError:
    return None
  if key == "oneOf":
    regions = [(i,) for i in range(n)]
  else:
    regions = [tuple(i for i in range(n) if mask >> i & 1) for mask in range(1, 1 << n)]
  conjunctions = []
  for region in regions:
    evaluated = base.union(*(names[i] for i in region))
    failing = [negated[j] for j in range(n) if j not in region]
    failing += [x for i in region for x in inner[i]]  # The `not`s of those that match.
    terms = _carried_terms(failing, unevaluated, evaluated, len(conjunctions))
    if terms is None:
      return None
    conjunctions += [(region, term) for term in terms]
  lw.log.info("JSON Schema: %s at %s next to unevaluatedProperties is lowered as %d"
              " conjunctions (regions of the alternatives that match together).",
              key, pointer, len(conjunctions))
  registers = lw.use_registers
  if sum("object" in _shape(lw, a, pointer)[0] for a in alternatives) > 1:
    lw.use_registers = False  # As in `lower_any_of`.
  nodes = []
  try:
    for region, term in conjunctions:
      where = _pointer(pointer, key, region[0])
      branches = [(rest, pointer), *((split[i][0], _pointer(pointer, key, i))
                                     for i in region)]
      branches += [(part, _pointer(pointer, key)) for part in term]
      nodes.append(lw.lower_conjunction(branches, where))
  finally:
    lw.use_registers = registers
  return ir.union(*nodes)


class _Evaluated:
  """The properties a matching schema evaluates: `names`, keys matching `patterns`, or
  every key (`everything`: `additionalProperties`)."""

  def __init__(self, names=(), patterns=(), everything: bool = False):
    self.names, self.patterns, self.everything = set(names), list(patterns), everything

  def union(self, *others: "_Evaluated") -> "_Evaluated":
    return _Evaluated(self.names.union(*(o.names for o in others)),
                      self.patterns + [p for o in others for p in o.patterns],
                      self.everything or any(o.everything for o in others))

  def __contains__(self, name: str) -> bool:
    if self.everything or name in self.names:
      return True
    return any(_json_scalar_schemas.has_text(
        _json_scalar_schemas.pattern_text(p, "#"), name) for p in self.patterns)


def _split_nots(schema) -> tuple[object, list]:
  """(`schema` without the `not`s at its top and in its `allOf` parts, those `not`
  values): a `not` evaluates nothing, so it is carried as a negation
  (`_carry_unevaluated`) beside the positive rest."""
  if not isinstance(schema, dict):
    return schema, []
  nots = [schema["not"]] if "not" in schema else []
  out = {k: v for k, v in schema.items() if k != "not"}
  if isinstance(out.get("allOf"), list):
    parts = []
    for part in out["allOf"]:
      positive, more = _split_nots(part)
      parts.append(positive)
      nots += more
    out["allOf"] = parts
  return out, nots


def _evaluated_names(lw, schema, pointer: str) -> _Evaluated | None:
  """What a matching `schema` evaluates (its `properties`, `patternProperties` and
  `additionalProperties`, through `$ref` and `allOf`), or None where it depends on more
  (`_DYNAMIC_EVALUATION`: nested `anyOf`, `not`, `if`, ...)."""

  def own(k, value, schema):
    del schema
    if k == "patternProperties" and isinstance(value, dict) and all(
        isinstance(p, str) for p in value):
      return _Evaluated(patterns=list(value))
    if k == "additionalProperties":
      return _Evaluated(everything=True)
    if k in _DYNAMIC_EVALUATION:
      return None
    if k == "properties":
      return _Evaluated(names=value) if isinstance(value, dict) else None
    return _Evaluated()

  return evaluated_through(lw, schema, pointer, own, _Evaluated())


def _negations(schemas, resolve, pointer: str):
  """The negation of each schema in turn (`_json_negation.negate`), None for one that
  cannot be negated exactly; lazily, so nothing after a failure is negated."""
  for schema in schemas:
    try:
      yield _json_negation.negate(schema, resolve, pointer)
    except errors.UnsupportedSchemaError:
      yield None


def _carried_terms(negations, unevaluated, evaluated: _Evaluated,
                   already: int) -> list[list] | None:
  """Every choice of one carried form (`_carry_unevaluated`) per negation, each a list of
  conjuncts; None when a negation is None or cannot be carried, or when `already` terms
  plus these would exceed `_MAX_REGION_TERMS`."""
  terms = [[]]
  for negation in negations:
    carried = None if negation is None else _carry_unevaluated(negation, unevaluated,
                                                                evaluated)
    if carried is None:
      return None
    terms = [t + c for t in terms for c in carried]
    if already + len(terms) > _MAX_REGION_TERMS:
      return None
  return terms


def _carry_unevaluated(schema, unevaluated, evaluated: _Evaluated) -> list[list] | None:
  """A negation as a disjunctive normal form (a list of conjunctions, each a list of
  schemas without `anyOf`/`allOf` at their top), every property it names that is not in
  `evaluated` also held to `unevaluated`; None for anything but plain keywords."""
  if schema is False:
    return []
  if schema is True:
    return [[]]
  if not isinstance(schema, dict):
    return None
  own, terms = {}, [[]]
  for k, value in schema.items():
    if k in _DYNAMIC_EVALUATION - {"anyOf"} or k == "$ref":
      return None
    if k in ("anyOf", "allOf"):
      if not isinstance(value, list):
        return None
      parts = [_carry_unevaluated(v, unevaluated, evaluated) for v in value]
      if any(p is None for p in parts):
        return None
      if k == "anyOf":
        terms = [t + c for t in terms for p in parts for c in p]
      else:
        for p in parts:
          terms = [t + c for t in terms for c in p]
      if len(terms) > _MAX_REGION_TERMS:
        return None
    elif k == "properties":
      if not isinstance(value, dict):
        return None
      own[k] = {name: v if name in evaluated else _lazy_all_of(v, unevaluated)
                for name, v in value.items()}
    else:
      own[k] = value
  return [[own, *t] for t in terms]


def _disjoint(lw, alternatives: list, pointer: str) -> bool:
  """Whether no value can match two of `alternatives` (then `oneOf` is `anyOf`).

  A cheap sufficient test: pairwise, the alternatives admit disjoint sets of types, or
  both require a property whose `const`/`enum` values differ (pydantic's
  discriminated unions). Otherwise `oneOf` is made exact by negation.
  """
  shapes = [_shape(lw, a, pointer) for a in alternatives]
  for i, (types_a, tags_a) in enumerate(shapes):
    for types_b, tags_b in shapes[i + 1:]:
      if types_a.isdisjoint(types_b):
        continue
      if any(k in tags_b and tags_a[k].isdisjoint(tags_b[k]) for k in tags_a):
        continue
      return False
  return True


def _shape(lw, schema, pointer: str, depth: int = 0) -> tuple[set, dict]:
  """(types a schema admits, {required key: its allowed const/enum values (as JSON)})."""
  if schema is False:
    return set(), {}
  if not isinstance(schema, dict) or depth > 8:
    return set(_TYPES), {}
  if "$ref" in schema and isinstance(schema["$ref"], str) and len(schema) == 1:
    return _shape(lw, lw.resolve(schema["$ref"], pointer), pointer, depth + 1)
  if "type" in schema:
    names = schema["type"]
    types = set([names] if isinstance(names, str) else names if isinstance(names, list)
                else _TYPES)
    if "number" in types:
      types.add("integer")
  elif "enum" in schema or "const" in schema:
    values = schema["enum"] if "enum" in schema else [schema["const"]]
    types = {_json_type(v) for v in values} if isinstance(values, list) else set(_TYPES)
    if "integer" in types:
      types.add("number")
  else:
    types = set(_TYPES)
  tags = {}
  properties = schema.get("properties")
  required = schema.get("required", [])
  if isinstance(properties, dict) and isinstance(required, list):
    for key in required:
      sub = properties.get(key)
      if isinstance(sub, dict) and ("const" in sub or isinstance(sub.get("enum"), list)):
        values = [sub["const"]] if "const" in sub else sub["enum"]
        tags[key] = {json.dumps(v, sort_keys=True) for v in values}
  return types, tags
