"""JSON Schema front end: a schema -> the constraint IR of the JSON texts it accepts.

Public functions and classes:
  SchemaOptions                     how to lower: whitespace, strictness, depth bounds.
  lower_json_schema(schema, opts)   (IR node or recursive GrammarIR, ignored keyword pointers).
  pattern_ir(pattern)               decoded strings in which `pattern` matches (search).
  format_ir(name)                   decoded strings of a `format` (date-time, uuid, ...).
  FORMATS                           the supported `format` names.

Without recursive `$ref`s the set of JSON texts a schema accepts is (with the narrowings
below) a regular language (paper Sec. 5.1), built from the pieces of `_json_values.py`.
A recursive `$ref` makes it context-free: it becomes a grammar rule (see "Recursive
`$ref`" below) and compiles to a push-down automaton, unless `max_ref_depth` bounds
it back to a regular language. Dialect: draft 2020-12, plus draft-07's `definitions`, array-form
`items` with `additionalItems`, and draft-04's boolean `exclusiveMinimum`/`Maximum`.

Supported keywords:
  any type    type (a name or a list), enum, const, anyOf, oneOf (exact), allOf, $ref,
              $defs, definitions, not, if/then/else, dependentSchemas (see "Boolean
              structure" below). Next to enum/const, string and number keywords filter the
              values they apply to (exactly: text automata, exact decimals).
  string      minLength, maxLength (in code points), pattern, format (together:
              their intersection, `_intersect.py`).
  integer     minimum, maximum, exclusiveMinimum, exclusiveMaximum (exact ranges).
  number      the same (decimal bounds too: 0.25 <= x < 2.5 is exact).
  object      properties, required, dependentRequired (and draft-07 `dependencies`
              with arrays), additionalProperties, propertyNames (type, pattern,
              format, minLength, maxLength, enum, const), patternProperties (one
              pattern; a declared key it matches must satisfy both schemas),
              minProperties, maxProperties.
  array       items, prefixItems, additionalItems, minItems, maxItems, uniqueItems (true:
              for items with at most `MAX_UNIQUE_VALUES` = 8 values, such as enums,
              booleans or small integer ranges: every set of distinct values, in any
              order; pydantic's `set[SomeEnum]`), contains with minContains and
              maxContains (next to items; not with prefixItems or item counts).
  ignored     title, description, examples, default, $schema, $id, id (draft-04),
              $comment, deprecated, readOnly, writeOnly, $anchor, $dynamicAnchor,
              $recursiveAnchor, $vocabulary (annotations: no effect on validity).
  unevaluated unevaluatedProperties, unevaluatedItems: without applicators they are
              additionalProperties / items where those are absent; next to allOf and
              $ref they apply to the merged schema; next to anyOf/oneOf, per
              alternative (see `_unevaluated`).
Unknown keywords (`x-*` extensions, OpenAPI's `nullable` and `example`, draft-04
hyper-schema `links`, misspellings such as `decsription`) and unknown `format` names are
annotations, as the specification says: ignored, logged, and listed by
`JsonSchema.ignored_keywords()` as JSON pointers (e.g. `#/properties/c/x-kind`). `then`
and `else` without `if`, `if` alone, and `minContains`/`maxContains` without `contains`
have no effect and are dropped. The standard assertion keywords that are not enforced
(`$dynamicRef`, `$recursiveRef`, and the cases listed under "Boolean structure") raise
`UnsupportedSchemaError` naming the keyword and its JSON pointer (e.g.
`#/properties/tags/contains`), unless `lenient=True`: then they are ignored and listed
by `ignored_keywords()` too; ignoring an assertion may *widen* the language, so lenient
output can violate it. Strict mode never widens.

Narrowings made for generation (every generated text is valid; some valid texts are
not generated):
* Whitespace, numbers and string escapes: see `_json_values.py` (policies `compact`,
  `single`, `flexible` with a cap on whitespace runs; no leading zeros, no `-0`; bounded
  numbers without exponent; canonical escapes in keys, constants and patterned strings).
* Integers are written without fraction or exponent (`1.0` is not generated for
  `integer`).
* Property order (`property_order`). `"any"` (default): the declared properties
  (`properties`, then `required` and `dependentRequired` names that `properties` does
  not declare) in any order, each at most once, `required` and `dependentRequired`
  enforced, additional properties anywhere between them (`_json_objects.py`: an
  automaton over the set of declared keys written, exact). It writes each value about
  2^(n-1) times for n members, so an object whose members would exceed
  `MAX_ANY_ORDER_SIZE` IR nodes, one with `minProperties`/`maxProperties`, or one with
  a recursive member keeps schema order (logged; `dependentRequired` there raises).
  `"schema"`: declared properties in schema order, optional ones skippable,
  additional properties only after them (linear size). Additional properties have keys
  that are any string except the declared keys; two additional properties may share a
  key (preventing it is not regular; each value is valid, so is whichever a parser
  keeps). With
  `patternProperties`, undeclared keys are generated only if they match its pattern
  (values per its schema): keys matching no pattern, which `additionalProperties`
  (absent: any value) would allow, are not generated. Towards `minProperties` only
  the first additional property counts (later ones may repeat its key, and a parser
  keeps one), so a minimum that needs two or more additional properties raises
  `UnsupportedSchemaError`.
  `strict_properties=True` forbids additional properties in objects that declare
  `properties` or `required` unless `additionalProperties` is an explicit schema;
  `{"type": "object"}` alone stays a free-form object.
* Free-form values (`{}`, `true`, absent `items`, additional property values) are
  schema-free JSON nested at most `free_form_depth` containers deep.
* `enum` and `const` values are written as `json.dumps` writes them (objects in their
  given key order, whitespace per policy); `1` does not also match `1.0`.
* A schema without `type` takes the types its keywords apply to (`{"properties": ...}`
  is an object, `{"minLength": 1}` a string); with no such keyword, any value.
* Boolean structure (`_json_negation.py`): `not S` is lowered as the schema of the
  values S rejects, built keyword by keyword from the specification (a number below
  `minimum`, an object without a `required` key, ...), so it is exact whatever the
  lowering narrows elsewhere. `if I then T else E` is `anyOf: [I and T, not-I and E]`;
  `dependentSchemas: {k: D}` (and draft-07 `dependencies` with schemas) is "no key k,
  or k and D". `oneOf` is `anyOf` when its alternatives are disjoint (different types,
  or a required property with different `const`/`enum` values: pydantic's
  discriminated unions), else each alternative with the negation of every other one
  (exact; at most 8 alternatives). Values that exclude constants or multiples are
  written as canonical decimals (no exponent, no trailing zeros), so no other spelling
  of an excluded number slips through. Negation is refused (`UnsupportedSchemaError`
  naming the keyword) for `pattern`, known `format`s, `uniqueItems`, `propertyNames`,
  `patternProperties`, `additionalProperties` other than true, `unevaluated*`,
  recursive `$ref`s, and enum/const object or array values; `unevaluated*` next to
  `not`/`if` is refused too (their annotations do not count). Merging the resulting
  `anyOf`s under `allOf` is bounded like any `allOf` (64 alternatives).
* `allOf` is merged keyword by keyword (types intersected, bounds tightened,
  `properties` merged with each side's `additionalProperties`, `required` united,
  `pattern`s and `format`s all applied); draft-04 boolean exclusive bounds on both
  sides raise `UnsupportedSchemaError`.
* `$ref` next to other keywords (allowed since 2019-09) means `allOf` of the target and
  the siblings; the target's properties come first. Draft-07 `additionalItems` without
  array-form `items` has no effect and is dropped.
* Recursive `$ref` (a `$ref` met again while its own target is being lowered). By
  default (`max_ref_depth=None`) each recursive target, merged with its `$ref` siblings
  and `allOf` parts as above, becomes one rule of a `_grammar.GrammarIR` whose body
  refers to it (and to other recursive targets) by `RuleRef`; the grammar is
  normalized (`_grammar.normalize`) and compiled to a push-down automaton, so nesting is
  unbounded up to the runtime's `CompileOptions.stack_depth` (deeper sets the row's
  `error`). The grammar must be deterministic with one byte of lookahead. An `anyOf`
  that calls a recursive target next to alternatives starting with the same byte
  (pydantic's union of recursive models, `Add | Num`) becomes a rule of its own, so
  that one rule's automaton tells the alternatives apart; alternatives that are still
  alike where a recursive `$ref` is entered (`{"anyOf": [{"$ref": "#/$defs/tree"},
  {"type": "object"}]}`) raise `NondeterministicGrammarError` at compile time.
  Schemas without recursion lower exactly as before, to one regular IR node. A `$ref`
  chain that returns to itself with no JSON in between (`{"$ref": "#"}` at the root,
  `allOf` of itself) accepts nothing finite and raises `SchemaError`, as does
  recursion without an alternative that ends it. With `max_ref_depth=N`, a recursive
  `$ref` is instead expanded at most N times along any path (a regular language);
  deeper, the alternative that needs it is dropped (an optional property is omitted, an
  array stays shorter, an `anyOf` branch disappears), and if nothing is left the schema
  is rejected with `UnsupportedSchemaError`. Only local refs (`#...` JSON pointers).
* `pattern` has search semantics, as in JSON Schema: `p` accepts strings containing a
  match, i.e. `(?s:.*)(?:p)(?s:.*)`, except that `^`/`\\A` at the start and `$`/`\\Z` at
  the end of the pattern (or of one of its top-level alternatives) anchor that side;
  anchors elsewhere raise. Syntax and semantics are Python's `re` with ASCII classes
  (`\\d` = [0-9], like ECMAScript); `$` matches only at the very end (ECMAScript), not
  before a final newline (Python). Python's validators use Unicode `\\d`, `\\w`, so
  `\\D`, `\\W` here admit non-ASCII digits and letters that Python would reject.
* String lengths count code points; `pattern`, `format` and `minLength`/`maxLength` in
  one schema combine exactly (`_intersect.py`: a product automaton over characters,
  refused past 100k states). A bounded `maxLength` costs one automaton state per
  length, each allowing most tokens.
* Number bounds are exact decimals on `number` (written without exponent when bounded)
  and are rounded exactly on `integer`. `multipleOf` is exact too (any decimal step:
  `0.01` allows at most two significant decimals; a number with a step is written
  without exponent); its automaton has about D * (places + 3) states, where D is the
  step's numerator times 10^places over its denominator (5 for 5, 25 for 0.25), and is
  refused past 100k.
* Formats (decoded values; uppercase `T` and `Z` only; no leap seconds):
  date (RFC 3339 full-date with month lengths and leap years, years 0001-9999),
  time (full-time: `hh:mm:ss[.frac]` then `Z` or `+hh:mm`/`-hh:mm`), date-time (`dateTtime`),
  uuid (8-4-4-4-12 hex digits, any case), ipv4 (dotted quad, no leading zeros),
  ipv6 (RFC 4291 text forms, embedded IPv4 included, no zone ids),
  hostname (1 to 8 dot-separated RFC 1123 labels of 1-30 characters, so the 253
  character limit holds), email (a dot-atom local part `@` a hostname: no quoted
  local parts, no IP literals, the 64-character local-part limit is not enforced),
  uri (RFC 3986 `URI`: scheme, hierarchical part, query, fragment; no IPvFuture),
  duration (RFC 3339 Appendix A, `P1Y2M3DT4H5M6S`, `P2W`; seconds may have a decimal
  fraction, as ISO 8601 and pydantic's timedelta write them).
  The OpenAPI hints `password` and `binary` and pydantic's `path` denote any string.
* The content keywords (`contentEncoding`, `contentMediaType`, `contentSchema`) are
  annotations in draft 2020-12 and are ignored like `title`, and so is OpenAPI's
  `discriminator` (pydantic writes it next to a discriminated union's `oneOf`, whose
  alternatives then differ in a `const`, so lowering them as `anyOf` is exact).
"""

