"""JSON Schema strings and numbers: their keywords lowered to IR, and values checked.

Functions (`lw` is the lowering in progress, `_json_schema._Lowerer`):
  lower_string(lw, schema, pointer)      a string schema (lengths, `pattern`, `format`
                                         and their negations, intersected exactly).
  text_languages(lw, schema, pointer)    decoded-text IR of its `pattern`s and `format`s.
  name_language(lw, names, pointer)      the keys `propertyNames` allows, or None.
  intersect_texts(texts, pointer)        the intersection of decoded-text languages.
  with_lengths(texts, min, max)          length bounds added (folded into a run if it can).
  length_bounded(text, min, max)         `text` of those lengths without a product, or None.
  pattern_text(pattern, where)           a JSON Schema `pattern` as decoded-text IR.
  lower_number(name, schema, pointer)    an `integer` or `number` schema (exact bounds,
                                         `multipleOf`, excluded values and steps).
  number_bounds(schema, pointer), multiple_of_step(schema, pointer)
                                         the bounds and `multipleOf` as exact decimals.
  valid_string(lw, value, schema, pointer), valid_number(value, schema, pointer)
                                         whether an `enum`/`const` value passes them.
  has_text(language, text), encodable(text), quoted(body)
                                         helpers over decoded-text IR.
"""

import fractions
import functools
import math

from constrained_decoding import errors
from constrained_decoding.constraints import _difference
from constrained_decoding.constraints import _intersect
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_keywords
from constrained_decoding.constraints import _json_refs
from constrained_decoding.constraints import _json_numbers as jn
from constrained_decoding.constraints import _json_values as jv
from constrained_decoding.constraints._json_keywords import (
    _NAME_KEYWORDS,
    _NO_CONSTRAINT,
    _NUMBER,
    _TYPE_OF_KEYWORD,
    _exact,
    _merged_values,
    _pointer,
    _short,
)
from constrained_decoding.constraints._json_formats import FORMATS, format_ir, pattern_ir


def valid_string(lw, value: str, schema: dict, pointer: str) -> bool:
  """Whether the string `value` satisfies `schema`'s string keywords (lengths in code
  points; `pattern`s and `format`s as their text automata)."""
  min_length = _json_keywords.count(schema, "minLength", pointer) or 0
  max_length = _json_keywords.count(schema, "maxLength", pointer)
  if len(value) < min_length or (max_length is not None and len(value) > max_length):
    return False
  return all(has_text(text, value) for text in text_languages(lw, schema, pointer))


def valid_number(value, schema: dict, pointer: str) -> bool:
  """Whether the number `value` satisfies `schema`'s bounds and `multipleOf`, exactly
  (a float is read as the decimal it is written as, as for bounds)."""
  if isinstance(value, float) and not math.isfinite(value):
    return True  # Not JSON: `jv.const_value` reports it.
  x = _exact(value)
  (lo, lo_exclusive, _), (hi, hi_exclusive, _) = number_bounds(schema, pointer)
  if lo is not None and (x < lo or lo_exclusive and x == lo):
    return False
  if hi is not None and (x > hi or hi_exclusive and x == hi):
    return False
  if any((x / _exact(s)).denominator == 1 for s in _merged_values(schema, "$notMultipleOf")):
    return False
  step = multiple_of_step(schema, pointer)
  return step is None or (x / step).denominator == 1


def lower_string(lw, schema: dict, pointer: str) -> ir.Node:
  """The JSON strings `schema` accepts (lengths, patterns, formats, excluded values)."""
  min_length = _json_keywords.count(schema, "minLength", pointer) or 0
  max_length = _json_keywords.count(schema, "maxLength", pointer)
  if max_length is not None and max_length < min_length:
    return ir.NOTHING
  texts = text_languages(lw, schema, pointer)
  excluded = [v for v in schema.get("$notIn", []) if isinstance(v, str)]
  if excluded:
    texts.append(jv.text_except(excluded))
  if not texts:
    return jv.json_string(min_length, max_length)
  texts = with_lengths(texts, min_length, max_length)
  return quoted(jv.encode_text(intersect_texts(texts, pointer)))


