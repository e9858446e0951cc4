"""JSON Schema front end: a schema -> the constraint IR of the JSON texts it accepts.

Public functions and classes:
  SchemaOptions                     how to lower: whitespace, strictness, depth bounds.
  lower_json_schema(schema, opts)   (IR node or recursive GrammarIR, ignored keyword pointers).
  pattern_ir, format_ir, FORMATS    re-exported from `_json_formats.py`.

The front end is split along its concepts: `_json_keywords.py` (keyword tables,
draft spellings, keyword values read, dict-level `allOf` merging), `_json_refs.py`
(keywords checked, `$ref`s resolved), `_json_conjunctions.py` (conjunctions merged,
recursive ones made rules),
`_json_boolean.py` and `_json_negation.py` (`anyOf`/`oneOf`; `not`, `if`, exact `oneOf`,
`dependentSchemas` as positive schemas), `_json_scalar_schemas.py` (strings and
numbers), `_json_formats.py` (`pattern`, `format`), `_json_object_schemas.py` and
`_json_objects.py` (objects; member lists in any or schema order),
`_json_array_schemas.py` (arrays), `_grammar_passes.py` (the grammar of recursive
schemas). This module holds the options, the entry point and the lowering's state
(`_Lowerer`), and dispatches a schema to them, type by type.

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
  string      minLength, maxLength (in code points), pattern (lookaheads `(?!X)`,
              `(?=X)` right after `^`: intersections), format (together: their
              intersection, `_intersect.py`).
  integer     minimum, maximum, exclusiveMinimum, exclusiveMaximum (exact ranges).
  number      the same (decimal bounds too: 0.25 <= x < 2.5 is exact).
  object      properties, required, dependentRequired (and draft-07 `dependencies`
              with arrays), additionalProperties, propertyNames (any schema over
              strings: allOf, anyOf, oneOf, not, if, $ref of the string keywords,
              enum, const), patternProperties (up to
              4 patterns: a key matching several satisfies all their schemas, and
              a declared key each pattern it matches),
              minProperties, maxProperties.
  array       items, prefixItems, additionalItems, minItems, maxItems, uniqueItems (true:
              for items with at most `_json_array_schemas.MAX_UNIQUE_VALUES` = 8
              values, such as enums,
              booleans or small integer ranges: every set of distinct values, in any
              order; pydantic's `set[SomeEnum]`), contains with minContains and
              maxContains (next to items, minItems, maxItems; not with prefixItems).
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
(`$dynamicRef`/`$recursiveRef` whose target depends on the path, `_json_refs.py`, and the
cases listed under "Boolean structure") raise
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
  exceed `MAX_ANY_ORDER_SIZE` IR nodes or `MAX_ANY_ORDER_WIDE` (6) wide parts (string
  bodies and schema-free values; formats such as `email` count more, `wide_parts`: 2
  string members fit, 3 do not) is written once, linearly, with
  register markers: the device checks its keys in a few int32 words per row
  (`_json_objects.register_object`, `automata/_registers.py`), additional properties
  anywhere among the declared ones. Inside a recursive schema, or where the compiler
  cannot fold the markers (a union of objects that starts alike), the object keeps
  schema order instead (`"any_bounded"`, the compiler's fallback), as does one with
  `minProperties`/`maxProperties` or a recursive member (logged; `dependentRequired`
  beside size bounds is counted on the device, see below, or raises).
  `"schema"`: declared properties in schema order, optional ones skippable,
  additional properties only after them (linear size). Additional properties have keys
  that are any string except the declared keys; two additional properties may share a
  key (preventing it is not regular; each value is valid, so is whichever a parser
  keeps). With
  `patternProperties`, undeclared keys are generated only if they match its pattern
  (values per its schema): keys matching no pattern, which `additionalProperties`
  (absent: any value) would allow, are not generated. Towards `minProperties` only
  the first additional property counts (later ones may repeat its key, and a parser
  keeps one), except where a minimum needs two or more of them, or size bounds meet
  `dependentRequired` or `dependentSchemas` (`{"k": {"minProperties": 4}}`): then every
  key is checked distinct and the members are counted on the device
  (`_json_counted_objects`: additional properties after the declared ones, at most
  `maxProperties` members, else 32); where registers are off there (below a union of
  objects, property_order other than "any", a recursive member, patternProperties)
  such a minimum raises `UnsupportedSchemaError`.
  `strict_properties=True` forbids additional properties in objects that declare
  `properties` or `required` unless `additionalProperties` is an explicit schema;
  `{"type": "object"}` alone stays a free-form object.
* Free-form values (`{}`, `true`, absent `items`, additional property values) are
  schema-free JSON nested at most `free_form_depth` containers deep. With
  `free_form_depth=None` each is a call of one rule (`FREE_FORM_RULE`, any JSON up to
  the device stack). Where such a call competes with an inline value of another branch
  (a `contains` item, an `anyOf` of objects that declare different keys), the push-down
  automaton could not choose: the compiler then retries with the free-form values
  there written inline down to the competitor's depth, then calls (the same language,
  `_json_free_form_align.py`), and raises `NondeterministicGrammarError` only if that
  fails too (a recursive `$ref` alike with another branch, below).
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
  unbounded up to the runtime's `CompileOptions.stack_depth` (the mask never offers
  deeper nesting than can still close; feeding it sets the row's `error`). The grammar
  must be deterministic with one byte of lookahead. An `anyOf`
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
  is rejected with `UnsupportedSchemaError`. A `$ref` into another document resolves
  (RFC 3986, against the enclosing `$id`s) only to a document passed in
  `JsonSchema(resources={uri: schema})`; any other is refused, naming its URI.
  With `shared_definitions="call"`, a non-recursive target lowered to the same IR in
  several places becomes a rule as well, called where it was inlined (same language;
  `_json_shared.py`, which also says why inlining stays the default).
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
import json
import logging

from constrained_decoding import errors
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _grammar_passes
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_array_schemas
from constrained_decoding.constraints import _json_boolean
from constrained_decoding.constraints import _json_conjunctions
from constrained_decoding.constraints import _json_free_form_align
from constrained_decoding.constraints import _json_keywords
from constrained_decoding.constraints import _json_object_schemas
from constrained_decoding.constraints import _json_refs
from constrained_decoding.constraints import _json_scalar_schemas
from constrained_decoding.constraints import _json_shared
from constrained_decoding.constraints import _json_values as jv
from constrained_decoding.constraints._json_keywords import (
    _NO_CONSTRAINT,
    _TYPE_OF_KEYWORD,
    _has_type,
    _legacy_draft,
    _normalize,
    _pointer,
    _same_value,
)
# Re-exported for the callers of this module.
from constrained_decoding.constraints._json_formats import (  # pylint: disable=unused-import
    FORMATS,
    format_ir,
    pattern_ir,
)

_log = logging.getLogger(__name__)

_EXACT_TYPES = ("null", "boolean", "number", "string", "array", "object")  # Disjoint.
# Most `enum` values, and bytes of them, lowered (a union of constants).
MAX_ENUM_VALUES = 20_000
MAX_ENUM_BYTES = 1_000_000


@dataclasses.dataclass(frozen=True)
class SchemaOptions:
  """How a schema is lowered (see `JsonSchema` for the user-facing arguments).

  Attributes:
    whitespace: Where whitespace may go.
    strict_properties: Forbid additional properties unless given by a schema.
    lenient: Ignore (and record) unsupported keywords instead of raising: True for
      every keyword, or a tuple of the keyword names to ignore (the others raise).
    max_ref_depth: None: recursive `$ref`s become grammar rules (unbounded nesting).
      N: most expansions of one recursive `$ref` along a path (a regular language).
    free_form_depth: Nesting limit of free-form values; None: unbounded, a grammar rule
      (`FREE_FORM_RULE`) on the device stack.
    property_order: "any" (declared keys in any order, each at most once; large
      objects check their keys in registers), "any_bounded" (the same, schema order
      past the any-order budget instead of registers) or "schema" (in the order
      `properties` lists them).
    implied_types: A schema without `type` takes the types its keywords apply to;
      False: every other type too, as the specification says.
    resources: (absolute URI, canonical JSON text) pairs: the other documents a `$ref`
      may point into (`JsonSchema.resources`, read by `_json_refs`).
    shared_definitions: "inline": every non-recursive `$ref` target lowered at each
      use; "call": one lowered to the same IR in several places becomes a grammar
      rule called on the device stack (`_json_shared.py`). Needs `max_ref_depth=None`.
    free_form_align: With `free_form_depth=None`: "none" (every free-form value a
      call), "points" or "rule" (free-form values inlined where a call would compete
      with an inline value of another branch, `_json_free_form_align.py`). The
      compiler asks for them in turn when the calls make the grammar nondeterministic
      (`free_form_alignments`).
  """

  whitespace: jv.Whitespace = jv.Whitespace()
  strict_properties: bool = False
  lenient: bool | tuple[str, ...] = False
  max_ref_depth: int | None = None
  free_form_depth: int | None = 2
  property_order: str = "any"
  implied_types: bool = True
  resources: tuple[tuple[str, str], ...] = ()
  shared_definitions: str = "inline"
  free_form_align: str = "none"


# The grammar rule every free-form value calls when `free_form_depth=None`.
FREE_FORM_RULE = "#(free-form JSON value)"


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


def _lower(schema, options: SchemaOptions, use_registers: bool = True):
  if options.free_form_depth is None and schema is True:
    schema = {}  # The root itself free-form: lowered as a rule like any other.
  lowerer = _Lowerer(schema, options, use_registers)
  if options.max_ref_depth is None and isinstance(schema, dict):
    node = lowerer.lower_root(schema)
    # Register constructs in a recursive schema call no rule that uses registers
    # (`_json_object_schemas._calls`): their words survive every push and pop.
    node, rules, called = _json_shared.share(lowerer, node, lowerer.rules)
    if options.free_form_align != "none":
      node, rules = _aligned(node, rules, options)
    if rules:
      # The free-form rule derives no empty string and calls no other rule, so graphs
      # (any-order objects) that only call it may stay graphs.
      graph_calls = frozenset({FREE_FORM_RULE} & rules.keys())
      return (_grammar_passes.recursive_grammar(schema, node, rules, keep=called,
                                                graph_calls=graph_calls),
              tuple(lowerer.ignored))
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


class _NothingAligned(Exception):
  """`free_form_align` left every rule as it was (`free_form_alignments` skips it)."""


def _aligned(node: ir.Node, rules: dict[str, ir.Node], options: SchemaOptions):
  """(root, rules) with free-form calls inlined where they compete
  (`_json_free_form_align`); the free-form rule itself stays as it is.

  Raises:
    _NothingAligned: No free-form call was inlined.
  """
  def align(body: ir.Node) -> ir.Node:
    return _json_free_form_align.align_free_form(body, options.whitespace, FREE_FORM_RULE,
                                                 options.free_form_align)
  new_node = align(node)
  new_rules = {name: body if name == FREE_FORM_RULE else align(body)
               for name, body in rules.items()}
  if new_node is node and all(new_rules[name] is body for name, body in rules.items()):
    raise _NothingAligned()
  return new_node, new_rules


def free_form_alignments(schema, options: SchemaOptions):
  """(scope, language) for each way `_json_free_form_align` may write the free-form
  calls of `schema` differently (`free_form_depth=None`), narrowest scope first: what
  the compiler tries, in turn, when the plain calls make the grammar nondeterministic
  (the language is the same). Yields nothing for other options, and skips a scope
  that inlines nothing.

  Raises:
    As `lower_json_schema`.
  """
  if options.free_form_depth is not None or options.free_form_align != "none":
    return
  for scope in _json_free_form_align.ALIGN_SCOPES[1:]:
    try:
      yield scope, lower_json_schema(
          schema, dataclasses.replace(options, free_form_align=scope))[0]
    except _NothingAligned:
      continue


class _Lowerer:
  """Walks one schema; holds the root (for `$ref`), options and what was ignored.

  The lowering of each concept lives in its module (module doc) as functions that take
  this object first (`lw`): they read its options and state and call back `lower` for
  subschemas, so the modules need not import one another.

  With `max_ref_depth=None`, the conjunctions being lowered that went through a `$ref`
  are tracked by content (`active`); meeting one again inside itself makes it a rule:
  the inner occurrence becomes `RuleRef(name)` and the outer one registers its body in
  `rules` (name: the JSON pointer of its first `$ref`) and returns the `RuleRef` too.
  """

  def __init__(self, root, options: SchemaOptions, use_registers: bool = True):
    self.root = root
    # Large any-order objects check their keys in register words on the device
    # (`_json_objects.register_object`); words handed out so far.
    self.use_registers = use_registers
    # False for the whole walk with `use_registers=False`; `use_registers` is also turned
    # off locally, below unions of objects.
    self.registers_allowed = use_registers
    self.register_words = 0
    self.register_blocks: dict = {}  # (members, extra) -> first word of its block.
    self.legacy_ref = _legacy_draft(root)
    self._anchors: tuple | None = None  # See `_json_resources._resource_index`.
    self.options = options
    self.ws = options.whitespace
    self.ignored: list[str] = []
    self.cut: list[str] = []
    self.expanding: collections.Counter = collections.Counter()
    if options.free_form_depth is None:
      # Unbounded: every free-form value calls one rule of schema-free JSON, registered
      # in `rules` on first use (`any_value`), so the schema becomes a grammar.
      self._any_value = ir.RuleRef(FREE_FORM_RULE)
      self._extra_value = ir.concat(self.ws.gap, self._any_value)
    else:
      self._any_value = jv.json_value(self.ws, options.free_form_depth)
      # A schema-free property value (additional properties, `{}`/`true` properties):
      # one fragment that the compiler composes with the vocabulary once and splices
      # into every schema (`automata/_splice.py`). (Its leading whitespace goes inside:
      # the fragment must be all that may come next.)
      self._extra_value = jv.json_value_fragment(self.ws, options.free_form_depth,
                                                 leading_gap=True)
    self.extra_colon = (self.ws.colon if self.ws.gap == ir.EPSILON
                        else ir.concat(self.ws.gap, ir.Bytes(b":")))
    self.chain: list[str] = []  # `$ref`s being flattened, outermost first.
    self.active: set[str] = set()  # Keys of the conjunctions being lowered.
    self.names: dict[str, str] = {}  # Key -> rule name, once met inside itself.
    self.rules: dict[str, ir.Node] = {}  # Rule name -> body, once lowered.
    # Key -> ($ref, [IR of each inlined lowering]): the candidates for a shared rule.
    self.inlined: dict[str, tuple[str, list]] = {}
    self.root_flat: list | None = None  # The root's conjuncts, and their key ("#").
    self.root_key: str | None = None
    # Records keep this module's logger name wherever the code that logs lives
    # (`benchmarks/schema_corpus.py` listens to it).
    self.log = _log
    # Per-measure memos of `ir.fold` over the IR built so far (by node identity), so
    # that measuring each object as objects nest stays linear: "size"
    # (`_json_objects.ir_size`), "wide" (`wide_parts`), "refs"
    # (`_json_object_schemas._rule_refs`), "callable".
    self.memos: collections.defaultdict = collections.defaultdict(dict)

  def unsupported(self, pointer: str, message: str) -> None:
    """Raises `UnsupportedSchemaError(message)`, or records `pointer` when lenient."""
    if not self.ignores(pointer):
      raise errors.UnsupportedSchemaError(message)
    if pointer not in self.ignored:
      self.ignored.append(pointer)

  def ignores(self, pointer: str) -> bool:
    """Whether the unsupported keyword at `pointer` (its last token names it) is ignored:
    `lenient=True`, or its name is in the `lenient` tuple."""
    lenient = self.options.lenient
    if isinstance(lenient, bool):
      return lenient
    keyword = pointer.rpartition("/")[2].replace("~1", "/").replace("~0", "~")
    return keyword in lenient

  def annotation(self, pointer: str) -> None:
    """Records an ignored annotation (unknown keyword or `format`) at `pointer`."""
    if pointer not in self.ignored:
      self.ignored.append(pointer)
      _log.info("JSON Schema: %s is not an assertion this library knows; ignored as an"
                " annotation.", pointer)

  @property
  def any_value(self) -> ir.Node:
    """A free-form JSON value (`{}`, `true`, absent `items`, ...)."""
    if isinstance(self._any_value, ir.RuleRef) and FREE_FORM_RULE not in self.rules:
      self.rules[FREE_FORM_RULE] = jv.json_value_rule(self.ws, FREE_FORM_RULE)
    return self._any_value

  def may_hold_rule_refs(self) -> bool:
    """Whether IR built so far may hold an `ir.RuleRef`. The lowering makes them only
    for a conjunction met inside itself (`_json_conjunctions._lower_rule`, which names
    it in `names` first) and for free-form values with `free_form_depth=None`; while
    neither happened, analyses that look for references need not walk the IR."""
    return bool(self.names) or isinstance(self._any_value, ir.RuleRef)

  def is_free_form(self, node: ir.Node) -> bool:
    """Whether `node` is `any_value` (cheap: equal nodes share their parts)."""
    return node == self._any_value

  @property
  def extra_value(self) -> ir.Node:
    """An additional property's value, with the whitespace before it."""
    self.any_value  # pylint: disable=pointless-statement  (registers the rule if one)
    return self._extra_value

  def lower(self, schema, pointer: str) -> ir.Node:
    """The IR of one (sub)schema; `pointer` locates it for error messages."""
    if schema is True:
      return self.any_value
    if schema is False:
      return ir.NOTHING
    schema = _json_refs.check(self, _json_keywords.schema_dict(schema, pointer), pointer)
    if "$ref" in schema or "allOf" in schema:
      return _json_conjunctions.lower_conjunction(self, [(schema, pointer)], pointer)
    return self.lower_plain(_normalize(schema, pointer), pointer)

  def lower_root(self, schema: dict) -> ir.Node:
    """`lower(schema, "#")`, but as a conjunction that `{"$ref": "#"}` can recurse into."""
    return _json_conjunctions.lower_conjunction(self, [(schema, "#")], "#", root=True)

  def lower_plain(self, schema: dict, pointer: str) -> ir.Node:
    """A schema without `$ref` or `allOf` at its top."""
    for key in ("anyOf", "oneOf"):
      if key in schema:
        return _json_boolean.lower_any_of(self, schema, key, pointer)
    if "enum" in schema or "const" in schema:
      return self._lower_enum(schema, pointer)
    return ir.union(*(self._lower_type(t, schema, pointer) for t in self._types(schema, pointer)))

  def _lower_enum(self, schema: dict, pointer: str) -> ir.Node:
    values = _json_keywords.enum_values(schema, pointer)
    if len(values) > MAX_ENUM_VALUES or sum(
        len(json.dumps(v)) for v in values[:MAX_ENUM_VALUES + 1]) > MAX_ENUM_BYTES:
      raise errors.CompileBudgetError(
          f"enum at {_pointer(pointer, 'enum')} has {len(values)} values; expected at most"
          f" {MAX_ENUM_VALUES} values and {MAX_ENUM_BYTES} bytes (each value is a branch of"
          " the automaton). Use a pattern or a type instead.")
    checks = {}  # Keywords that filter the values, by the JSON type they apply to.
    excluded = schema.get("$notIn", [])
    values = [v for v in values if not any(_same_value(v, w) for w in excluded)]
    if "type" in schema:
      types = _json_keywords.type_names(schema["type"], pointer)
      values = [v for v in values if _has_type(v, types)]
    for key in schema:
      if key in _NO_CONSTRAINT or key in ("enum", "const", "type", "$notIn", "$fromNot"):
        continue
      kind = _TYPE_OF_KEYWORD.get(key)
      if kind in ("string", "number"):
        checks[kind] = True
        continue
      if kind in ("object", "array") and not any(_has_type(v, [kind]) for v in values):
        continue  # It applies to values of its type only, and no value has it.
      where = _pointer(pointer, key)
      self.unsupported(where, (
          f"JSON Schema keyword {key!r} at {where} is combined with enum/const, which is"
          " not supported. Expected type, string or number keywords next to enum or"
          " const. Filter the enum values yourself, or pass lenient=True to ignore the"
          " keyword."))
    if "string" in checks:  # Keywords apply to values of their type only.
      values = [v for v in values
                if not isinstance(v, str)
                or _json_scalar_schemas.valid_string(self, v, schema, pointer)]
    if "number" in checks:
      values = [v for v in values
                if not _has_type(v, ["number"])
                or _json_scalar_schemas.valid_number(v, schema, pointer)]
    nodes = []
    for value in values:
      try:
        nodes.append(jv.const_value(value, self.ws))
      except ValueError as e:
        raise errors.SchemaError(f"enum/const at {pointer}: {e}") from e
    return ir.union(*nodes) if nodes else ir.NOTHING

  def _types(self, schema: dict, pointer: str) -> list[str]:
    if "type" in schema:
      return _json_keywords.type_names(schema["type"], pointer)
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
      return _json_scalar_schemas.lower_string(self, schema, pointer)
    if name in ("integer", "number"):
      return _json_scalar_schemas.lower_number(name, schema, pointer)
    if name == "object":
      return _json_object_schemas.lower_object(self, schema, pointer)
    return _json_array_schemas.lower_array(self, schema, pointer)

  # ---- For the modules that do not import `_json_refs`. ----

  def resolve(self, ref, pointer: str):
    """`_json_refs.resolve`: the subschema a local `$ref` points to."""
    return _json_refs.resolve(self, ref, pointer)

  def lower_conjunction(self, branches: list, pointer: str, *, root: bool = False) -> ir.Node:
    """`_json_conjunctions.lower_conjunction`: `allOf` of (schema, pointer) branches."""
    return _json_conjunctions.lower_conjunction(self, branches, pointer, root=root)