import collections
import dataclasses
import fractions
import functools
import json
import math
import re
import logging
import urllib.parse

from constrained_decoding import errors
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _difference
from constrained_decoding.constraints import _intersect
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_negation
from constrained_decoding.constraints import _json_objects
from constrained_decoding.constraints import _json_values as jv
from constrained_decoding.constraints import _regex

_log = logging.getLogger(__name__)

_ANNOTATIONS = frozenset({
    "title", "description", "examples", "default", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly",
    "contentEncoding", "contentMediaType", "contentSchema",  # Annotations since 2019-09.
    "discriminator",  # OpenAPI's hint on a oneOf (pydantic's discriminated unions).
    "id",  # Draft-04's `$id`.
    # Identifiers and vocabulary declarations: they name places, they assert nothing.
    "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary",
})
_DEFINITIONS = frozenset({"$defs", "definitions"})
_NO_CONSTRAINT = _ANNOTATIONS | _DEFINITIONS
# Keyword -> the instance type it constrains (used when `type` is absent).
_TYPE_OF_KEYWORD = {
    "minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
    "minimum": "number", "maximum": "number", "exclusiveMinimum": "number",
    "exclusiveMaximum": "number", "multipleOf": "number",
    "properties": "object", "required": "object", "additionalProperties": "object",
    "propertyNames": "object", "patternProperties": "object",
    "unevaluatedProperties": "object", "$unevaluatedProperties": "object",
    "dependentRequired": "object", "$notMultipleOf": "number",
    "contains": "array", "minContains": "array", "maxContains": "array",
    "items": "array", "prefixItems": "array", "additionalItems": "array",
    "unevaluatedItems": "array", "$unevaluatedItems": "array",
    "minItems": "array", "maxItems": "array", "uniqueItems": "array",
    "minProperties": "object", "maxProperties": "object",
}
_SUPPORTED = frozenset({
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$notIn", *_TYPE_OF_KEYWORD,
})
# Standard assertion keywords this library does not enforce (yet): refused unless lenient.
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
# Most IR nodes an any-order object may hold (members times the subsets each is written
# from, `_json_objects`); past it the object keeps schema order.
MAX_ANY_ORDER_SIZE = 2_000
_MAX_PRODUCT = 64  # Most alternatives `allOf` of two `anyOf`s may multiply into.
# Most distinct item values `uniqueItems: true` is supported for (2^N subset states).
MAX_UNIQUE_VALUES = 8
_NUMBER = (int, float, fractions.Fraction)  # Fractions: merged `multipleOf`s.
# Keyword -> (types, description) its value must have for `allOf` merging.
_MERGE_SHAPES = {
    "type": ((str, list), "a type name or list"), "enum": (list, "an array"),
    "required": (list, "an array of names"), "anyOf": (list, "an array of schemas"),
    "oneOf": (list, "an array of schemas"),
    "properties": (dict, "an object"), "prefixItems": (list, "an array of schemas"),
    **{k: (_NUMBER, "a number") for k in ("minimum", "maximum", "exclusiveMinimum",
                                          "exclusiveMaximum", "minLength", "maxLength",
                                          "minItems", "maxItems", "multipleOf")},
}


@dataclasses.dataclass(frozen=True)
class SchemaOptions:
  """How a schema is lowered (see `JsonSchema` for the user-facing arguments).

  Attributes:
    whitespace: Where whitespace may go.
    strict_properties: Forbid additional properties unless given by a schema.
    lenient: Ignore (and record) unsupported keywords instead of raising.
    max_ref_depth: None: recursive `$ref`s become grammar rules (unbounded nesting).
      N: most expansions of one recursive `$ref` along a path (a regular language).
    free_form_depth: Nesting limit of free-form values.
    property_order: "any" (declared keys in any order, each at most once) or
      "schema" (in the order `properties` lists them).
  """

  whitespace: jv.Whitespace = jv.Whitespace()
  strict_properties: bool = False
  lenient: bool = False
  max_ref_depth: int | None = None
  free_form_depth: int = 2
  property_order: str = "any"


def lower_json_schema(
    schema, options: SchemaOptions
) -> tuple[ir.Node | _grammar.GrammarIR, tuple[str, ...]]:
  """The language of the JSON texts `schema` accepts, under the narrowings of the module doc.

  Args:
    schema: A JSON Schema as Python values (dict or bool, as from `json.loads`).
    options: Lowering options.

  Returns:
    The language and, in lenient mode, the JSON pointers of the keywords ignored (or
    rounded), in the order met. The language is a regular IR node, or, when recursion
    is left (`max_ref_depth=None` and a recursive `$ref` that normalization keeps), a
    normalized `GrammarIR` whose rules are the recursive `$ref` targets.

  Raises:
    SchemaError: The schema is malformed or accepts no JSON value.
    UnsupportedSchemaError: It uses a keyword or combination that is not supported.
  """
  lowerer = _Lowerer(schema, options)
  if options.max_ref_depth is None and isinstance(schema, dict):
    node = lowerer.lower_root(schema)
    if lowerer.rules:
      return _recursive_grammar(schema, node, lowerer.rules), tuple(lowerer.ignored)
  else:
    node = lowerer.lower(schema, "#")
  if node == ir.NOTHING:
    if lowerer.cut:
      raise errors.UnsupportedSchemaError(
          f"Recursive $ref {lowerer.cut[0]!r} has no non-recursive alternative within"
          f" max_ref_depth={options.max_ref_depth}. Expected an optional property, a"
          " possibly empty array or an anyOf branch that ends the recursion. Add one, or"
          " raise max_ref_depth."
      )
    raise _unsatisfiable(schema)
  return node, tuple(lowerer.ignored)


def _unsatisfiable(schema) -> errors.SchemaError:
  return errors.SchemaError(
      f"JSON Schema {_short(schema)} accepts no JSON value. Expected a satisfiable"
      " schema. Look for contradictory keywords (minimum > maximum, an empty enum, a"
      " required property whose schema is false, ...)."
  )


def _recursive_grammar(schema, root: ir.Node, rules: dict[str, ir.Node]):
  """The normalized grammar of the root's IR and the rules of recursive `$ref` targets.

  Returns a regular IR node instead when normalization leaves no recursion (as for
  `{"anyOf": [{"$ref": "#"}, {"type": "null"}]}`, which is just `null`).

  Raises:
    SchemaError: The start derives no finite JSON text (recursion that never ends).
  """
  memo: dict = {}
  # The grammar analyses and the push-down builder work on plain IR.
  root = ir.inline_fragments(root)
  rules = {name: ir.inline_fragments(body) for name, body in rules.items()}
  bodies = {name: _without_rule_graphs(body, memo) for name, body in rules.items()}
  if isinstance(root, ir.RuleRef):
    start = root.name
  else:
    start = next(n for n in ("#", "# (root)") if n not in bodies)
    bodies = {start: _without_rule_graphs(root, memo), **bodies}
  grammar = _grammar.GrammarIR(start, tuple(bodies.items()))
  productive = _grammar.productive_rules(grammar)
  if start not in productive:
    dead = [name for name in rules if name not in productive]
    if not dead:
      raise _unsatisfiable(schema)
    raise errors.SchemaError(
        f"Recursive $ref {dead[0]!r} never ends: every alternative of its target refers"
        f" to {dead} again, so the schema accepts no finite JSON value. Expected an"
        " optional property, a possibly empty array or an anyOf branch that ends the"
        " recursion. Add one."
    )
  grammar = _grammar.normalize(_lift_overlapping_unions(grammar))
  if not _grammar.recursive_rules(grammar):
    return _grammar.to_regular(grammar)
  return grammar


_MAX_LIFTS = 32  # Unions `_lift_overlapping_unions` turns into rules, at most.
_ALL_BYTES = frozenset(range(256))
_UTF8_LEADS = frozenset(range(0xC2, 0xF5))


def _lift_overlapping_unions(grammar: _grammar.GrammarIR) -> _grammar.GrammarIR:
  """Turns each union that calls a rule and may start like another alternative into a rule.

  `{"anyOf": [{"$ref": "#/$defs/Add"}, {"$ref": "#/$defs/Num"}]}` inside `Add` (what
  pydantic writes for a recursive union of models) is `Add | Num` with `Add` a rule:
  both start with `{`, and a push-down automaton must decide at the `{` whether to
  call `Add`, which one byte of lookahead cannot. The union `u` becomes the rule
  `U = Add' | Num'` (each rule alternative replaced by its body, `u` by `U` everywhere),
  so the choice is made inside one rule, by its DFA. Unions whose alternatives start
  with different bytes (`Node | null`) are left alone.
  """
  rules = dict(grammar.rules)
  for _ in range(_MAX_LIFTS):
    union = _overlapping_union(rules)
    if union is None:
      break
    called = [a.name for a in union.alternatives if isinstance(a, ir.RuleRef) and a.name in rules]
    taken = set(rules)
    base = " | ".join(called) + (" | ..." if len(called) < len(union.alternatives) else "")
    name = next(n for n in (base, *(f"{base} ({i})" for i in range(2, len(taken) + 3)))
                if n not in taken)
    lifted = ir.RuleRef(name)
    memo: dict = {}
    rules = {r: _replace_node(body, union, lifted, memo) for r, body in rules.items()}
    rules[name] = ir.union(*(rules[a.name] if isinstance(a, ir.RuleRef) and a.name in rules
                             else _replace_node(a, union, lifted, memo)
                             for a in union.alternatives))
  return grammar.replace_rules(rules)


def _overlapping_union(rules: dict[str, ir.Node]) -> ir.Union | None:
  """A union with a rule alternative whose first bytes meet another alternative's."""
  firsts = _rule_firsts(rules)
  memo: dict = {}
  seen: set[int] = set()
  stack = list(rules.values())
  while stack:
    node = stack.pop()
    if id(node) in seen:
      continue
    seen.add(id(node))
    if isinstance(node, ir.Union) and any(isinstance(a, ir.RuleRef) for a in node.alternatives):
      starts = [_first(a, firsts, memo)[0] for a in node.alternatives]
      for i, a in enumerate(node.alternatives):
        if isinstance(a, ir.RuleRef) and any(
            starts[i] & other for j, other in enumerate(starts) if j != i):
          return node
    stack.extend(_grammar.children(node))
  return None


def _rule_firsts(rules: dict[str, ir.Node]) -> dict:
  """Rule -> (bytes a string of it may start with, whether it is nullable): a fixpoint."""
  firsts = {name: (frozenset(), False) for name in rules}
  changed = True
  while changed:
    changed = False
    memo: dict = {}
    for name, body in rules.items():
      value = _first(body, firsts, memo)
      if value != firsts[name]:
        firsts[name] = value
        changed = True
  return firsts