def with_lengths(texts: list[ir.Node], min_length: int, max_length: int | None
                 ) -> list[ir.Node]:
  """`texts` with the length bounds added: folded into the one language's unbounded run
  when it has that shape (`length_bounded`), else as one more language to intersect."""
  if min_length == 0 and max_length is None:
    return texts
  if len(texts) == 1:
    bounded = length_bounded(texts[0], min_length, max_length)
    if bounded is not None:
      return [bounded]
    if max_length is not None:
      # A small ASCII pattern (a DNS label): the product numbered layer by layer, which
      # the compiler lays out as a counted chain with slots.
      from constrained_decoding.automata import _slotted_chains  # pylint: disable=g-import-not-at-top

      product = _slotted_chains.length_product(texts[0], min_length, max_length)
      if product is not None:
        return [product]
  return texts + [_intersect.text_of_length(min_length, max_length)]


def length_bounded(text: ir.Node, low: int, high: int | None) -> ir.Node | None:
  """The texts of `text` with `low..high` code points, written without a product
  automaton when each alternative of `text` is fixed-length parts around one unbounded
  run of a class (`^[a-z][a-z0-9_]*$` with maxLength 32 is `[a-z][a-z0-9_]{0,31}`: a
  bounded run the compiler counts, where the intersection with a length automaton is a
  32-fold product). None when `text` has another shape."""
  alternatives = text.alternatives if isinstance(text, ir.Union) else (text,)
  out = []
  for alternative in alternatives:
    parts = alternative.parts if isinstance(alternative, ir.Concat) else (alternative,)
    runs = [k for k, p in enumerate(parts) if isinstance(p, ir.Repeat) and p.max is None]
    if len(runs) != 1 or not isinstance(parts[runs[0]].node, ir.CharClass):
      return None
    k, run = runs[0], parts[runs[0]]
    fixed = [_fixed_length(p) for j, p in enumerate(parts) if j != k]
    if None in fixed:
      return None
    low_run = max(run.min, low - sum(fixed))
    high_run = None if high is None else high - sum(fixed)
    if high_run is None or high_run >= low_run:
      out.append(ir.concat(*parts[:k], ir.repeat(run.node, low_run, high_run), *parts[k + 1:]))
  return ir.union(*out)


def _fixed_length(node: ir.Node) -> int | None:
  """The number of code points of every text of `node`, or None if they differ."""
  match node:
    case ir.CharClass():
      return 1
    case ir.Bytes(data):
      try:
        return len(data.decode("utf-8"))
      except UnicodeDecodeError:
        return None
    case ir.Concat(parts):
      lengths = [_fixed_length(p) for p in parts]
      return None if None in lengths else sum(lengths)
    case ir.Repeat(body, low, high) if low == high:
      length = _fixed_length(body)
      return None if length is None else length * low
    case ir.Union(alternatives) if alternatives:
      lengths = {_fixed_length(a) for a in alternatives}
      return lengths.pop() if len(lengths) == 1 else None
  return None


def text_languages(lw, schema: dict, pointer: str) -> list[ir.Node]:
  """The decoded-text languages of a string schema's `pattern` and `format` (a tuple
  of several after `allOf` merging: all apply)."""
  texts = []
  for pattern in _merged_values(schema, "pattern"):
    texts.append(pattern_text(pattern, _pointer(pointer, "pattern")))
  for name in _merged_values(schema, "format"):
    where = _pointer(pointer, "format")
    if isinstance(name, str) and name in FORMATS:
      texts.append(format_ir(name))
    elif isinstance(name, str):  # An unknown format is an annotation (2020-12, 7.2.3).
      lw.annotation(where)
    else:
      raise errors.SchemaError(
          f"format {_short(name)} at {where} is not a string. Expected a format name"
          " such as 'date-time'. Fix the value.")
  negated = [pattern_text(p, pointer) for p in _merged_values(schema, "$notPattern")]
  negated += [format_ir(f) for f in _merged_values(schema, "$notFormat")]
  for language in negated:  # From `not`: the texts outside the language.
    try:
      texts.append(_intersect.complement_text(language))
    except ValueError as e:
      raise errors.UnsupportedSchemaError(
          f"The string at {pointer} excludes a pattern or format (from not, oneOf or if)"
          f" whose complement is too large: {e}. Expected a simpler pattern.") from e
  return texts


