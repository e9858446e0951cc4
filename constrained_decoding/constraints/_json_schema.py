"""JSON Schema front end: a schema -> the constraint IR of the JSON texts it accepts.

Public functions and classes:
  SchemaOptions                     how to lower: whitespace, strictness, depth bounds.
  lower_json_schema(schema, opts)   (IR node or recursive GrammarIR, ignored keyword pointers).
  pattern_ir, format_ir, FORMATS    re-exported from `_json_formats.py`.

The front end is split along its concepts: `_json_keywords.py` (keyword tables,
draft spellings, dict-level `allOf` merging), `_json_formats.py` (`pattern`, `format`),
`_json_objects.py` (member lists in any or schema order), `_json_negation.py`
(`not`, `if`, exact `oneOf`, `dependentSchemas` as positive schemas),
`_grammar_passes.py` (the grammar of recursive schemas); this module walks a schema and
lowers it, type by type.

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
              format, minLength, maxLength, enum, const), patternProperties (up to
              4 patterns: a key matching several satisfies all their schemas, and
              a declared key each pattern it matches),
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
  enforced, additional properties before and after them but not between two declared
  ones (`_json_objects.py`: an automaton over the set of declared keys written). It
  writes each value about 2^(n-1) times for n members, so an object whose copies would
  exceed `MAX_ANY_ORDER_SIZE` IR nodes or `MAX_ANY_ORDER_WIDE` (12) string bodies and
  schema-free values (3 string members fit, 4 do not), one with
  `minProperties`/`maxProperties`, or one with a recursive member keeps schema order
  (logged; `dependentRequired` there raises).
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
  `implied_types=False` follows the specification instead: such a schema also accepts
  every value of the other types.
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
  hostname (dot-separated RFC 1123 labels, at most 63 characters in all, so no label
  or name is too long; no `--`, as in punycode `xn--`), email (a dot-atom local part `@` a hostname: no quoted
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
import itertools
import json
import logging
import math
import urllib.parse

from constrained_decoding import errors
from constrained_decoding.constraints import _difference
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _grammar_passes
from constrained_decoding.constraints import _intersect
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_keywords
from constrained_decoding.constraints import _json_negation
from constrained_decoding.constraints import _json_objects
from constrained_decoding.constraints import _json_values as jv
from constrained_decoding.constraints._json_keywords import (  # pylint: disable=unused-import
    _ANNOTATIONS,
    _BOOLEAN,
    _DEFINITIONS,
    _MERGE_SHAPES,
    _NAME_KEYWORDS,
    _NEEDS,
    _NO_CONSTRAINT,
    _NUMBER,
    _OBJECT_MEMBER_KEYWORDS,
    _SUPPORTED,
    _TYPES,
    _TYPE_OF_KEYWORD,
    _UNSUPPORTED,
    _conjunction_key,
    _constraining,
    _exact,
    _has_type,
    _intersect_types,
    _join_uri,
    _legacy_draft,
    _own_id,
    _items,
    _json_type,
    _lazy_all_of,
    _merge_items,
    _merge_properties,
    _merged_values,
    _normalize,
    _pointer,
    _same_value,
    _short,
    _split_dependencies,
    _type_list,
    _unevaluated,
)
from constrained_decoding.constraints._json_formats import FORMATS, format_ir, pattern_ir

_log = logging.getLogger(__name__)
# Keywords whose values are JSON data, not subschemas (no `$id` or anchors inside).
_NOT_SCHEMAS = ("enum", "const", "default", "examples")

# Most IR nodes an any-order object may hold (members times the subsets each is written
# from, `_json_objects`); past it the object keeps schema order.
MAX_ANY_ORDER_SIZE = 10_000
# Most copies of string bodies and schema-free values an any-order object may hold
# (`_json_objects.wide_parts`): each costs ~10 ms and ~200 KiB once composed with
# Gemma 3's vocabulary. `dependentRequired` is exempt (the alternative is refusing it).
MAX_ANY_ORDER_WIDE = 12
_EXACT_TYPES = ("null", "boolean", "number", "string", "array", "object")  # Disjoint.
# Most items, characters or properties a `min*`/`max*` keyword may count (one automaton
# state each, the default `CompileOptions.max_states`); checked before anything is built.
MAX_COUNT = 100_000
# Most properties one object may declare (`properties` and `required`).
MAX_PROPERTIES = 5_000
# Most `enum` values, and bytes of them, lowered (a union of constants).
MAX_ENUM_VALUES = 20_000
MAX_ENUM_BYTES = 1_000_000
# Most `patternProperties` patterns (their key regions are the 2^N - 1 non-empty sets).
MAX_PATTERN_PROPERTIES = 4
_MAX_PRODUCT = 64  # Most alternatives `allOf` of two `anyOf`s may multiply into.
# Most distinct item values `uniqueItems: true` is supported for (2^N subset states).
MAX_UNIQUE_VALUES = 8


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
    implied_types: A schema without `type` takes the types its keywords apply to;
      False: every other type too, as the specification says.
  """

  whitespace: jv.Whitespace = jv.Whitespace()
  strict_properties: bool = False
  lenient: bool = False
  max_ref_depth: int | None = None
  free_form_depth: int = 2
  property_order: str = "any"
  implied_types: bool = True


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
  try:
    return _lower(schema, options)
  except RecursionError as e:
    raise errors.CompileBudgetError(
        "JSON Schema is nested too deeply for Python to walk. Expected at most a few"
        " hundred levels of nested subschemas. Flatten it with $defs and $ref.") from e