def _first(node: ir.Node, firsts: dict, memo: dict) -> tuple[frozenset, bool]:
  """(first bytes, nullable) of `node`, over-approximated for graphs and terminals."""
  hit = memo.get(id(node))
  if hit is not None:
    return hit[1]
  if isinstance(node, ir.Bytes):
    value = (frozenset(node.data[:1]), not node.data)
  elif isinstance(node, ir.CharClass):
    ascii_bytes = {b for lo, hi in node.ranges for b in range(lo, min(hi, 0x7F) + 1)}
    wide = any(hi > 0x7F for _, hi in node.ranges)
    value = (frozenset(ascii_bytes) | (_UTF8_LEADS if wide else frozenset()), False)
  elif isinstance(node, ir.ByteClass):
    value = (frozenset(b for lo, hi in node.ranges for b in range(lo, hi + 1)), False)
  elif isinstance(node, ir.Concat):
    out, nullable = frozenset(), True
    for part in node.parts:
      part_first, part_nullable = _first(part, firsts, memo)
      out |= part_first
      if not part_nullable:
        nullable = False
        break
    value = (out, nullable)
  elif isinstance(node, ir.Union):
    pairs = [_first(a, firsts, memo) for a in node.alternatives]
    value = (frozenset().union(*(f for f, _ in pairs)), any(n for _, n in pairs))
  elif isinstance(node, ir.Repeat):
    inner, nullable = _first(node.node, firsts, memo)
    value = (inner, nullable or node.min == 0)
  elif isinstance(node, ir.RuleRef):
    value = firsts.get(node.name, (frozenset(), False))
  elif isinstance(node, ir.Graph):
    value = (frozenset().union(*(_first(label, firsts, memo)[0] for _, label, _ in node.arcs)),
             0 in node.finals)
  else:  # Terminal: any token.
    value = (_ALL_BYTES, False)
  memo[id(node)] = (node, value)
  return value


def _replace_node(node: ir.Node, old: ir.Node, new: ir.Node, memo: dict) -> ir.Node:
  """`node` with every sub-node equal to `old` replaced by `new` (graphs: not entered)."""
  hit = memo.get(id(node))
  if hit is not None:
    return hit[1]
  if node == old:
    out = new
  elif isinstance(node, ir.Concat):
    parts = [_replace_node(p, old, new, memo) for p in node.parts]
    out = node if all(a is b for a, b in zip(parts, node.parts)) else _grammar.concat(*parts)
  elif isinstance(node, ir.Union):
    alts = [_replace_node(a, old, new, memo) for a in node.alternatives]
    out = node if all(a is b for a, b in zip(alts, node.alternatives)) else ir.union(*alts)
  elif isinstance(node, ir.Repeat):
    inner = _replace_node(node.node, old, new, memo)
    out = node if inner is node.node else _grammar.repeat(inner, node.min, node.max)
  else:
    out = node
  memo[id(node)] = (node, out)
  return out


def _conjunction_key(flat: list) -> str:
  """The content of flattened (schema, pointer) conjuncts, as JSON text."""
  return json.dumps([s for s, _ in flat], ensure_ascii=False, separators=(",", ":"))


def _has_rule_ref(node: ir.Node, memo: dict) -> bool:
  """Whether `node` (graph arcs included) contains a `RuleRef`; memoized by identity."""
  hit = memo.get(id(node))
  if hit is None:
    if isinstance(node, ir.RuleRef):
      found = True
    elif isinstance(node, ir.Graph):
      found = any(_has_rule_ref(label, memo) for _, label, _ in node.arcs)
    else:
      found = any(_has_rule_ref(c, memo) for c in _grammar.children(node))
    hit = memo[id(node)] = (node, found)  # Keeps `node` alive so that its id stays unique.
  return hit[1]


def _without_rule_graphs(node: ir.Node, memo: dict) -> ir.Node:
  """`node` with each `ir.Graph` that contains a `RuleRef` rewritten as Concat/Union/Repeat.

  The grammar analyses and the push-down builder do not look inside graphs, so a rule
  reference must not hide in one (`separated` arrays of a recursive item, `_members`
  with a recursive additional property). Graphs without references stay as they are.
  """
  refs: dict = {}

  def walk(n: ir.Node) -> ir.Node:
    hit = memo.get(id(n))
    if hit is not None:
      return hit[1]
    if not _has_rule_ref(n, refs):
      out = n
    elif isinstance(n, ir.Graph):
      out = _graph_expression(n.num_states,
                              [(s, walk(label), t) for s, label, t in n.arcs], n.finals)
    elif isinstance(n, ir.Concat):
      out = _grammar.concat(*(walk(p) for p in n.parts))
    elif isinstance(n, ir.Union):
      out = ir.union(*(walk(a) for a in n.alternatives))
    elif isinstance(n, ir.Repeat):
      out = _grammar.repeat(walk(n.node), n.min, n.max)
    else:
      out = n
    memo[id(n)] = (n, out)
    return out

  return walk(node)


def _graph_expression(num_states: int, arcs: list, finals) -> ir.Node:
  """The language of an `ir.Graph` as one expression, by state elimination.

  States go in order of fewest (incoming x outgoing) arcs, which for the small graphs
  of `separated` and `_members` writes each label at most twice.
  """
  start, final = num_states, num_states + 1
  edges: dict[tuple[int, int], ir.Node] = {}

  def add(source: int, target: int, label: ir.Node) -> None:
    old = edges.get((source, target))
    edges[(source, target)] = label if old is None else ir.union(old, label)

  add(start, 0, ir.EPSILON)
  for source, label, target in arcs:
    add(source, target, label)
  for state in finals:
    add(state, final, ir.EPSILON)
  remaining = set(range(num_states))
  while remaining:
    def cost(q: int) -> tuple[int, int]:
      ins = sum(1 for s, t in edges if t == q and s != q)
      outs = sum(1 for s, t in edges if s == q and t != q)
      return ins * outs, q
    k = min(remaining, key=cost)
    remaining.discard(k)
    loop = edges.pop((k, k), None)
    middle = ir.EPSILON if loop is None else _grammar.repeat(loop, 0, None)
    incoming = [(s, edges.pop((s, t))) for s, t in list(edges) if t == k]
    outgoing = [(t, edges.pop((s, t))) for s, t in list(edges) if s == k]
    for source, before in incoming:
      for target, after in outgoing:
        add(source, target, _grammar.concat(before, middle, after))
  return edges.get((start, final), ir.NOTHING)


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