def intersect_texts(texts: list[ir.Node], pointer: str) -> ir.Node:
  """The intersection of decoded-text languages (one at least); refused past the
  product automaton's budget."""
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


def name_language(lw, names, pointer: str) -> ir.Node | None:
  """The decoded texts `propertyNames` allows as keys (IR over characters), None for any.

  `names` is a schema applied to strings: the string keywords (type, pattern, format,
  minLength, maxLength), enum/const (their strings), `$ref`, and the boolean
  applicators over languages: `allOf` (intersection), `anyOf` (union), `oneOf` (each
  branch minus the others), `not` (complement), `if`/`then`/`else`. Keywords for other
  types assert nothing about a string and are ignored; unknown keywords are recorded as
  annotations. A `$ref` that reaches itself again is refused.
  """
  return _names(lw, names, pointer, ())


# Keywords that constrain only non-string instances (or only name a draft spelling of
# one): under `propertyNames`, whose instances are strings, they assert nothing.
_NOT_FOR_STRINGS = frozenset(
    {k for k, t in _TYPE_OF_KEYWORD.items() if t != "string"} | {
        "dependentRequired", "dependentSchemas", "dependencies", "additionalItems",
        "unevaluatedProperties", "unevaluatedItems"})
_NAME_APPLICATORS = frozenset({"$ref", "$recursiveRef", "$dynamicRef", "allOf", "anyOf",
                               "oneOf", "not", "if", "then", "else"})


def _names(lw, names, pointer: str, chain: tuple) -> ir.Node | None:
  """`name_language` of one subschema; `chain` holds the `$ref`s being followed."""
  if names is True:
    return None
  if names is False:
    return ir.NOTHING
  names = _json_keywords.schema_dict(names, pointer)
  if any(k in names for k in ("$ref", "$recursiveRef", "$dynamicRef")):
    names = _json_refs._local_ref(lw, names, pointer)  # Against `$id`s; draft-7 rules.
  for key in names:
    if (key not in _NAME_KEYWORDS and key not in _NO_CONSTRAINT
        and key not in _NAME_APPLICATORS and key not in _NOT_FOR_STRINGS
        and key not in ("$notIn", "$notPattern", "$notFormat", "$fromNot")):
      lw.annotation(_pointer(pointer, key))  # Unknown: an annotation (2020-12, 6.5).
  if "type" in names and "string" not in _json_keywords.type_names(names["type"], pointer):
    return ir.NOTHING  # Property names are strings.
  languages = [_own_name_language(lw, names, pointer)]
  if "$ref" in names:
    ref = names["$ref"]
    target = _json_refs.resolve(lw, ref, pointer)
    if ref in chain:
      cycle = " -> ".join([*chain[chain.index(ref):], ref])
      raise errors.UnsupportedSchemaError(
          f"$ref {ref!r} at {_pointer(pointer, '$ref')} under propertyNames refers back"
          f" to itself ({cycle}), which is not supported for property names. Expected"
          " a $ref chain without cycles. Inline the referenced string schema.")
    languages.append(_names(lw, target, ref, (*chain, ref)))
  for key in ("allOf", "anyOf", "oneOf"):
    if key in names:
      branches = _name_branches(lw, names, key, pointer, chain)
      if key == "allOf":
        languages += branches
      elif key == "anyOf":
        languages.append(_union(branches))
      else:  # Exactly one: each branch outside the union of the others.
        only = [_meet([b, _complement(_union(branches[:i] + branches[i + 1:]), pointer)],
                      pointer) for i, b in enumerate(branches)]
        languages.append(_union(only))
  if "not" in names:
    where = _pointer(pointer, "not")
    languages.append(_complement(_names(lw, names["not"], where, chain), pointer))
  if "if" in names and ("then" in names or "else" in names):
    test = _names(lw, names["if"], _pointer(pointer, "if"), chain)
    then = _names(lw, names.get("then", True), _pointer(pointer, "then"), chain)
    other = _names(lw, names.get("else", True), _pointer(pointer, "else"), chain)
    languages.append(_union([_meet([test, then], pointer),
                             _meet([_complement(test, pointer), other], pointer)]))
  return _meet(languages, pointer)