def _lower(schema, options: SchemaOptions):
  lowerer = _Lowerer(schema, options)
  if options.max_ref_depth is None and isinstance(schema, dict):
    node = lowerer.lower_root(schema)
    if lowerer.rules:
      return _grammar_passes.recursive_grammar(schema, node, lowerer.rules), tuple(lowerer.ignored)
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
    raise _json_keywords.unsatisfiable(schema)
  return node, tuple(lowerer.ignored)


class _Lowerer:
  """Walks one schema; holds the root (for `$ref`), options and what was ignored.

  With `max_ref_depth=None`, the conjunctions being lowered that went through a `$ref`
  are tracked by content (`active`); meeting one again inside itself makes it a rule:
  the inner occurrence becomes `RuleRef(name)` and the outer one registers its body in
  `rules` (name: the JSON pointer of its first `$ref`) and returns the `RuleRef` too.
  """

  def __init__(self, root, options: SchemaOptions):
    self.root = root
    self.legacy_ref = _legacy_draft(root)
    self._anchors: tuple | None = None  # See `_resource_index`.
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
    if any(k in schema for k in ("$ref", "$recursiveRef", "$dynamicRef")):
      schema = self._local_ref(schema, pointer)
    if "dependencies" in schema:  # Draft-07: dependentRequired + dependentSchemas.
      schema = _split_dependencies(schema, pointer)
    if any(k in schema for k in _BOOLEAN) or (
        "contains" in schema and "unevaluatedItems" in schema):
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

  def _local_ref(self, schema: dict, pointer: str) -> dict:
    """`schema` with its reference as a JSON pointer from the root in `$ref`.

    A `$ref` is a URI reference resolved against the base URI of where it sits (the
    `$id`s of the enclosing resources, RFC 3986): a resource of this document, a JSON
    pointer in it, or an anchor of it (`$anchor`, `$dynamicAnchor`, draft-07
    `$id: "#name"`). `$recursiveRef`/`$dynamicRef` resolve statically when the document
    embeds no other resource. With a draft-04/06/07 `$schema`, `$ref` overrides its
    siblings. A reference to another document is left as is (`_resolve` refuses it).
    """
    out = dict(schema)
    resources, anchors, embedded = self._resource_index()
    for key in ("$recursiveRef", "$dynamicRef"):
      if key in out:
        where = _pointer(pointer, key)
        if embedded or "$ref" in out:
          self.unsupported(where, (
              f"{key} at {where} resolves through the dynamic scope of embedded resources"
              " ($id), which is not supported. Expected a single-resource schema. Use"
              " $ref, or pass lenient=True to ignore it."))
          out.pop(key)
        else:
          out["$ref"] = out.pop(key)
    if "$ref" not in out or not isinstance(out["$ref"], str) or out.get("$resolved"):
      return out
    ref = out["$ref"]
    local = ref == "#" or ref.startswith("#/")
    base = self._base_uri(pointer) if len(resources) > 1 or not local else None
    if base is not None:  # Else a fragment of the only resource, the root: as it is.
      document, _, fragment = _join_uri(base, ref).partition("#")
      if document in resources:
        target = resources[document]
        if not fragment:
          ref = target
        elif fragment.startswith("/"):
          ref = target + fragment if target != "#" else "#" + fragment
        elif (document, fragment) in anchors:
          ref = anchors[document, fragment]
    out["$ref"], out["$resolved"] = ref, True  # Resolved once: `_check` runs again.
    if self.legacy_ref:
      out = {k: v for k, v in out.items() if k in ("$ref", "$resolved", *_DEFINITIONS)}
    return out

  def _base_uri(self, pointer: str) -> str:
    """The base URI at `pointer` (a JSON pointer from the root): the root's `$id`,
    joined with the `$id` of every enclosing subschema."""
    node = self.root
    base = _join_uri("", _own_id(node) or "")
    for token in pointer[2:].split("/") if pointer.startswith("#/") else ():
      token = token.replace("~1", "/").replace("~0", "~")
      if isinstance(node, dict) and token in node:
        node = node[token]
      elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
        node = node[int(token)]
      else:
        break
      if _own_id(node) and not (self.legacy_ref and "$ref" in node):
        base = _join_uri(base, _own_id(node))  # Draft 7: `$ref` hides its siblings.
    return base.partition("#")[0]

  def _resource_index(self) -> tuple[dict[str, str], dict[tuple[str, str], str], bool]:
    """(resource URI -> pointer, (resource URI, anchor) -> pointer, whether the
    document embeds resources other than the root)."""
    if self._anchors is None:
      root_base = _join_uri("", _own_id(self.root) or "").partition("#")[0]
      resources, anchors, embedded = {root_base: "#"}, {}, False
      todo = [(self.root, "#", root_base)]
      while todo:
        node, where, base = todo.pop()
        if isinstance(node, dict):
          ident = node.get("$id", node.get("id"))
          if isinstance(ident, str) and where != "#":
            if ident.startswith("#"):
              anchors.setdefault((base, ident[1:]), where)  # Draft-07 anchor.
            elif _own_id(node) and not (self.legacy_ref and "$ref" in node):
              base = _join_uri(base, ident).partition("#")[0]
              resources.setdefault(base, where)
              embedded = True
          for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(key), str):
              anchors.setdefault((base, node[key]), where)
          todo += [(v, _pointer(where, k), base) for k, v in node.items()
                   if isinstance(v, (dict, list)) and k not in _NOT_SCHEMAS]
        elif isinstance(node, list):
          todo += [(v, _pointer(where, i), base) for i, v in enumerate(node)]
      self._anchors = (resources, anchors, embedded)
    return self._anchors

  def _check_unevaluated(self, merged: dict, pointer: str) -> dict:
    """Refuses `unevaluated*` where a merged part came from a negation (`$fromNot`):
    its properties and items do not count as evaluated, but merging would count them."""
    if "$fromNot" not in merged:
      return merged
    for key in ("$unevaluatedProperties", "$unevaluatedItems"):
      if key in merged:
        where = _pointer(pointer, key[1:])
        self.unsupported(where, (
            f"{key[1:]} at {where} applies to a schema with not, or if/else, in an allOf"
            " or $ref: their annotations do not count as evaluated, which is not"
            f" supported. Expected them apart. Pass lenient=True to ignore {key[1:]}."))
        merged = {k: v for k, v in merged.items() if k != key}
    return merged

  def _rewrite_boolean(self, schema: dict, pointer: str) -> dict:
    """`not`, `if`/`then`/`else`, `dependentSchemas` as `allOf` parts (`_json_negation`).

    Annotations from `not` and a failed `if` do not count for `unevaluated*`, but the
    rewritten parts would: that combination is refused.
    """
    for key in ("unevaluatedProperties", "unevaluatedItems"):
      if key in schema and ("not" in schema or "if" in schema or
                            key == "unevaluatedItems" and "contains" in schema):
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
    merged = self._check_unevaluated(merged, where)
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
    disjoint = self._disjoint(alternatives, pointer)
    for name in ("$unevaluatedProperties", "$unevaluatedItems"):
      if name in rest and not disjoint:
        where = _pointer(pointer, name[1:])
        self.unsupported(where, (
            f"{name[1:]} at {where} next to a {key} whose alternatives may overlap is not"
            " supported (what counts as evaluated depends on every matching alternative)."
            f" Expected alternatives of different types or const tags. Pass lenient=True to"
            f" ignore {name[1:]}."))
        rest.pop(name)
    if key == "oneOf" and not disjoint:
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
      elif key in ("pattern", "format", "$notPattern", "$notFormat"):  # Tuple: all apply.
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
    if len(values) > MAX_ENUM_VALUES or sum(
        len(json.dumps(v)) for v in values[:MAX_ENUM_VALUES + 1]) > MAX_ENUM_BYTES:
      raise errors.CompileBudgetError(
          f"enum at {_pointer(pointer, 'enum')} has {len(values)} values; expected at most"
          f" {MAX_ENUM_VALUES} values and {MAX_ENUM_BYTES} bytes (each value is a branch of"
          " the automaton). Use a pattern or a type instead.")
    checks = {}  # Keywords that filter the values, by the JSON type they apply to.
    excluded = schema.get("$notIn", [])
    values = [v for v in values if not any(_same_value(v, w) for w in excluded)]
    for key in schema:
      if key in _NO_CONSTRAINT or key in ("enum", "const", "type", "$notIn", "$fromNot"):
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
    if inferred and not self.options.implied_types:  # Keywords pass other types.
      return list(dict.fromkeys([*inferred, *_EXACT_TYPES]))
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
    if value > MAX_COUNT:
      raise errors.CompileBudgetError(
          f"{key} {value} at {_pointer(pointer, key)} needs an automaton of more than"
          f" {MAX_COUNT} states (one per counted item or character). Expected at most"
          f" {MAX_COUNT}. Lower it, or drop it if no output comes near it.")
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
    negated = [self._pattern(p, pointer) for p in _merged_values(schema, "$notPattern")]
    negated += [format_ir(f) for f in _merged_values(schema, "$notFormat")]
    for language in negated:  # From `not`: the texts outside the language.
      try:
        texts.append(_intersect.complement_text(language))
      except ValueError as e:
        raise errors.UnsupportedSchemaError(
            f"The string at {pointer} excludes a pattern or format (from not, oneOf or if)"
            f" whose complement is too large: {e}. Expected a simpler pattern.") from e
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
    if len(properties) + len(required) > MAX_PROPERTIES:
      raise errors.CompileBudgetError(
          f"The object at {pointer} declares {len(properties) + len(required)} properties;"
          f" expected at most {MAX_PROPERTIES} (each is a branch of the automaton). Split"
          " it, or describe the keys with patternProperties or propertyNames.")
    patterns = self._pattern_properties(schema, pointer)
    depends = self._dependent_required(schema, pointer)
    members = []
    dependent_keys = [k for key, targets in depends.items() for k in (key, *targets)]
    for key in dict.fromkeys([*properties, *required, *dependent_keys]):
      matches = [(s, where) for text, s, where in patterns if _has_text(text, key)]
      if key in properties:
        subschema, where = properties[key], _pointer(pointer, "properties", key)
      elif matches:
        subschema, where = True, matches[0][1]
      else:
        subschema, where = additional, _pointer(pointer, "additionalProperties")
      for pattern_schema, _ in matches:  # Every matching pattern's schema applies too.
        subschema = _lazy_all_of(subschema, pattern_schema)
      if names is not None and not _has_text(names, key):
        node = ir.NOTHING  # propertyNames forbids the key.
      else:
        node = self.lower(subschema, where)
      members.append((key, node, key in required))
    declared = [k for k, _, _ in members]
    extra = None
    if patterns:  # Keys matching some pattern; no others (module doc).
      extra = self._pattern_members(patterns, declared, names, pointer)
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
      body, can_be_empty = _json_objects.schema_order_members([(m, r) for _, m, r in members], extra, ws)
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

    Schema order is kept for objects past `MAX_ANY_ORDER_SIZE`/`_WIDE` and for members that
    call a recursive rule (a subset automaton would be written out as an expression);
    `dependentRequired` needs the subsets, so there it raises instead.
    """
    memo: dict = {}
    sizes = [_json_objects.ir_size(member) for _, member, _ in members]
    result = None
    if not any(_grammar_passes.has_rule_ref(member, memo) for _, member, _ in members):
      result = _json_objects.any_order_members(
          members, extra, self.ws, depends, MAX_ANY_ORDER_SIZE, sizes,
          0 if extra is None else _json_objects.ir_size(extra),
          None if depends else MAX_ANY_ORDER_WIDE)
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
                " would exceed %d IR nodes or %d string bodies, or a member is"
                " recursive).", pointer, len(members), MAX_ANY_ORDER_SIZE,
                MAX_ANY_ORDER_WIDE)
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

  def _pattern_properties(self, schema: dict, pointer: str) -> list:
    """[(decoded-text IR, schema, pointer)] of the `patternProperties` entries."""
    patterns = schema.get("patternProperties", {})
    where = _pointer(pointer, "patternProperties")
    if not isinstance(patterns, dict):
      raise errors.SchemaError(
          f"patternProperties at {where} is {_short(patterns)}. Expected an object mapping"
          " patterns to schemas. Fix the value.")
    if len(patterns) > MAX_PATTERN_PROPERTIES:
      self.unsupported(where, (
          f"patternProperties at {where} has {len(patterns)} patterns. Expected at most"
          f" {MAX_PATTERN_PROPERTIES} (keys matching several patterns need every matching"
          " schema: one region per subset of patterns). Merge some, or pass lenient=True"
          " to ignore the keyword."))
      return []
    return [(self._pattern(p, _pointer(where, p)), subschema, _pointer(where, p))
            for p, subschema in patterns.items()]

  def _pattern_members(self, patterns: list, declared: list, names, pointer: str):
    """The undeclared members whose keys match some pattern: for each non-empty set of
    patterns, the keys matching exactly those (the others' complements) with a value
    that satisfies all of their schemas; None if no key can."""
    ws = self.ws
    parts = []
    complements = {}
    for size in range(1, len(patterns) + 1):
      for chosen in itertools.combinations(range(len(patterns)), size):
        keys = [patterns[i][0] for i in chosen] + [jv.text_except(declared)]
        if names is not None:
          keys.append(names)
        for j in range(len(patterns)):
          if j not in chosen:
            if j not in complements:
              complements[j] = _intersect.complement_text(patterns[j][0])
            keys.append(complements[j])
        text = self._intersect_texts(keys, _pointer(pointer, "patternProperties"))
        if text == ir.NOTHING:
          continue
        schema = True
        for i in chosen:
          schema = _lazy_all_of(schema, patterns[i][1])
        value = self.lower(schema, patterns[chosen[0]][2])
        if value != ir.NOTHING:
          parts.append(ir.concat(_quoted(jv.encode_text(text)), ws.colon, value))
    return ir.union(*parts) if parts else None

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


def _quoted(body: ir.Node) -> ir.Node:
  return ir.concat(ir.Bytes(b'"'), body, ir.Bytes(b'"'))