class _Lowerer:
  """Walks one schema; holds the root (for `$ref`), options and what was ignored.

  With `max_ref_depth=None`, the conjunctions being lowered that went through a `$ref`
  are tracked by content (`active`); meeting one again inside itself makes it a rule:
  the inner occurrence becomes `RuleRef(name)` and the outer one registers its body in
  `rules` (name: the JSON pointer of its first `$ref`) and returns the `RuleRef` too.
  """

  def __init__(self, root, options: SchemaOptions):
    self.root = root
    self.options = options
    self.ws = options.whitespace
    self.ignored: list[str] = []
    self.cut: list[str] = []
    self.expanding: collections.Counter = collections.Counter()
    self.any_value = jv.json_value(self.ws, options.free_form_depth)
    # A schema-free property value (additional properties, `{}`/`true` properties): one
    # fragment that the compiler composes with the vocabulary once and splices into
    # every schema (`automata/_splice.py`).
    # (Its leading whitespace goes inside: the fragment must be all that may come next.)
    self.extra_value = jv.json_value_fragment(self.ws, options.free_form_depth,
                                              leading_gap=True)
    self.extra_colon = (self.ws.colon if self.ws.gap == ir.EPSILON
                        else ir.concat(self.ws.gap, ir.Bytes(b":")))
    self.chain: list[str] = []  # `$ref`s being flattened, outermost first.
    self.active: set[str] = set()  # Keys of the conjunctions being lowered.
    self.names: dict[str, str] = {}  # Key -> rule name, once met inside itself.
    self.rules: dict[str, ir.Node] = {}  # Rule name -> body, once lowered.
    self.root_flat: list | None = None  # The root's conjuncts, and their key ("#").
    self.root_key: str | None = None

  # ---- Errors and lenient records. ----

  def unsupported(self, pointer: str, message: str) -> None:
    """Raises `UnsupportedSchemaError(message)`, or records `pointer` when lenient."""
    if not self.options.lenient:
      raise errors.UnsupportedSchemaError(message)
    if pointer not in self.ignored:
      self.ignored.append(pointer)

  def annotation(self, pointer: str) -> None:
    """Records an ignored annotation (unknown keyword or `format`) at `pointer`."""
    if pointer not in self.ignored:
      self.ignored.append(pointer)
      _log.info("JSON Schema: %s is not an assertion this library knows; ignored as an"
                " annotation.", pointer)

  def _check(self, schema: dict, pointer: str) -> dict:
    """Drops annotations; refuses (or, lenient, drops) unsupported assertion keywords.

    Unknown keywords are annotations (JSON Schema 2020-12, section 6.5): ignored and
    recorded, never an error. So are keywords without the one they depend on (`then`
    without `if`) and `if` alone, which assert nothing.
    """
    dropped = []
    if "dependencies" in schema:  # Draft-07: dependentRequired + dependentSchemas.
      schema = _split_dependencies(schema, pointer)
    if any(k in schema for k in _BOOLEAN) and (
        "if" not in schema or "then" in schema or "else" in schema):
      schema = self._rewrite_boolean(schema, pointer)
    if "unevaluatedProperties" in schema or "unevaluatedItems" in schema:
      schema = _unevaluated(schema)
    for key in schema:
      if key in _ANNOTATIONS or key in _DEFINITIONS or key in _SUPPORTED:
        continue
      where = _pointer(pointer, key)
      if key in _NEEDS and _NEEDS[key] not in schema or key == "if" and not (
          "then" in schema or "else" in schema):
        pass  # No effect on validity.
      elif key in _UNSUPPORTED:
        self.unsupported(where, (
            f"JSON Schema keyword {key!r} at {where} is not supported. Expected only the"
            " keywords listed in the JsonSchema documentation. Remove it, or pass"
            " lenient=True to ignore it (the output may then violate it)."))
      else:
        self.annotation(where)
      dropped.append(key)
    if not dropped:
      return schema
    return {k: v for k, v in schema.items() if k not in dropped}

  def _rewrite_boolean(self, schema: dict, pointer: str) -> dict:
    """`not`, `if`/`then`/`else`, `dependentSchemas` as `allOf` parts (`_json_negation`).

    Annotations from `not` and a failed `if` do not count for `unevaluated*`, but the
    rewritten parts would: that combination is refused.
    """
    for key in ("unevaluatedProperties", "unevaluatedItems"):
      if key in schema and ("not" in schema or "if" in schema):
        where = _pointer(pointer, key)
        self.unsupported(where, (
            f"{key} at {where} next to not or if is not supported (their annotations do"
            " not count as evaluated). Expected one of them. Remove one, or pass"
            f" lenient=True to ignore {key}."))
        schema = {k: v for k, v in schema.items() if k != key}
    resolve = lambda ref: self._resolve(ref, pointer)  # noqa: E731
    try:
      return _json_negation.rewrite_boolean(schema, resolve, pointer)
    except errors.UnsupportedSchemaError as e:
      if not self.options.lenient:
        raise
      for key in _BOOLEAN:
        if key in schema:
          self.unsupported(_pointer(pointer, key), str(e))
      return {k: v for k, v in schema.items()
              if k not in (*_BOOLEAN, "then", "else")}

  def _schema_dict(self, schema, pointer: str) -> dict:
    if not isinstance(schema, dict):
      raise errors.SchemaError(
          f"Schema {_short(schema)} at {pointer} is a {type(schema).__name__}. Expected"
          " an object or a boolean. Wrap constraints in an object, e.g. {\"type\": ...}."
      )
    return schema

  # ---- Entry points. ----

  def lower(self, schema, pointer: str) -> ir.Node:
    """The IR of one (sub)schema; `pointer` locates it for error messages."""
    if schema is True:
      return self.any_value
    if schema is False:
      return ir.NOTHING
    schema = self._check(self._schema_dict(schema, pointer), pointer)
    if "$ref" in schema or "allOf" in schema:
      return self._lower_conjunction([(schema, pointer)], pointer)
    return self._lower_plain(_normalize(schema, pointer), pointer)

  def lower_root(self, schema: dict) -> ir.Node:
    """`lower(schema, "#")`, but as a conjunction that `{"$ref": "#"}` can recurse into."""
    return self._lower_conjunction([(schema, "#")], "#", root=True)

  def _resolve(self, ref, pointer: str):
    """The subschema a local `$ref` points to."""
    where = _pointer(pointer, "$ref")
    if not isinstance(ref, str):
      raise errors.SchemaError(
          f"$ref {ref!r} at {where} is not a string. Expected a JSON pointer such as"
          " '#/$defs/Name'. Fix the reference."
      )
    if not ref.startswith("#") or (len(ref) > 1 and not ref.startswith("#/")):
      raise errors.UnsupportedSchemaError(
          f"$ref {ref!r} at {where} is not a local JSON pointer. Expected '#' or"
          " '#/...' into this schema. Inline remote schemas and $anchor targets into"
          " $defs and refer to them as '#/$defs/Name'."
      )
    node = self.root
    for token in ref[2:].split("/") if len(ref) > 1 else ():
      token = urllib.parse.unquote(token).replace("~1", "/").replace("~0", "~")
      if isinstance(node, dict) and token in node:
        node = node[token]
      elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
        node = node[int(token)]
      else:
        raise errors.SchemaError(
            f"$ref {ref!r} at {where} does not resolve: no {token!r} there. Expected a"
            " pointer to a subschema of this document. Fix the pointer or add the"
            " definition under $defs."
        )
    return node

  def _lower_conjunction(self, branches: list, pointer: str, *, root: bool = False) -> ir.Node:
    """`allOf` of (schema, pointer) branches: `$ref`s resolved, `allOf`s flattened, merged.

    A branch's `$ref` target and `allOf` parts come before its own keywords (so the
    properties of a referenced base come first). With `max_ref_depth=N`, each `$ref`
    met here counts as one expansion while the merged schema is lowered; with None, a
    conjunction through a `$ref` (or the `root`) may become a rule (`_lower_rule`).
    """
    flat, refs = [], []
    for schema, where in branches:
      if not self._flatten(schema, where, flat, refs):
        return ir.NOTHING
    if not flat:
      merged, where = {}, pointer
    elif len(flat) == 1:
      merged, where = flat[0]
    else:
      where = pointer
      merged = flat[0][0]
      for schema, _ in flat[1:]:
        merged = self._merge(merged, schema, where)
        if merged is False:
          return ir.NOTHING
    if self.options.max_ref_depth is None:
      if refs:
        return self._lower_rule(flat, refs[0], merged, where)
      if root:  # Keyed lazily: most schemas never refer to the root.
        self.root_flat = flat
        return self._lower_rule(None, "#", merged, where)
      return self._lower_plain(merged, where)
    for ref in refs:
      self.expanding[ref] += 1
    try:
      return self._lower_plain(merged, where)
    finally:
      for ref in refs:
        self.expanding[ref] -= 1

  def _flatten(self, schema, where: str, flat: list, refs: list) -> bool:
    """Appends the conjuncts of `schema` to `flat`; False if one is `false` or cut."""
    if schema is True:
      return True
    if schema is False:
      return False
    schema = _normalize(self._check(self._schema_dict(schema, where), where), where)
    if "$ref" in schema:
      ref = schema["$ref"]
      target = self._resolve(ref, where)
      refs.append(ref)
      if self.options.max_ref_depth is None:
        if ref in self.chain:
          self._ref_cycle(ref, where)
      elif self.expanding[ref] + refs.count(ref) > self.options.max_ref_depth:
        self.cut.append(ref)
        return False
      self.chain.append(ref)
      try:
        if not self._flatten(target, ref, flat, refs):
          return False
      finally:
        self.chain.pop()
    if "allOf" in schema:
      parts = schema["allOf"]
      if not isinstance(parts, list) or not parts:
        raise errors.SchemaError(
            f"allOf at {_pointer(where, 'allOf')} is {_short(parts)}. Expected a"
            " non-empty array of schemas. Fix the value."
        )
      for i, part in enumerate(parts):
        if not self._flatten(part, _pointer(where, "allOf", i), flat, refs):
          return False
    own = {k: v for k, v in schema.items() if k not in ("$ref", "allOf")}
    if _constraining(own):
      flat.append((own, where))
    return True

  def _ref_cycle(self, ref: str, where: str) -> None:
    cycle = " -> ".join(self.chain[self.chain.index(ref):] + [ref])
    raise errors.SchemaError(
        f"$ref {ref!r} at {_pointer(where, '$ref')} refers back to itself ({cycle}) with"
        " no JSON value in between, so the schema accepts no finite value. Expected each"
        " recursive $ref inside an object property, an array item or an anyOf branch."
        " Remove the cycle."
    )

  def _lower_rule(self, flat: list | None, hint: str, merged: dict, where: str) -> ir.Node:
    """`_lower_plain(merged)`, or a `RuleRef` if this conjunction recurses into itself.

    The key is the content of the flattened conjuncts (`$ref` targets, `allOf` parts and
    siblings), so the rule is the merged schema, not the bare `$ref` target; `flat` is
    None for the root, whose key is computed only once another key is.
    """
    key = "#" if flat is None else _conjunction_key(flat)
    if self.root_key is None and self.root_flat is not None and flat is not None:
      self.root_key = _conjunction_key(self.root_flat)
    if key == self.root_key:
      key = "#"  # The root, lowered before its key was known.
    name = self.names.get(key)
    if name is not None and name in self.rules:
      return ir.RuleRef(name)
    if key in self.active:
      if name is None:
        taken = set(self.names.values())
        name = next(n for n in (hint, *(f"{hint} ({i})" for i in range(2, len(taken) + 3)))
                    if n not in taken)
        self.names[key] = name
      return ir.RuleRef(name)
    self.active.add(key)
    try:
      body = self._lower_plain(merged, where)
    finally:
      self.active.discard(key)
    name = self.names.get(key)
    if name is None:
      return body
    self.rules[name] = body
    return ir.RuleRef(name)

  def _lower_plain(self, schema: dict, pointer: str) -> ir.Node:
    """A schema without `$ref` or `allOf` at its top."""
    for key in ("anyOf", "oneOf"):
      if key in schema:
        return self._lower_any_of(schema, key, pointer)
    if "enum" in schema or "const" in schema:
      return self._lower_enum(schema, pointer)
    return ir.union(*(self._lower_type(t, schema, pointer) for t in self._types(schema, pointer)))

  # ---- Combinators. ----

  def _lower_any_of(self, schema: dict, key: str, pointer: str) -> ir.Node:
    alternatives = schema[key]
    if not isinstance(alternatives, list) or not alternatives:
      raise errors.SchemaError(
          f"{key} at {_pointer(pointer, key)} is {_short(alternatives)}. Expected a"
          " non-empty array of schemas. Fix the value."
      )
    rest = {k: v for k, v in schema.items() if k != key}
    if key == "oneOf" and not self._disjoint(alternatives, pointer):
      alternatives = _json_negation.exact_one_of(
          alternatives, lambda ref: self._resolve(ref, pointer), _pointer(pointer, key))
    nodes = []
    for i, alternative in enumerate(alternatives):
      where = _pointer(pointer, key, i)
      if _constraining(rest):
        nodes.append(self._lower_conjunction([(rest, pointer), (alternative, where)], where))
      else:
        nodes.append(self.lower(alternative, where))
    return ir.union(*nodes)

  def _disjoint(self, alternatives: list, pointer: str) -> bool:
    """Whether no value can match two of `alternatives` (then `oneOf` is `anyOf`).

    A cheap sufficient test: pairwise, the alternatives admit disjoint sets of types, or
    both require a property whose `const`/`enum` values differ (pydantic's
    discriminated unions). Otherwise `oneOf` is made exact by negation.
    """
    shapes = [self._shape(a, pointer) for a in alternatives]
    for i, (types_a, tags_a) in enumerate(shapes):
      for types_b, tags_b in shapes[i + 1:]:
        if types_a.isdisjoint(types_b):
          continue
        if any(k in tags_b and tags_a[k].isdisjoint(tags_b[k]) for k in tags_a):
          continue
        return False
    return True

  def _shape(self, schema, pointer: str, depth: int = 0) -> tuple[set, dict]:
    """(types a schema admits, {required key: its allowed const/enum values (as JSON)})."""
    if schema is False:
      return set(), {}
    if not isinstance(schema, dict) or depth > 8:
      return set(_TYPES), {}
    if "$ref" in schema and isinstance(schema["$ref"], str) and len(schema) == 1:
      return self._shape(self._resolve(schema["$ref"], pointer), pointer, depth + 1)
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

  def _merge(self, a: dict, b: dict, pointer: str):
    """One schema equivalent to `allOf: [a, b]` (both without `$ref`/`allOf`), or False.

    Subschemas under the same keyword become a lazy `{"allOf": [x, y]}`, merged when
    (and if) they are lowered, so recursive schemas are merged one level at a time.
    """
    for one, other in ((a, b), (b, a)):
      if "patternProperties" in one and any(k in other for k in _OBJECT_MEMBER_KEYWORDS):
        raise errors.UnsupportedSchemaError(
            f"allOf at {_pointer(pointer, 'allOf')} combines patternProperties with another"
            " side's properties, additionalProperties or patternProperties, which is not"
            " supported. Expected patternProperties on one side only. Merge the subschemas"
            " by hand.")
    merged = dict(a)
    for key, vb in b.items():
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
      elif key in ("minimum", "minLength", "minItems", "exclusiveMinimum"):
        if isinstance(va, bool) or isinstance(vb, bool):
          self._merge_conflict(key, where, va, vb)
        merged[key] = max(va, vb)
      elif key in ("maximum", "maxLength", "maxItems", "exclusiveMaximum"):
        if isinstance(va, bool) or isinstance(vb, bool):
          self._merge_conflict(key, where, va, vb)
        merged[key] = min(va, vb)
      elif key == "multipleOf":  # Multiples of both: of their least common multiple.
        a_step, b_step = _exact(va), _exact(vb)
        if a_step <= 0 or b_step <= 0:
          self._merge_conflict(key, where, va, vb)
        numerator = math.lcm(a_step.numerator, b_step.numerator)
        merged[key] = fractions.Fraction(
            numerator, math.gcd(a_step.denominator, b_step.denominator))
      elif key in ("anyOf", "oneOf"):
        if len(va) * len(vb) > _MAX_PRODUCT:
          self._merge_conflict(key, where, va, vb)
        merged[key] = [_lazy_all_of(x, y) for x in va for y in vb]
      elif key == "uniqueItems" and isinstance(va, bool) and isinstance(vb, bool):
        merged[key] = va or vb
      elif key in ("pattern", "format"):  # Both apply: kept as a tuple, intersected.
        values = []
        for value in (*_merged_values(merged, key), *_merged_values(b, key)):
          if not any(_same_value(value, v) for v in values):
            values.append(value)
        merged[key] = tuple(values) if len(values) > 1 else values[0]
      elif key in ("properties", "additionalProperties", "items", "prefixItems"):
        pass  # Below: they interact across keywords.
      elif not _same_value(va, vb):  # pattern, format, ...
        self._merge_conflict(key, where, va, vb)
    if any(k in s for s in (a, b) for k in ("properties", "additionalProperties")):
      _merge_properties(a, b, merged)
    if any(k in s for s in (a, b) for k in ("items", "prefixItems")):
      _merge_items(a, b, merged)
    return merged

  def _merge_conflict(self, key: str, where: str, va, vb) -> None:
    raise errors.UnsupportedSchemaError(
        f"allOf at {where} combines {key!r} values {_short(va, 30)} and {_short(vb, 30)},"
        " which cannot be merged. Expected equal values, or bounds that can be"
        " tightened. Merge the two subschemas by hand."
    )

  # ---- Enums and types. ----

  def _enum_values(self, schema: dict, pointer: str) -> list:
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

  def _lower_enum(self, schema: dict, pointer: str) -> ir.Node:
    values = self._enum_values(schema, pointer)
    checks = {}  # Keywords that filter the values, by the JSON type they apply to.
    excluded = schema.get("$notIn", [])
    values = [v for v in values if not any(_same_value(v, w) for w in excluded)]
    for key in schema:
      if key in _NO_CONSTRAINT or key in ("enum", "const", "type", "$notIn"):
        continue
      kind = _TYPE_OF_KEYWORD.get(key)
      if kind in ("string", "number"):
        checks[kind] = True
        continue
      where = _pointer(pointer, key)
      self.unsupported(where, (
          f"JSON Schema keyword {key!r} at {where} is combined with enum/const, which is"
          " not supported. Expected type, string or number keywords next to enum or"
          " const. Filter the enum values yourself, or pass lenient=True to ignore the"
          " keyword."))
    if "type" in schema:
      types = self._type_names(schema["type"], pointer)
      values = [v for v in values if _has_type(v, types)]
    if "string" in checks:  # Keywords apply to values of their type only.
      values = [v for v in values
                if not isinstance(v, str) or self._valid_string(v, schema, pointer)]
    if "number" in checks:
      values = [v for v in values
                if not _has_type(v, ["number"]) or self._valid_number(v, schema, pointer)]
    nodes = []
    for value in values:
      try:
        nodes.append(jv.const_value(value, self.ws))
      except ValueError as e:
        raise errors.SchemaError(f"enum/const at {pointer}: {e}") from e
    return ir.union(*nodes) if nodes else ir.NOTHING

  def _valid_string(self, value: str, schema: dict, pointer: str) -> bool:
    """Whether the string `value` satisfies `schema`'s string keywords (lengths in code
    points; `pattern`s and `format`s as their text automata)."""
    min_length = self._count(schema, "minLength", pointer) or 0
    max_length = self._count(schema, "maxLength", pointer)
    if len(value) < min_length or (max_length is not None and len(value) > max_length):
      return False
    return all(_has_text(text, value) for text in self._text_languages(schema, pointer))

  def _valid_number(self, value, schema: dict, pointer: str) -> bool:
    """Whether the number `value` satisfies `schema`'s bounds and `multipleOf`, exactly
    (a float is read as the decimal it is written as, as for bounds)."""
    if isinstance(value, float) and not math.isfinite(value):
      return True  # Not JSON: `jv.const_value` reports it.
    x = _exact(value)
    (lo, lo_exclusive, _), (hi, hi_exclusive, _) = self._bounds(schema, pointer)
    if lo is not None and (x < lo or lo_exclusive and x == lo):
      return False
    if hi is not None and (x > hi or hi_exclusive and x == hi):
      return False
    if any((x / _exact(s)).denominator == 1 for s in _merged_values(schema, "$notMultipleOf")):
      return False
    step = self._step(schema, pointer)
    return step is None or (x / step).denominator == 1

  def _type_names(self, value, pointer: str) -> list[str]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or any(n not in _TYPES for n in names):
      raise errors.SchemaError(
          f"type {_short(value)} at {_pointer(pointer, 'type')} is not a JSON Schema"
          f" type. Expected one of {list(_TYPES)} or a list of them. Fix the type name."
      )
    return list(dict.fromkeys(names))

  def _types(self, schema: dict, pointer: str) -> list[str]:
    if "type" in schema:
      return self._type_names(schema["type"], pointer)
    inferred = list(dict.fromkeys(_TYPE_OF_KEYWORD[k] for k in schema if k in _TYPE_OF_KEYWORD))
    return inferred or ["any"]

  def _lower_type(self, name: str, schema: dict, pointer: str) -> ir.Node:
    if name == "any":
      return self.any_value
    excluded = schema.get("$notIn", [])
    if name == "null":
      return ir.NOTHING if None in excluded else jv.JSON_NULL
    if name == "boolean":
      return ir.union(*(ir.Bytes(json.dumps(b).encode()) for b in (False, True)
                        if not any(v is b for v in excluded)))
    if name == "string":
      return self._lower_string(schema, pointer)
    if name in ("integer", "number"):
      return self._lower_number(name, schema, pointer)
    if name == "object":
      return self._lower_object(schema, pointer)
    return self._lower_array(schema, pointer)

  # ---- Scalars. ----

  def _count(self, schema: dict, key: str, pointer: str) -> int | None:
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
    return value

  def _lower_string(self, schema: dict, pointer: str) -> ir.Node:
    min_length = self._count(schema, "minLength", pointer) or 0
    max_length = self._count(schema, "maxLength", pointer)
    if max_length is not None and max_length < min_length:
      return ir.NOTHING
    texts = self._text_languages(schema, pointer)
    excluded = [v for v in schema.get("$notIn", []) if isinstance(v, str)]
    if excluded:
      texts.append(jv.text_except(excluded))
    if not texts:
      return jv.json_string(min_length, max_length)
    if min_length > 0 or max_length is not None:
      texts.append(_intersect.text_of_length(min_length, max_length))
    return _quoted(jv.encode_text(self._intersect_texts(texts, pointer)))

  def _text_languages(self, schema: dict, pointer: str) -> list[ir.Node]:
    """The decoded-text languages of a string schema's `pattern` and `format` (a tuple
    of several after `allOf` merging: all apply)."""
    texts = []
    for pattern in _merged_values(schema, "pattern"):
      texts.append(self._pattern(pattern, _pointer(pointer, "pattern")))
    for name in _merged_values(schema, "format"):
      where = _pointer(pointer, "format")
      if isinstance(name, str) and name in FORMATS:
        texts.append(format_ir(name))
      elif isinstance(name, str):  # An unknown format is an annotation (2020-12, 7.2.3).
        self.annotation(where)
      else:
        raise errors.SchemaError(
            f"format {_short(name)} at {where} is not a string. Expected a format name"
            " such as 'date-time'. Fix the value.")
    return texts

  def _intersect_texts(self, texts: list[ir.Node], pointer: str) -> ir.Node:
    text = texts[0]
    for other in texts[1:]:
      try:
        text = _intersect.intersect_text(text, other)
      except ValueError as e:
        raise errors.UnsupportedSchemaError(
            f"The string constraints at {pointer} (pattern, format, lengths) are too large"
            f" to combine: {e}. Expected their intersection to be a smaller automaton."
            " Simplify the pattern or lower maxLength.") from e
    return text

  def _name_language(self, names, pointer: str) -> ir.Node | None:
    """The decoded texts `propertyNames` allows as keys (IR over characters), None for any.

    Supports the string keywords (type, pattern, format, minLength, maxLength) and
    enum/const (their strings).
    """
    if names is True:
      return None
    if names is False:
      return ir.NOTHING
    names = self._schema_dict(names, pointer)
    for key in names:
      if key not in _NAME_KEYWORDS and key not in _NO_CONSTRAINT:
        where = _pointer(pointer, key)
        self.unsupported(where, (
            f"propertyNames keyword {key!r} at {where} is not supported. Expected type,"
            " pattern, format, minLength, maxLength, enum or const. Remove it, or pass"
            " lenient=True to ignore it (the output may then violate it)."))
    if "type" in names and "string" not in self._type_names(names["type"], pointer):
      return ir.NOTHING  # Property names are strings.
    texts = self._text_languages(names, pointer)
    min_length = self._count(names, "minLength", pointer) or 0
    max_length = self._count(names, "maxLength", pointer)
    if max_length is not None and max_length < min_length:
      return ir.NOTHING
    if min_length > 0 or max_length is not None:
      texts.append(_intersect.text_of_length(min_length, max_length))
    if "enum" in names or "const" in names:
      texts.append(ir.union(*(ir.Bytes(v.encode()) for v in self._enum_values(names, pointer)
                              if isinstance(v, str) and _encodable(v))))
    if not texts:
      return None
    return self._intersect_texts(texts, pointer)

  def _pattern(self, pattern, where: str) -> ir.Node:
    if not isinstance(pattern, str):
      raise errors.SchemaError(
          f"pattern {pattern!r} at {where} is not a string. Expected a regular expression."
          " Quote the pattern."
      )
    try:
      return pattern_ir(pattern)
    except errors.RegexSyntaxError as e:
      raise errors.SchemaError(
          f"pattern {pattern!r} at {where} is not a valid regular expression. Expected"
          f" Python `re` syntax (ECMAScript-like). {e}"
      ) from e
    except errors.UnsupportedRegexError as e:
      raise errors.UnsupportedSchemaError(
          f"pattern {pattern!r} at {where} uses a construct that is not supported."
          " Expected anchors only at the start or end of the pattern or of a top-level"
          f" alternative, and no lookaround or backreferences. {e}"
      ) from e

  def _bound(self, schema: dict, key: str, pointer: str):
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, _NUMBER) or (
        isinstance(value, float) and not math.isfinite(value)):
      raise errors.SchemaError(
          f"{key} {value!r} at {_pointer(pointer, key)} is not a number. Expected a finite"
          " JSON number. Fix the value."
      )
    return _exact(value)

  def _bounds(self, schema: dict, pointer: str) -> list:
    """[(value, exclusive, keyword)] for the lower and upper bound; value None: unbounded.

    Values are exact `Fraction`s; of `minimum` and `exclusiveMinimum` the tighter wins.
    """
    sides = []
    for inclusive, exclusive, tighter in (("minimum", "exclusiveMinimum", max),
                                          ("maximum", "exclusiveMaximum", min)):
      value = self._bound(schema, inclusive, pointer) if inclusive in schema else None
      side = (value, False, inclusive)
      flag = schema.get(exclusive)
      if isinstance(flag, bool):  # Draft 04: a modifier of minimum/maximum.
        if flag and value is None:
          raise errors.SchemaError(
              f"{exclusive} true at {_pointer(pointer, exclusive)} has no {inclusive}."
              f" Expected {inclusive} next to a boolean {exclusive}. Use the number form,"
              f" e.g. {{\"{exclusive}\": 0}}."
          )
        side = (value, flag, inclusive)
      elif flag is not None:
        bound = self._bound(schema, exclusive, pointer)
        if value is None or tighter(bound, value) == bound:
          side = (bound, True, exclusive)
      sides.append(side)
    return sides

  def _lower_number(self, name: str, schema: dict, pointer: str) -> ir.Node:
    node = self._number_range(name, schema, pointer)
    excluded = [v for v in schema.get("$notIn", [])
                if isinstance(v, _NUMBER) and not isinstance(v, bool)]
    steps = _merged_values(schema, "$notMultipleOf")
    if node == ir.NOTHING or not excluded and not steps:
      return node
    # Exclusions are exact on one spelling per value: the canonical decimals.
    others = [ir.Bytes(_difference.canonical_number(v).encode()) for v in excluded]
    for step in steps:
      if isinstance(step, bool) or not isinstance(step, _NUMBER) or _exact(step) <= 0:
        raise errors.SchemaError(
            f"multipleOf {step!r} under not at {pointer} is not a positive number."
            " Expected a number > 0. Fix the value.")
      others.append(jv.multiple_of(_exact(step)))
    try:
      return _difference.ascii_difference(
          _intersect.intersect_text(node, _difference.CANONICAL_NUMBER), ir.union(*others))
    except ValueError as e:
      raise errors.UnsupportedSchemaError(
          f"The number at {pointer} excludes values or multiples (from not/oneOf/if) in an"
          f" automaton that is too large: {e}. Expected smaller steps or fewer values."
          " Simplify the schema.") from e

  def _number_range(self, name: str, schema: dict, pointer: str) -> ir.Node:
    """Numbers within the bounds and `multipleOf` (`integer`: canonical integers)."""
    (lo, lo_exclusive, _), (hi, hi_exclusive, _) = self._bounds(schema, pointer)
    step = self._step(schema, pointer)
    if name == "integer":
      low = None if lo is None else (math.floor(lo) + 1 if lo_exclusive else math.ceil(lo))
      high = None if hi is None else (math.ceil(hi) - 1 if hi_exclusive else math.floor(hi))
      node = jv.integer_range(low, high)
      # An integer is a multiple of p/q (lowest terms) exactly when p divides it.
      step = None if step is None or step.numerator == 1 else fractions.Fraction(
          step.numerator)
    elif lo is None and hi is None and step is None:
      return jv.JSON_NUMBER
    elif lo is not None and hi is not None and (
        lo > hi or lo == hi and (lo_exclusive or hi_exclusive)):
      return ir.NOTHING
    else:
      node = jv.number_range(lo, hi, lo_exclusive=lo_exclusive, hi_exclusive=hi_exclusive)
    if step is None:
      return node
    where = _pointer(pointer, "multipleOf")
    try:
      return _intersect.intersect_text(node, jv.multiple_of(step))
    except ValueError as e:
      raise errors.UnsupportedSchemaError(
          f"multipleOf {schema['multipleOf']!r} at {where} with these bounds is too large an"
          f" automaton: {e}. Expected a step with a small numerator (in lowest terms, times"
          " 10^decimal places), or tighter bounds.") from e

  def _step(self, schema: dict, pointer: str) -> fractions.Fraction | None:
    """`multipleOf` as an exact decimal, or None."""
    if "multipleOf" not in schema:
      return None
    step = self._bound(schema, "multipleOf", pointer)
    if step <= 0:
      raise errors.SchemaError(
          f"multipleOf {schema['multipleOf']!r} at {_pointer(pointer, 'multipleOf')} is not"
          " positive. Expected a number > 0. Fix the value.")
    return step

  # ---- Objects and arrays. ----

  def _lower_object(self, schema: dict, pointer: str) -> ir.Node:
    ws = self.ws
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
      raise errors.SchemaError(
          f"properties at {_pointer(pointer, 'properties')} is {_short(properties)}."
          " Expected an object mapping names to schemas. Fix the value."
      )
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
      raise errors.SchemaError(
          f"required at {_pointer(pointer, 'required')} is {_short(required)}. Expected"
          " an array of property names. Fix the value."
      )
    additional = schema.get("additionalProperties",
                            schema.get("$unevaluatedProperties", True))
    declares = bool(properties) or bool(required)
    if additional is True or (isinstance(additional, dict) and not _constraining(additional)):
      extra_schema = None if self.options.strict_properties and declares else True
    else:
      extra_schema = None if additional is False else additional
    names = self._name_language(schema.get("propertyNames", True),
                                _pointer(pointer, "propertyNames"))
    pattern = self._pattern_property(schema, pointer)
    depends = self._dependent_required(schema, pointer)
    members = []
    dependent_keys = [k for key, targets in depends.items() for k in (key, *targets)]
    for key in dict.fromkeys([*properties, *required, *dependent_keys]):
      matches = pattern is not None and _has_text(pattern[0], key)
      if key in properties:
        subschema, where = properties[key], _pointer(pointer, "properties", key)
        if matches:  # Both apply.
          subschema = _lazy_all_of(subschema, pattern[1])
      elif matches:
        subschema, where = pattern[1], _pointer(pointer, "patternProperties", pattern[2])
      else:
        subschema, where = additional, _pointer(pointer, "additionalProperties")
      if names is not None and not _has_text(names, key):
        node = ir.NOTHING  # propertyNames forbids the key.
      else:
        node = self.lower(subschema, where)
      members.append((key, node, key in required))
    declared = [k for k, _, _ in members]
    extra = None
    if pattern is not None:  # Keys matching the pattern; no others (module doc).
      value = self.lower(pattern[1], _pointer(pointer, "patternProperties", pattern[2]))
      keys = [pattern[0], jv.text_except(declared)] + ([names] if names is not None else [])
      extra = ir.concat(_quoted(jv.encode_text(self._intersect_texts(
          keys, _pointer(pointer, "patternProperties")))), ws.colon, value)
    elif extra_schema is not None:
      colon, value = self.extra_colon, self.extra_value
      if extra_schema is not True:
        colon = ws.colon
        value = self.lower(extra_schema, _pointer(pointer, "additionalProperties"))
      if names is None:
        keys = jv.string_except(declared)
      else:
        keys = _quoted(jv.encode_text(self._intersect_texts(
            [names, jv.text_except(declared)], _pointer(pointer, "propertyNames"))))
      extra = ir.concat(keys, colon, value)
    if extra == ir.NOTHING:
      extra = None
    members = [(key, self._member(key, node), is_required) for key, node, is_required
               in members if is_required or node != ir.NOTHING]
    counted = "minProperties" in schema or "maxProperties" in schema
    any_order = None
    if not counted and (self.options.property_order == "any" or depends):
      any_order = self._any_order(members, extra, depends, pointer)
    if any_order is not None:
      body, can_be_empty = any_order
    elif counted:
      body, can_be_empty = self._counted_members(
          [(m, r) for _, m, r in members], extra, schema, pointer)
    else:
      body, can_be_empty = _members([(m, r) for _, m, r in members], extra, ws)
    parts = [ws.empty(b"{}")] if can_be_empty else []
    if body != ir.NOTHING:
      parts.append(ir.concat(ws.open(b"{"), body, ws.close(b"}")))
    return ir.union(*parts) if parts else ir.NOTHING

  def _dependent_required(self, schema: dict, pointer: str) -> dict:
    """`dependentRequired` as key -> required keys (empty when absent)."""
    depends = schema.get("dependentRequired", {})
    where = _pointer(pointer, "dependentRequired")
    if not isinstance(depends, dict) or not all(
        isinstance(v, list) and all(isinstance(k, str) for k in v) for v in depends.values()):
      raise errors.SchemaError(
          f"dependentRequired at {where} is {_short(depends)}. Expected an object mapping"
          " property names to arrays of property names. Fix the value.")
    if depends and ("minProperties" in schema or "maxProperties" in schema):
      self.unsupported(where, (
          f"dependentRequired at {where} next to minProperties/maxProperties is not"
          " supported. Expected one of them. Remove one, or pass lenient=True to ignore"
          " dependentRequired."))
      return {}
    return {k: v for k, v in depends.items() if v}

  def _any_order(self, members: list, extra: ir.Node | None, depends: dict,
                 pointer: str) -> tuple[ir.Node, bool] | None:
    """Members in any order (`_json_objects`), or None to keep schema order.

    Schema order is kept for objects past `MAX_ANY_ORDER_SIZE` and for members that
    call a recursive rule (a subset automaton would be written out as an expression);
    `dependentRequired` needs the subsets, so there it raises instead.
    """
    memo: dict = {}
    sizes = [_ir_size(member) for _, member, _ in members]
    result = None
    if not any(_has_rule_ref(member, memo) for _, member, _ in members):
      result = _json_objects.any_order_members(
          members, extra, self.ws, depends, MAX_ANY_ORDER_SIZE, sizes,
          0 if extra is None else _ir_size(extra))
    if result is None and depends:
      where = _pointer(pointer, "dependentRequired")
      self.unsupported(where, (
          f"dependentRequired at {where} needs an automaton over the sets of the"
          f" {len(members)} declared keys, which exceeds {MAX_ANY_ORDER_SIZE} IR nodes (or"
          " a member is recursive). Expected fewer or smaller properties. Split the"
          " object, or pass lenient=True to ignore dependentRequired."))
      if self.options.property_order == "schema":
        return None
      return self._any_order(members, extra, {}, pointer)
    if result is None and self.options.property_order == "any":
      _log.info("JSON Schema: the object at %s keeps schema order (%d members: any order"
                " would exceed %d IR nodes, or a member is recursive).", pointer,
                len(members), MAX_ANY_ORDER_SIZE)
    return result

  def _lower_contains(self, schema: dict, pointer: str) -> ir.Node:
    """Arrays with `minContains` (default 1) to `maxContains` items matching `contains`.

    An automaton over how many matching items were written: an item either counts
    (`items` and `contains`) or not (`items` and, with a `maxContains`, not
    `contains`: `_json_negation.negate`); without a maximum, an item need not be
    counted, so no negation is needed.
    """
    where = _pointer(pointer, "contains")
    m = self._count(schema, "minContains", pointer)
    m = 1 if m is None else m
    top = self._count(schema, "maxContains", pointer)
    rest = {k: v for k, v in schema.items() if k not in ("contains", "minContains",
                                                         "maxContains")}
    if m == 0 and top is None:
      return self._lower_array(rest, pointer)
    for key in ("prefixItems", "minItems", "maxItems", "uniqueItems"):
      if key in schema and schema[key] is not False:
        self.unsupported(where, (
            f"contains at {where} next to {key} is not supported. Expected contains with"
            " items, minContains and maxContains only. Remove one of them, or pass"
            " lenient=True to ignore contains."))
        return self._lower_array(rest, pointer)
    if top is not None and top < m:
      return ir.NOTHING
    items = _items(schema)
    item = self.lower(items, _pointer(pointer, "items"))
    hit = self._lower_conjunction([(items, pointer), (schema["contains"], where)], where)
    miss = item
    if top is not None:
      negated = _json_negation.negate(schema["contains"],
                                      lambda ref: self._resolve(ref, pointer), where)
      miss = self._lower_conjunction([(items, pointer), (negated, where)], where)
    ws = self.ws
    cap = m if top is None else top
    # States: 0 start, 1 after `]`, 2 after `[`, 3 + k after items of which k count.
    arcs = [(0, ws.open(b"["), 2)]
    if m == 0:
      arcs.append((0, ws.empty(b"[]"), 1))
    for k in range(cap + 1):
      here = 3 + k
      if k >= m:
        arcs.append((here, ws.close(b"]"), 1))
      stay = item if top is None and k == cap else miss
      arcs.append((here, ir.concat(ws.comma, stay), here))
      if k < cap:
        arcs.append((here, ir.concat(ws.comma, hit), here + 1))
    arcs += [(2, miss, 3), (2, hit, 4)] if cap >= 1 else [(2, miss, 3)]
    arcs = [(a, label, b) for a, label, b in arcs if label != ir.NOTHING]
    return ir.Graph(num_states=4 + cap, arcs=tuple(arcs), finals=(1,))

  def _lower_unique_array(self, schema: dict, pointer: str) -> ir.Node | None:
    """An array with `uniqueItems: true` whose items take at most `MAX_UNIQUE_VALUES`
    values (enums, booleans, small integer ranges): every set of distinct values, in
    any order, as an automaton over the subsets used so far. None after recording the
    keyword in lenient mode when that is not the case."""
    where = _pointer(pointer, "uniqueItems")
    values = None
    if "prefixItems" not in schema:
      values = _distinct_values(self.lower(_items(schema), _pointer(pointer, "items")))
    if values is None or len(values) > MAX_UNIQUE_VALUES:
      self.unsupported(where, (
          f"uniqueItems at {where} needs items with at most {MAX_UNIQUE_VALUES} possible"
          " values (an enum, booleans, a small integer range) and no prefixItems: distinct"
          " values from a larger set are not a regular language. Bound the items with an"
          " enum, or pass lenient=True to allow repeats."))
      return None
    min_items = self._count(schema, "minItems", pointer) or 0
    max_items = self._count(schema, "maxItems", pointer)
    k = len(values)
    max_items = k if max_items is None else min(max_items, k)
    if min_items > max_items:
      return ir.NOTHING
    # States: 0 before `[`, 1 after `]`, 2 + mask for the set of values used so far.
    ws = self.ws
    arcs = []
    if min_items == 0:
      arcs.append((0, ws.empty(b"[]"), 1))
    if max_items >= 1:
      arcs += [(0, ir.concat(ws.open(b"["), values[j]), 2 + (1 << j)) for j in range(k)]
    for mask in range(1, 1 << k):
      size = bin(mask).count("1")
      if size > max_items:
        continue
      if size >= min_items:
        arcs.append((2 + mask, ws.close(b"]"), 1))
      for j in range(k):
        if size < max_items and not mask >> j & 1:
          arcs.append((2 + mask, ir.concat(ws.comma, values[j]), 2 + (mask | 1 << j)))
    return ir.Graph(num_states=2 + (1 << k), arcs=tuple(arcs), finals=(1,))

  def _member(self, key: str, value: ir.Node) -> ir.Node:
    """`"key": value`; a schema-free value as the shared fragment (`_splice.py`)."""
    if value == self.any_value:  # Cheap: equal nodes share their parts.
      return ir.concat(jv.canonical_string(key), self.extra_colon, self.extra_value)
    return ir.concat(jv.canonical_string(key), self.ws.colon, value)

  def _counted_members(self, members: list, extra: ir.Node | None, schema: dict,
                       pointer: str) -> tuple[ir.Node, bool]:
    """`_members` with `minProperties`/`maxProperties`: an automaton over (member, how
    many written). Additional keys may repeat one another (keeping them distinct is not
    regular) and a parser keeps one of each, so towards `minProperties` only the first
    additional property counts; towards `maxProperties` all do."""
    lo = self._count(schema, "minProperties", pointer) or 0
    hi = self._count(schema, "maxProperties", pointer)
    n = len(members)
    if extra is not None and lo > n + 1:
      where = _pointer(pointer, "minProperties")
      self.unsupported(where, (
          f"minProperties {lo} at {where} needs {lo - n} additional properties with"
          " distinct keys, which cannot be guaranteed (keys that may repeat are not"
          " regular to exclude), so only one additional property counts. Expected at most"
          f" {n + 1} here: declare the properties, or pass lenient=True to ignore it."))
      lo = 0
    ws = self.ws
    states: dict[tuple, int] = {}

    def state(*key) -> int:
      return states.setdefault(key, len(states))

    arcs, finals = [], []
    cap = n if hi is None else min(n, hi)
    for i, (member, is_required) in enumerate(members):
      for d in range(min(i, cap) + 1):
        if not is_required:
          arcs.append((state("m", i, d), ir.EPSILON, state("m", i + 1, d)))
        if d < cap:
          label = ir.concat(ws.comma, member) if d else member
          arcs.append((state("m", i, d), label, state("m", i + 1, d + 1)))
    for d in range(cap + 1):
      more = 0 if extra is None else (1 if hi is None else hi - d)  # Extras, 1 = "some".
      arcs.append((state("m", n, d), ir.EPSILON, state("x", d, 0)))
      for x in range(more + 1):
        if d + x and d + min(x, 1) >= lo:
          finals.append(state("x", d, x))
        if x < more or hi is None and x == 1:
          label = ir.concat(ws.comma, extra) if d + x else extra
          arcs.append((state("x", d, x), label, state("x", d, min(x + 1, more))))
    can_be_empty = lo == 0 and all(not is_required for _, is_required in members)
    if not finals:
      return ir.NOTHING, can_be_empty
    start = state("m", 0, 0)
    order = {s: i for i, s in enumerate(sorted(states.values(), key=lambda s: s != start))}
    graph = ir.Graph(num_states=len(states),
                     arcs=tuple((order[a], label, order[b]) for a, label, b in arcs),
                     finals=tuple(sorted({order[f] for f in finals})))
    return graph, can_be_empty

  def _pattern_property(self, schema: dict, pointer: str):
    """(decoded-text IR, schema, pattern) of the one `patternProperties` entry, or None."""
    patterns = schema.get("patternProperties", {})
    where = _pointer(pointer, "patternProperties")
    if not isinstance(patterns, dict):
      raise errors.SchemaError(
          f"patternProperties at {where} is {_short(patterns)}. Expected an object mapping"
          " patterns to schemas. Fix the value.")
    if not patterns:
      return None
    if len(patterns) > 1:
      self.unsupported(where, (
          f"patternProperties at {where} has {len(patterns)} patterns. Expected at most one"
          " (keys matching several patterns need every matching schema). Merge them into"
          " one pattern, or pass lenient=True to ignore the keyword."))
      return None
    [(pattern, subschema)] = patterns.items()
    return self._pattern(pattern, _pointer(where, pattern)), subschema, pattern

  def _lower_array(self, schema: dict, pointer: str) -> ir.Node:
    if "contains" in schema:
      return self._lower_contains(schema, pointer)
    ws = self.ws
    unique = schema.get("uniqueItems", False)
    if not isinstance(unique, bool):
      raise errors.SchemaError(
          f"uniqueItems at {_pointer(pointer, 'uniqueItems')} is {_short(unique)}. Expected"
          " true or false. Fix the value.")
    if unique:
      node = self._lower_unique_array(schema, pointer)
      if node is not None:
        return node
    prefix_schemas = schema.get("prefixItems", [])
    if not isinstance(prefix_schemas, list):
      raise errors.SchemaError(
          f"prefixItems at {_pointer(pointer, 'prefixItems')} is {_short(prefix_schemas)}."
          " Expected an array of schemas. Fix the value."
      )
    min_items = self._count(schema, "minItems", pointer) or 0
    max_items = self._count(schema, "maxItems", pointer)
    prefix = []
    for i, subschema in enumerate(prefix_schemas):
      if max_items is not None and i >= max_items:
        break
      node = self.lower(subschema, _pointer(pointer, "prefixItems", i))
      if node == ir.NOTHING:  # No array reaches this position.
        max_items = i if max_items is None else min(max_items, i)
        break
      prefix.append(node)
    rest = self.lower(_items(schema), _pointer(pointer, "items"))
    if rest == ir.NOTHING:
      max_items = len(prefix) if max_items is None else min(max_items, len(prefix))
    if max_items is not None and max_items < min_items:
      return ir.NOTHING
    if not prefix:
      return jv.delimited(b"[", b"]", rest, ws, min_items, max_items)
    k = len(prefix)
    more_min = max(0, min_items - k)
    more_max = None if max_items is None else max_items - k
    if rest == ir.NOTHING:
      tail = ir.EPSILON if more_min == 0 else ir.NOTHING
    else:
      tail = ir.repeat(ir.concat(ws.comma, rest), more_min, more_max)
    for i in reversed(range(1, k)):  # `tail`: what may follow the first i elements.
      step = ir.concat(ws.comma, prefix[i], tail)
      tail = ir.union(ir.EPSILON, step) if i >= min_items else step
    parts = [ws.empty(b"[]")] if min_items == 0 else []
    parts.append(ir.concat(ws.open(b"["), prefix[0], tail, ws.close(b"]")))
    return ir.union(*parts)