def _own_name_language(lw, names: dict, pointer: str) -> ir.Node | None:
  """The language of `names`' string keywords alone (None: they allow any text)."""
  texts = text_languages(lw, names, pointer)
  excluded = [v for v in names.get("$notIn", []) if isinstance(v, str)]
  if excluded:
    texts.append(jv.text_except(excluded))
  min_length = _json_keywords.count(names, "minLength", pointer) or 0
  max_length = _json_keywords.count(names, "maxLength", pointer)
  if max_length is not None and max_length < min_length:
    return ir.NOTHING
  texts = with_lengths(texts, min_length, max_length)
  if "enum" in names or "const" in names:
    texts.append(ir.union(*(ir.Bytes(v.encode()) for v in _json_keywords.enum_values(names, pointer)
                            if isinstance(v, str) and encodable(v))))
  return _meet(texts, pointer)


def _name_branches(lw, names: dict, key: str, pointer: str, chain: tuple) -> list:
  """The languages of the subschemas of `allOf`/`anyOf`/`oneOf` under `names`."""
  parts = names[key]
  where = _pointer(pointer, key)
  if not isinstance(parts, list) or not parts:
    raise errors.SchemaError(
        f"{key} at {where} is {_short(parts)}. Expected a non-empty array of schemas."
        " Fix the value.")
  return [_names(lw, part, _pointer(where, i), chain) for i, part in enumerate(parts)]


def _meet(languages: list, pointer: str) -> ir.Node | None:
  """The intersection of languages (None: any text), refused past the budget."""
  texts = [t for t in languages if t is not None]
  if not texts:
    return None
  if any(t == ir.NOTHING for t in texts):
    return ir.NOTHING
  return intersect_texts(texts, pointer)


def _union(languages: list) -> ir.Node | None:
  """The union of languages (None: any text)."""
  if any(t is None for t in languages):
    return None
  return ir.union(*languages)


def _complement(language: ir.Node | None, pointer: str) -> ir.Node | None:
  """The texts outside `language` (None: any text), refused past the budget."""
  if language is None:
    return ir.NOTHING
  if language == ir.NOTHING:
    return None
  try:
    return _intersect.complement_text(language)
  except ValueError as e:
    raise errors.UnsupportedSchemaError(
        f"The property names at {pointer} exclude a language (from not, oneOf or if)"
        f" whose complement is too large: {e}. Expected simpler patterns. Simplify the"
        " propertyNames schema.") from e


def pattern_text(pattern, where: str) -> ir.Node:
  """The decoded texts a JSON Schema `pattern` accepts (search semantics)."""
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
        f"pattern {pattern!r} at {where} cannot be compiled: {e} (In a JSON Schema"
        " pattern, which is searched for, ^ and $ belong at the start and end of the"
        " pattern or of a top-level alternative.)"
    ) from e


def _bound(schema: dict, key: str, pointer: str):
  value = schema[key]
  if isinstance(value, bool) or not isinstance(value, _NUMBER) or (
      isinstance(value, float) and not math.isfinite(value)):
    raise errors.SchemaError(
        f"{key} {value!r} at {_pointer(pointer, key)} is not a number. Expected a finite"
        " JSON number. Fix the value."
    )
  return _exact(value)


def number_bounds(schema: dict, pointer: str) -> list:
  """[(value, exclusive, keyword)] for the lower and upper bound; value None: unbounded.

  Values are exact `Fraction`s; of `minimum` and `exclusiveMinimum` the tighter wins.
  """
  sides = []
  for inclusive, exclusive, tighter in (("minimum", "exclusiveMinimum", max),
                                        ("maximum", "exclusiveMaximum", min)):
    value = _bound(schema, inclusive, pointer) if inclusive in schema else None
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
      bound = _bound(schema, exclusive, pointer)
      if value is None or tighter(bound, value) == bound:
        side = (bound, True, exclusive)
    sides.append(side)
  return sides


