"""Specs whose texts denote values: JSON Schema, schema-free JSON and dataclasses.

Each has `parse(text)`, the value a generated text denotes (`Completion.value`). Split
from `_specs.py` (which holds `Regex` and `Grammar`, and re-exports these names); the
same rules hold: specs are frozen, hashable cache keys that lower with `to_ir()`.
"""

import dataclasses
import functools
import json
import re
import typing

from constrained_decoding import errors as _errors
from constrained_decoding.constraints import _dataclass
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_schema
from constrained_decoding.constraints import _json_shared
from constrained_decoding.constraints import _json_values


def _check_spec_int(owner: str, name: str, value, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(
        f"{owner} {name} {value!r} is not an int >= {minimum}. Expected e.g. {max(minimum, 2)}."
        f" Pass an int."
    )


def _is_pydantic_model(obj) -> bool:
  """Whether `obj` is a pydantic (v2) model class (checked without importing pydantic)."""
  return (isinstance(obj, type) and callable(getattr(obj, "model_json_schema", None))
          and callable(getattr(obj, "model_validate_json", None)))


def _canonical_schema(schema) -> str:
  """Canonical JSON text (key order kept: it is the property order) of a schema."""
  if isinstance(schema, type) and hasattr(schema, "model_json_schema"):  # pydantic model
    schema = schema.model_json_schema()
  if isinstance(schema, str):
    try:
      schema = json.loads(schema)
    except json.JSONDecodeError as e:
      raise _errors.SchemaError(
          f"JSON Schema text {schema[:40]!r} is not valid JSON: {e.msg} at position {e.pos}."
          " Expected a JSON object or boolean. Fix the text, or pass a dict."
      ) from e
  if not isinstance(schema, (dict, bool)):
    raise _errors.SchemaError(
        f"JSON Schema {schema!r} is a {type(schema).__name__}. Expected a dict, a bool, JSON"
        " text or a pydantic model class. Pass the schema as a dict."
    )
  try:
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
  except RecursionError as e:
    raise _errors.CompileBudgetError(
        "JSON Schema is nested too deeply for Python to walk. Expected at most a few"
        " hundred levels of nested subschemas. Flatten it with $defs and $ref.") from e
  except (TypeError, ValueError) as e:
    raise _errors.SchemaError(
        f"JSON Schema {schema!r} holds a value that is not JSON: {e}. Expected only dicts,"
        " lists, strings, finite numbers, booleans and None. Remove the offending value."
    ) from e


_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def _canonical_resources(resources) -> tuple[tuple[str, str], ...]:
  """`JsonSchema.resources` as (absolute URI, canonical JSON text) pairs sorted by URI.

  Accepts a mapping, or such pairs (as the field holds them, for `dataclasses.replace`).
  """
  if resources is None:
    return ()
  if isinstance(resources, (str, bytes)) or not (
      isinstance(resources, (dict, tuple, list)) or hasattr(resources, "items")):
    raise _errors.SchemaError(
        f"JsonSchema resources is a {type(resources).__name__}. Expected a mapping from"
        " absolute URI to schema, e.g. {'https://example.com/a.json': {...}}.")
  items = list(resources.items()) if hasattr(resources, "items") else list(resources)
  out = {}
  for item in items:
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
      raise _errors.SchemaError(
          f"JsonSchema resources entry {item!r} is not a (URI, schema) pair. Expected a"
          " mapping from absolute URI to schema.")
    uri, schema = item
    if not isinstance(uri, str):
      raise _errors.SchemaError(
          f"JsonSchema resources key {uri!r} is a {type(uri).__name__}. Expected an"
          " absolute URI string such as 'https://example.com/a.json'.")
    document, _, fragment = uri.partition("#")
    if fragment or not _URI_SCHEME.match(document):
      raise _errors.SchemaError(
          f"JsonSchema resources key {uri!r} is not an absolute URI without fragment."
          " Expected a scheme and no '#...', e.g. 'https://example.com/a.json'.")
    if document in out:
      raise _errors.SchemaError(
          f"JsonSchema resources key {uri!r} names the document {document!r} twice."
          " Expected each URI once.")
    try:
      out[document] = _canonical_schema(schema)
    except _errors.SchemaError as e:
      raise _errors.SchemaError(f"JsonSchema resources[{uri!r}]: {e}") from e
  return tuple(sorted(out.items()))


def _canonical_lenient(lenient) -> bool | tuple[str, ...]:
  """`lenient` as a bool or a sorted tuple of keyword names (hashable, canonical)."""
  if isinstance(lenient, bool):
    return lenient
  if isinstance(lenient, str) or not isinstance(lenient, (tuple, list, set, frozenset)) or \
      not all(isinstance(k, str) and k for k in lenient):
    raise _errors.SchemaError(
        f"JsonSchema lenient is {lenient!r}. Expected True, False, or a collection of"
        " keyword names such as ('uniqueItems',).")
  return tuple(sorted(set(lenient))) or False


PROPERTY_ORDERS = ("any", "any_bounded", "schema")


@dataclasses.dataclass(frozen=True)
class JsonSchema:
  """The output must be a JSON text that a JSON Schema accepts.

  ```python
  spec = JsonSchema({"type": "object",
                     "properties": {"answer": {"enum": ["A", "B", "C", "D"]}},
                     "required": ["answer"]}, strict_properties=True)
  spec.parse('{"answer":"B"}')  # {'answer': 'B'}
  ```

  Supported keywords, and the narrowings made for generation (property order,
  whitespace, number and string formatting, ...), are listed in
  `constraints/_json_schema.py`. A dict schema is canonicalized to JSON text (key order
  kept) so that the spec is hashable; a pydantic model class is read through its
  `model_json_schema()` and kept as `model`, so that `parse` (and so `Completion.value`)
  returns an instance of it:

  ```python
  spec = JsonSchema(Answer)           # Answer: a pydantic.BaseModel subclass
  spec.parse('{"answer":"B"}')        # Answer(answer='B')
  ```

  Recursive schemas (`$ref` to an enclosing definition: trees, linked lists, mutually
  recursive `$defs`) compile by default to a push-down automaton whose stack lives on
  the device: nesting is unbounded up to `CompileOptions.stack_depth` (the mask never
  offers deeper nesting than can still close; feeding it sets the row's `error`). The
  schema must then be deterministic with one byte of lookahead,
  else `Compiler.compile` raises `NondeterministicGrammarError`. With `max_ref_depth=N`
  the recursion is instead expanded at most N times (a regular constraint, any schema).
  `to_ir()` exists only for regular ones; `pushdown_grammar()` returns the grammar.

  A `$ref` to another document (`"other.json#/$defs/x"` against the root's `$id`,
  the 2020-12 metaschema's `"meta/core"`, OpenAPI's absolute
  `"https://json-schema.org/draft/2020-12/schema"`) is resolved in `resources`, which
  maps absolute URIs to schemas; nothing is fetched:

  ```python
  spec = JsonSchema({"$id": "https://example.com/root.json",
                     "properties": {"p": {"$ref": "policy.json#/$defs/id"}}},
                    resources={"https://example.com/policy.json":
                               {"$defs": {"id": {"type": "integer"}}}})
  ```

  Attributes:
    schema: The schema as canonical JSON text (a dict, bool, JSON text or pydantic
      model class may be passed).
    whitespace: `compact` (no whitespace), `single` (one space after `:` and
      `,`, like `json.dumps`) or `flexible` (runs of at most `max_whitespace` JSON
      whitespace characters between any two tokens inside objects and arrays).
    strict_properties: Forbid additional properties in objects that declare
      `properties` or `required` unless `additionalProperties` is a schema (by
      default, as in JSON Schema, they are allowed after the declared ones).
    lenient: Ignore unsupported keywords instead of raising; see `ignored_keywords()`.
      True ignores every one; a collection of keyword names (`("uniqueItems",)`)
      ignores only those, and the others still raise.
    max_ref_depth: None (default): recursive `$ref`s compile to a push-down automaton,
      unbounded. N >= 1: each recursive `$ref` is expanded at most N times along a
      path and deeper alternatives are dropped (a regular language).
    free_form_depth: Nesting limit of free-form values (`{}`, `true`, absent `items`,
      additional property values): N containers deep (default 2, a regular
      language), or None for any JSON, nested up to the device stack
      (`CompileOptions.stack_depth`): the schema then compiles to a push-down
      automaton, and large any-order objects keep schema order (no registers).
      Where a free-form call would compete with an inline value (a union member,
      `contains`), those values are written inline a few levels, then called: the
      same language, compiled deterministically (`_json_free_form_align.py`).
    max_whitespace: Longest whitespace run under `flexible`.
    property_order: `any` (default): declared properties in any order, each at most
      once, additional ones anywhere among them. A small object is an automaton over
      the sets of keys written (about 2^(n-1) copies of each of the n members' values);
      a larger one is linear and checks its keys on the device, in a few register words
      per row (`automata/_registers.py`); one with a recursive member, or inside a
      recursive schema, keeps schema order (see `_json_schema.py`). Arrays whose
      `minItems`/`maxItems` would copy a large item many times count their items in a
      register word too (`_json_array_schemas.counted_array`). `any_bounded`: the
      automaton only, schema order past its budget (no registers: every object and
      array is a plain automaton, the step does no guard work). `schema`: in the order
      `properties` lists them, additional ones last: linear in the schema, shorter
      tables, deterministic order.
    implied_types: True (default): a schema without `type` takes the types its
      keywords apply to (`{"properties": ...}` generates objects only), which is what
      generation usually wants. False: as the specification says, it accepts every
      value of the other types too (`{"minLength": 2}` accepts `12`).
    shared_definitions: `inline` (default): a non-recursive `$ref` target is
      lowered again at each use (a regular language when nothing recurses). `call`: a
      target lowered alike in two places or more becomes a rule called on the device
      stack, like a recursive one (the schema then compiles to a push-down automaton;
      the language is the same). Targets that use register words stay inlined. Calls
      measured slower to compile and no smaller on real schemas, and they may make
      the grammar nondeterministic (`NondeterministicGrammarError`); see
      `constraints/_json_shared.py`. Needs `max_ref_depth=None`.
    resources: Other documents that `$ref`s may point to: a mapping from absolute URI
      (without fragment, e.g. `https://example.com/policy.json`) to a schema (dict,
      bool or JSON text). A `$ref` is resolved (RFC 3986) against the base URI where it
      sits; a document URI that is neither the root's nor an embedded `$id` is looked
      up here, and its fragment (JSON pointer or anchor) applied within that document,
      whose own `$id`s (a resource whose `$id` differs from its key is found under
      both), embedded resources and anchors count. Recursion may run through several
      documents. A `$ref` to a document not given raises `UnsupportedSchemaError`
      naming its URI. Kept as a tuple of (URI, canonical JSON text) pairs sorted by
      URI, part of equality and the hash (so of the compiler's memo key).
    model: The pydantic model class whose instances `parse` returns: the class passed
      as `schema`, or one given with a schema dict. None: `parse` returns plain JSON
      values. Not part of equality or the hash: it does not change the language, so
      specs with the same schema share compiled tables.
  """

  schema: typing.Any
  whitespace: str = "compact"
  _: dataclasses.KW_ONLY
  strict_properties: bool = False
  lenient: typing.Any = False  # bool, or keyword names (canonical: a sorted tuple).
  max_ref_depth: int | None = None
  free_form_depth: int | None = 2
  max_whitespace: int = 2
  property_order: str = "any"
  implied_types: bool = True
  resources: typing.Any = ()
  shared_definitions: str = "inline"
  model: typing.Any = dataclasses.field(default=None, compare=False, repr=False)

  def __post_init__(self):
    if self.model is None and _is_pydantic_model(self.schema):
      object.__setattr__(self, "model", self.schema)
    if self.model is not None and not _is_pydantic_model(self.model):
      raise _errors.SchemaError(
          f"JsonSchema model {self.model!r} is not a pydantic model class. Expected a"
          " pydantic.BaseModel subclass (with model_validate_json), or model=None.")
    object.__setattr__(self, "schema", _canonical_schema(self.schema))
    object.__setattr__(self, "resources", _canonical_resources(self.resources))
    object.__setattr__(self, "lenient", _canonical_lenient(self.lenient))
    if self.shared_definitions not in _json_shared.SHARED_DEFINITIONS:
      raise ValueError(f"JsonSchema shared_definitions is {self.shared_definitions!r}."
                       f" Expected one of {_json_shared.SHARED_DEFINITIONS}.")
    if self.shared_definitions != "inline" and self.max_ref_depth is not None:
      raise ValueError(
          f"JsonSchema shared_definitions={self.shared_definitions!r} (definitions"
          f" called on the device stack) needs max_ref_depth=None, not"
          f" {self.max_ref_depth}. Pass shared_definitions='inline' for a regular"
          f" language.")
    if self.property_order not in PROPERTY_ORDERS:
      raise ValueError(f"JsonSchema property_order is {self.property_order!r}. Expected"
                       f" one of {PROPERTY_ORDERS}.")
    _json_values.whitespace_policy(self.whitespace, self.max_whitespace)
    if self.max_ref_depth is not None:
      _check_spec_int("JsonSchema", "max_ref_depth", self.max_ref_depth, 1)
    if self.free_form_depth is not None:
      _check_spec_int("JsonSchema", "free_form_depth", self.free_form_depth, 0)
    elif self.max_ref_depth is not None:
      raise ValueError(
          f"JsonSchema free_form_depth=None (free-form values nested without bound, on"
          f" the device stack) needs max_ref_depth=None, not {self.max_ref_depth}: a"
          f" bounded max_ref_depth asks for a regular language. Pass free_form_depth=N"
          f" for a bounded one.")

  @property
  def schema_value(self):
    """The schema as Python values (a fresh copy)."""
    return json.loads(self.schema)

  def without_registers(self) -> "JsonSchema | None":
    """This spec with `property_order="any_bounded"` if it is `"any"`, else None: what
    the compiler falls back to when register objects cannot be compiled."""
    if self.property_order != "any":
      return None
    return dataclasses.replace(self, property_order="any_bounded")

  def options(self) -> "_json_schema.SchemaOptions":
    return _json_schema.SchemaOptions(
        whitespace=_json_values.whitespace_policy(self.whitespace, self.max_whitespace),
        strict_properties=self.strict_properties, lenient=self.lenient,
        max_ref_depth=self.max_ref_depth, free_form_depth=self.free_form_depth,
        property_order=self.property_order, implied_types=self.implied_types,
        shared_definitions=self.shared_definitions,
        **({"resources": self.resources} if self.resources else {}))

  def to_ir(self) -> ir.Node:
    """The regular IR of the schema's JSON texts.

    Raises:
      UnsupportedSchemaError: The schema is recursive and `max_ref_depth` is None
        (compile it with `cd.Compiler`, which builds a push-down automaton).
    """
    language = _lowered_schema(self)[0]
    if isinstance(language, _grammar.GrammarIR):
      raise _errors.UnsupportedSchemaError(
          f"JsonSchema has recursive $ref targets {list(language.names)}, so its language"
          " is not regular. Expected a schema without recursion, or a depth bound. Compile"
          " it with cd.Compiler (a push-down automaton), or pass max_ref_depth=N to"
          " expand the recursion N levels deep."
      )
    return language

  def pushdown_grammar(self):
    """The normalized `GrammarIR` when the schema needs the push-down runtime, else None.

    That is when it is recursive and `max_ref_depth` is None; `Compiler` then builds a
    token-level push-down automaton (`automata/_pda.py`) instead of calling `to_ir`.
    """
    language = _lowered_schema(self)[0]
    return language if isinstance(language, _grammar.GrammarIR) else None

  def ignored_keywords(self) -> tuple[str, ...]:
    """JSON pointers of the keywords ignored, in the order met, e.g.
    `('#/properties/id/x-kubernetes-int-or-string',)`: unknown keywords and `format`
    names (annotations, always) and, in lenient mode, the unsupported assertions
    dropped (or rounded)."""
    return _lowered_schema(self)[1]

  def parse(self, text: str):
    """The Python value of a generated text: `json.loads`, or an instance of `model`.

    Raises:
      ValueError: The text is not JSON, or (with a `model`) the model rejects it; a
        pydantic `ValidationError` is a `ValueError`. A text the schema accepts can
        still fail the model's own validators, which no JSON Schema expresses.
    """
    if self.model is not None:
      return self.model.model_validate_json(text)
    return json.loads(text)

  def describe(self) -> str:
    schema = self.schema if len(self.schema) <= 60 else self.schema[:57] + "..."
    flags = "".join(f", {name}={getattr(self, name)!r}"
                    for name in ("strict_properties", "lenient") if getattr(self, name))
    if self.max_ref_depth is not None:
      flags += f", max_ref_depth={self.max_ref_depth}"
    if self.resources:
      flags += f", resources=[{', '.join(uri for uri, _ in self.resources)}]"
    if self.shared_definitions != "inline":
      flags += f", shared_definitions={self.shared_definitions!r}"
    return f"JsonSchema({schema}, whitespace={self.whitespace!r}{flags})"


@functools.lru_cache(maxsize=64)
def _lowered_schema(spec: JsonSchema) -> tuple:
  return _json_schema.lower_json_schema(json.loads(spec.schema), spec.options())


@dataclasses.dataclass(frozen=True)
class Json:
  """The output must be JSON (any value), with bounded nesting (paper Sec. 5.1).

  ```python
  spec = Json(max_depth=3, whitespace="single", root="object")
  ```

  JSON is context-free; bounding how deeply containers nest makes it regular. See
  `constraints/_json_values.py` for the formatting of numbers, strings and whitespace.

  Attributes:
    max_depth: Most containers enclosing one another (0: scalars only;
      `{"a": [1]}` has depth 2).
    whitespace: `compact` (no whitespace), `single` (one space after `:` and
      `,`, like `json.dumps`) or `flexible` (runs of at most `max_whitespace` JSON
      whitespace characters between any two tokens inside objects and arrays).
    max_object_depth: Most objects enclosing one another (default: `max_depth`).
    max_array_depth: Most arrays enclosing one another (default: `max_depth`).
    max_whitespace: Longest whitespace run under `flexible`.
    root: The top-level value: `any`, `object` or `array`.
  """

  max_depth: int = 4
  whitespace: str = "compact"
  _: dataclasses.KW_ONLY
  max_object_depth: int | None = None
  max_array_depth: int | None = None
  max_whitespace: int = 2
  root: str = "any"

  def __post_init__(self):
    _check_spec_int("Json", "max_depth", self.max_depth, 0)
    for name in ("max_object_depth", "max_array_depth"):
      if getattr(self, name) is not None:
        _check_spec_int("Json", name, getattr(self, name), 0)
    _json_values.whitespace_policy(self.whitespace, self.max_whitespace)
    if self.root not in ("any", "object", "array"):
      raise ValueError(
          f"Json root {self.root!r} is not known. Expected 'any', 'object' or 'array'."
          " Use 'object' for a JSON object at the top."
      )

  def to_ir(self) -> ir.Node:
    ws = _json_values.whitespace_policy(self.whitespace, self.max_whitespace)
    if (self.root == "any" and self.max_object_depth is None
        and self.max_array_depth is None):
      return _json_values.json_value_fragment(ws, self.max_depth)  # Shared with schemas.
    return _json_values.json_value(
        ws, self.max_depth,
        max_object_depth=self.max_object_depth, max_array_depth=self.max_array_depth,
        root=self.root)

  def parse(self, text: str):
    """The Python value of a generated text (`json.loads`)."""
    return json.loads(text)

  def describe(self) -> str:
    return f"Json(max_depth={self.max_depth}, whitespace={self.whitespace!r}, root={self.root!r})"


@dataclasses.dataclass(frozen=True)
class Dataclass:
  """The output must be a constructor call of a dataclass, parsed back with `parse`.

  ```python
  @dataclasses.dataclass
  class Answer:
    choice: typing.Literal["A", "B", "C", "D"]
    confidence: float

  spec = Dataclass(Answer)
  spec.parse('Answer(choice="B", confidence=0.9)')  # Answer(choice='B', confidence=0.9)
  ```

  The syntax (`Name(field=value, ...)`, double-quoted strings, Enum members as
  `EnumName.MEMBER`, ...) and the supported field types are listed in
  `constraints/_dataclass.py`; `format_dataclass(instance)` writes it.

  Attributes:
    cls: The dataclass type.
    max_depth: Most expansions of one dataclass along a path (bounds recursion).
  """

  cls: typing.Any  # A dataclass type (checked in __post_init__, with a clear message).
  _: dataclasses.KW_ONLY
  max_depth: int = 3

  def __post_init__(self):
    if not (isinstance(self.cls, type) and dataclasses.is_dataclass(self.cls)):
      raise TypeError(
          f"Dataclass spec got {self.cls!r}. Expected a class decorated with"
          " @dataclasses.dataclass. Pass the class itself, not an instance."
      )
    _check_spec_int("Dataclass", "max_depth", self.max_depth, 1)

  def to_ir(self) -> ir.Node:
    return _dataclass.dataclass_ir(self.cls, max_depth=self.max_depth)

  def parse(self, text: str):
    """The instance a generated text denotes (`parse_dataclass`, no `eval`)."""
    return _dataclass.parse_dataclass(self.cls, text)

  def describe(self) -> str:
    return f"Dataclass({self.cls.__module__}.{self.cls.__qualname__})"