def _members(members: list, extra: ir.Node | None, ws: jv.Whitespace):
  """Comma-separated object members in order, optional ones skippable, then extras.

  Args:
    members: (member IR, is_required) in schema order.
    extra: The IR of one additional member, or None if none are allowed.
    ws: Whitespace policy (for commas).

  Returns:
    (IR of the non-empty member lists, whether the empty object is allowed).
  """
  sized = [(member, is_required, _ir_size(member)) for member, is_required in members]
  first, can_be_empty, _ = _member_lists(sized, ws) if sized else (ir.NOTHING, True, 0)
  if extra is None:
    return first, can_be_empty
  if not can_be_empty:
    return ir.concat(first, ir.repeat(ir.concat(ws.comma, extra), 0, None)), False
  # `(first | extra) (, extra)*` with one copy of `extra` (often schema-free JSON, the
  # largest part): 0 -first-> 1, 0 -> 2, 2 -extra-> 1, 1 -comma-> 2; 1 is final.
  arcs = [(0, ir.EPSILON, 2), (2, extra, 1), (1, ws.comma, 2)]
  if first != ir.NOTHING:
    arcs.append((0, first, 1))
  return ir.Graph(num_states=3, arcs=tuple(arcs), finals=(1,)), True


def _member_lists(members: list, ws: jv.Whitespace):
  """(non-empty lists, empty allowed, IR size) for (member, is_required, size) triples.

  Divide and conquer: a list over A + B is `NA , NB`, `NA` (if B may be empty) or `NB`
  (if A may be empty), written `NA (, NB)? | NB` or `(NA ,)? NB | NA`. Only when both
  halves may be empty must one of them be written twice, and the smaller one is. The
  naive "first present member" construction copies the last member once per member
  before it; this copies no member more than a few times in typical schemas (and at
  most O(n^1.6) members in total), which keeps nested objects small.
  """
  if len(members) == 1:
    member, is_required, size = members[0]
    return member, not is_required, size
  half = len(members) // 2
  a, a_empty, a_size = _member_lists(members[:half], ws)
  b, b_empty, b_size = _member_lists(members[half:], ws)
  then_b = ir.concat(ws.comma, b)
  a_then = ir.concat(a, ws.comma)
  if not a_empty or (b_empty and b_size <= a_size):
    # NA (, NB)?  |  NB if A may be empty.
    node = ir.concat(a, ir.repeat(then_b, 0, 1) if b_empty else then_b)
    parts, size = [node], a_size + b_size
    if a_empty:
      parts.append(b)
      size += b_size
  else:
    # (NA ,)? NB  |  NA if B may be empty.
    parts = [ir.concat(ir.repeat(a_then, 0, 1), b)]
    size = a_size + b_size
    if b_empty:
      parts.append(a)
      size += a_size
  return ir.union(*parts), a_empty and b_empty, size