def lower_number(name: str, schema: dict, pointer: str) -> ir.Node:
  """The JSON numbers (`name`: integer or number) `schema` accepts: bounds and
  `multipleOf`, minus the values and multiples a negation excludes."""
  node = _number_range(name, schema, pointer)
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
    others.append(jn.multiple_of(_exact(step)))
  try:
    return _difference.ascii_difference(
        _intersect.intersect_text(node, _difference.CANONICAL_NUMBER), ir.union(*others))
  except ValueError as e:
    raise errors.UnsupportedSchemaError(
        f"The number at {pointer} excludes values or multiples (from not/oneOf/if) in an"
        f" automaton that is too large: {e}. Expected smaller steps or fewer values."
        " Simplify the schema.") from e


def _number_range(name: str, schema: dict, pointer: str) -> ir.Node:
  """Numbers within the bounds and `multipleOf` (`integer`: canonical integers)."""
  (lo, lo_exclusive, _), (hi, hi_exclusive, _) = number_bounds(schema, pointer)
  step = multiple_of_step(schema, pointer)
  try:
    return _range_language(name == "integer", lo, lo_exclusive, hi, hi_exclusive, step)
  except _StepTooLarge as e:
    raise errors.UnsupportedSchemaError(
        f"multipleOf {schema['multipleOf']!r} at {_pointer(pointer, 'multipleOf')} with"
        f" these bounds is too large an automaton: {e}. Expected a step with a small"
        " numerator (in lowest terms, times 10^decimal places), or tighter bounds.") from e


class _StepTooLarge(ValueError):
  """`_range_language`'s intersection with the multiples of a step is over budget."""


@functools.lru_cache(maxsize=256)
def _range_language(integer: bool, lo, lo_exclusive: bool, hi, hi_exclusive: bool,
                    step) -> ir.Node:
  """The language of `_number_range` from its exact bounds (`Fraction`s or None) and
  step: a pure function, cached because intersecting a range with the multiples of a
  step can take tens of milliseconds (`integer`, 100..60000, `multipleOf` 100: 28 ms),
  and the same bounds come back (schemas compiled again, repeated `$defs`)."""
  if integer:
    low = None if lo is None else (math.floor(lo) + 1 if lo_exclusive else math.ceil(lo))
    high = None if hi is None else (math.ceil(hi) - 1 if hi_exclusive else math.floor(hi))
    node = jn.integer_range(low, high)
    # An integer is a multiple of p/q (lowest terms) exactly when p divides it.
    step = None if step is None or step.numerator == 1 else fractions.Fraction(
        step.numerator)
  elif lo is None and hi is None and step is None:
    return jn.JSON_NUMBER
  elif lo is not None and hi is not None and (
      lo > hi or lo == hi and (lo_exclusive or hi_exclusive)):
    return ir.NOTHING
  else:
    node = jn.number_range(lo, hi, lo_exclusive=lo_exclusive, hi_exclusive=hi_exclusive)
  if step is None:
    return node
  try:
    return _intersect.intersect_text(node, jn.multiple_of(step))
  except ValueError as e:
    raise _StepTooLarge(str(e)) from e


def multiple_of_step(schema: dict, pointer: str) -> fractions.Fraction | None:
  """`multipleOf` as an exact decimal, or None."""
  if "multipleOf" not in schema:
    return None
  step = _bound(schema, "multipleOf", pointer)
  if step <= 0:
    raise errors.SchemaError(
        f"multipleOf {schema['multipleOf']!r} at {_pointer(pointer, 'multipleOf')} is not"
        " positive. Expected a number > 0. Fix the value.")
  return step


def has_text(language: ir.Node, text: str) -> bool:
  """Whether the decoded-text IR `language` holds `text`."""
  if not encodable(text):
    return False
  return _intersect.intersect_text(ir.Bytes(text.encode()), language) != ir.NOTHING


def encodable(text: str) -> bool:
  """Whether `text` is valid Unicode text (no lone surrogates, which JSON can escape)."""
  try:
    text.encode()
  except UnicodeEncodeError:
    return False
  return True


def quoted(body: ir.Node) -> ir.Node:
  """`"body"`: a JSON string around encoded text."""
  return ir.concat(ir.Bytes(b'"'), body, ir.Bytes(b'"'))