def _ir_size(node: ir.Node) -> int:
  """Number of IR nodes in the tree (shared subtrees counted once per occurrence)."""
  if isinstance(node, ir.Concat):
    return 1 + sum(_ir_size(p) for p in node.parts)
  if isinstance(node, ir.Union):
    return 1 + sum(_ir_size(a) for a in node.alternatives)
  if isinstance(node, ir.Repeat):
    return 1 + _ir_size(node.node) * max(1, node.min if node.max is None else node.max)
  if isinstance(node, ir.Graph):
    return 1 + sum(_ir_size(label) for _, label, _ in node.arcs)
  return 1  # Leaves, and fragments: one arc of the byte automaton until spliced.


def _merged_values(schema: dict, key: str) -> tuple:
  """A keyword's values: () when absent, the tuple `allOf` merging made, or (value,)."""
  if key not in schema:
    return ()
  value = schema[key]
  return value if isinstance(value, tuple) else (value,)


def _distinct_values(node: ir.Node) -> list[ir.Node] | None:
  """The JSON values of a finite IR of JSON texts, each as the IR of its texts (a value
  may have several spellings: whitespace), or None when there are too many or
  infinitely many texts."""
  texts = _finite_texts(node, 4 * MAX_UNIQUE_VALUES)
  if texts is None:
    return None
  spellings: dict[str, list[bytes]] = {}
  for text in sorted(texts):
    value = json.dumps(json.loads(text), sort_keys=True)
    spellings.setdefault(value, []).append(text)
  return [ir.union(*(ir.Bytes(t) for t in group)) for group in spellings.values()]


def _finite_texts(node: ir.Node, limit: int) -> set[bytes] | None:
  """All byte strings of `node` if there are at most `limit`, else None."""
  match node:
    case ir.Bytes(data):
      return {data}
    case ir.CharClass(ranges) | ir.ByteClass(ranges):
      if sum(hi - lo + 1 for lo, hi in ranges) > limit:
        return None
      if isinstance(node, ir.ByteClass):
        return {bytes([b]) for lo, hi in ranges for b in range(lo, hi + 1)}
      return {chr(c).encode() for lo, hi in ranges for c in range(lo, hi + 1)}
    case ir.Concat(parts):
      out = {b""}
      for part in parts:
        texts = _finite_texts(part, limit)
        if texts is None or len(out) * len(texts) > limit:
          return None
        out = {a + b for a in out for b in texts}
      return out
    case ir.Union(alternatives):
      out = set()
      for alternative in alternatives:
        texts = _finite_texts(alternative, limit)
        if texts is None:
          return None
        out |= texts
        if len(out) > limit:
          return None
      return out
    case ir.Repeat(body, lo, hi):
      if hi is None:
        return None
      return _finite_texts(ir.union(*(ir.concat(*[body] * n) for n in range(lo, hi + 1))),
                           limit)
  return None  # Graphs, fragments and terminals: not enumerated.


def _has_text(language: ir.Node, text: str) -> bool:
  """Whether the decoded-text IR `language` holds `text`."""
  if not _encodable(text):
    return False
  return _intersect.intersect_text(ir.Bytes(text.encode()), language) != ir.NOTHING


def _encodable(text: str) -> bool:
  """Whether `text` is valid Unicode text (no lone surrogates, which JSON can escape)."""
  try:
    text.encode()
  except UnicodeEncodeError:
    return False
  return True


def _exact(value) -> fractions.Fraction:
  """A JSON number as an exact fraction. A float is read as the decimal it was written
  as (0.1 is 1/10, not the nearest binary fraction), so bounds and steps compare
  exactly with the decimal texts generated."""
  return fractions.Fraction(repr(value) if isinstance(value, float) else value)


def _quoted(body: ir.Node) -> ir.Node:
  return ir.concat(ir.Bytes(b'"'), body, ir.Bytes(b'"'))


def _items(schema: dict):
  """The schema of the items after `prefixItems` (`unevaluatedItems` when `items` is absent)."""
  return schema.get("items", schema.get("$unevaluatedItems", True))


def _unevaluated(schema: dict) -> dict:
  """`unevaluatedProperties`/`unevaluatedItems` rewritten for lowering.

  Without applicators, the properties (items) a schema evaluates are those its own
  `properties`, `patternProperties` and `additionalProperties` (`prefixItems`, `items`)
  name, so `unevaluatedProperties` is `additionalProperties` when that is absent and has
  no effect otherwise. With applicators (`allOf`, `$ref`, `anyOf`, ...) it applies to
  what the conjunction evaluates once merged: it is kept as `$unevaluatedProperties`,
  which `_lower_object` reads after `allOf` merging and, for `anyOf`/`oneOf`, per
  alternative (the alternative that matched is the one whose properties count: exact
  when no two alternatives match, narrower otherwise).
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


# ---- Patterns and formats. ----

_ANY_TEXT = "(?s:.*)"
_GLOBAL_FLAGS = re.compile(r"\(\?([aiLmsux]+)\)")


def _split_alternatives(pattern: str) -> list[str]:
  """The top-level `|` alternatives of a regex (outside groups and classes)."""
  out, depth, start, i = [], 0, 0, 0
  while i < len(pattern):
    c = pattern[i]
    if c == "\\":
      i += 2
      continue
    if c == "[":
      i += 1
      if pattern.startswith("^", i):
        i += 1
      if pattern.startswith("]", i):
        i += 1
      while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    elif c == "(":
      depth += 1
    elif c == ")":
      depth -= 1
    elif c == "|" and depth == 0:
      out.append(pattern[start:i])
      start = i + 1
    i += 1
  out.append(pattern[start:])
  return out


def _backslashes_before(text: str, end: int) -> int:
  n = 0
  while end - n - 1 >= 0 and text[end - n - 1] == "\\":
    n += 1
  return n


def _anchored_end(alternative: str) -> bool:
  if alternative.endswith("$"):
    return _backslashes_before(alternative, len(alternative) - 1) % 2 == 0
  if alternative.endswith("\\Z"):
    return _backslashes_before(alternative, len(alternative) - 1) % 2 == 1
  return False


@functools.lru_cache(maxsize=256)
def pattern_ir(pattern: str) -> ir.Node:
  """The strings (decoded, as UTF-8 IR) in which `pattern` matches: `re.search` semantics.

  Each top-level alternative `a` becomes `(?s:.*)(?:a)(?s:.*)`, without the prefix when
  `a` starts with `^` or `\\A` and without the suffix when it ends with `$` or `\\Z`; the
  wrapped text is parsed by the regex front end, which then rejects anchors anywhere
  else. Leading global flags (`(?i)`) apply to the whole pattern (`(?x)` is refused).

  Raises:
    RegexSyntaxError: `pattern` does not parse.
    UnsupportedRegexError: It uses lookaround, backreferences, misplaced anchors, ....
  """
  flags = ""
  match = _GLOBAL_FLAGS.match(pattern)
  if match:
    flags, pattern = match.group(0), pattern[match.end():]
    if "x" in match.group(1):
      raise errors.UnsupportedRegexError(
          f"Regex {pattern!r} uses the verbose flag (?x) in a JSON Schema pattern, which is"
          " not supported. Expected an ECMAScript-like pattern. Remove the whitespace and"
          " comments and the flag."
      )
  wrapped = []
  for alternative in _split_alternatives(pattern):
    start = alternative.startswith("^") or alternative.startswith("\\A")
    end = _anchored_end(alternative)
    wrapped.append(("" if start else _ANY_TEXT) + f"(?:{alternative})" + ("" if end else _ANY_TEXT))
  return _regex.parse_regex(flags + "|".join(wrapped), unicode=False)


_HEXDIG = "[0-9a-fA-F]"
_YEAR = r"(?:\d{3}[1-9]|\d\d[1-9]\d|\d[1-9]\d\d|[1-9]\d{3})"  # 0001-9999.
_LEAP_YEAR = r"(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-"
    rf"(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = f"{_HEXDIG}{{1,4}}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "(?:" + "|".join([  # RFC 3986, Sec. 3.2.2.
    rf"(?:{_H16}:){{6}}{_LS32}",
    rf"::(?:{_H16}:){{5}}{_LS32}",
    rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    rf"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,28}[A-Za-z0-9])?"  # 1-30 characters.
_HOSTNAME = rf"{_LABEL}(?:\.{_LABEL}){{0,7}}"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_EMAIL = rf"{_ATEXT}+(?:\.{_ATEXT}+)*@{_HOSTNAME}"
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = f"%{_HEXDIG}{{2}}"
_PCHAR = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_AUTHORITY = (
    rf"(?:(?:[{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*@)?"
    rf"(?:\[{_IPV6}\]|(?:[{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*)(?::\d*)?"
)
_SEGMENTS = rf"(?:/{_PCHAR}*)*"
_URI = (
    rf"[A-Za-z][A-Za-z0-9+.\-]*:(?://{_AUTHORITY}{_SEGMENTS}|/(?:{_PCHAR}+{_SEGMENTS})?"
    rf"|{_PCHAR}+{_SEGMENTS}|)(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
)
_DURATION_TIME = r"T(?:\d+H(?:\d+M(?:\d+(?:\.\d+)?S)?)?|\d+M(?:\d+(?:\.\d+)?S)?|\d+(?:\.\d+)?S)"
_DURATION = (rf"P(?:(?:\d+Y(?:\d+M(?:\d+D)?)?|\d+M(?:\d+D)?|\d+D)(?:{_DURATION_TIME})?"
             rf"|{_DURATION_TIME}|\d+W)")
_ANY_TEXT = r"(?s:.*)"
_FORMAT_PATTERNS = {
    "duration": _DURATION,
    "password": _ANY_TEXT,
    "binary": _ANY_TEXT,
    "path": _ANY_TEXT,
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "uuid": "-".join(f"{_HEXDIG}{{{n}}}" for n in (8, 4, 4, 4, 12)),
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "hostname": _HOSTNAME,
    "email": _EMAIL,
    "uri": _URI,
}
FORMATS = frozenset(_FORMAT_PATTERNS)


@functools.lru_cache(maxsize=None)
def format_ir(name: str) -> ir.Node:
  """The decoded strings of JSON Schema `format` `name` (see the module docstring).

  Raises:
    KeyError: `name` is not in `FORMATS`.
  """
  return _regex.parse_regex(_FORMAT_PATTERNS[name])
