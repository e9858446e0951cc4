"""JSON Schema objects lowered to IR: properties, `required`, additional and pattern
properties, `propertyNames`, `dependentRequired`, `minProperties`/`maxProperties`.

Function (`lw` is the lowering in progress, `_json_schema._Lowerer`):
  lower_object(lw, schema, pointer)   the JSON texts of the objects `schema` accepts, its
                                      declared members in any order (`_json_objects`)
                                      or in schema order (see `_json_schema.py`).
"""

import functools

from constrained_decoding import errors
from constrained_decoding.constraints import _intersect
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_counted_objects
from constrained_decoding.constraints import _json_keywords
from constrained_decoding.constraints import _json_negation
from constrained_decoding.constraints import _json_objects
from constrained_decoding.constraints import _json_scalar_schemas
from constrained_decoding.constraints import _json_values as jv
from constrained_decoding.constraints._json_keywords import (
    _constraining,
    _lazy_all_of,
    _merged_values,
    _pointer,
    _short,
)

# Most IR nodes an any-order object may hold (members times the subsets each is written
# from, `_json_objects`); past it the object keeps schema order.
MAX_ANY_ORDER_SIZE = 10_000
# Most copies of wide parts an any-order object may hold (`_json_objects.wide_parts`:
# string bodies and schema-free values, 1 each; `email`, `uri`, `hostname` formats and
# bounded strings about 1 to 8 from their class positions); past it the object checks
# its keys in registers. 6, not 12: with Gemma 3 the schema corpus's objects past 6
# compiled 1.2 to 3x faster as register objects (issue 15; config_package_json's
# `person` with `email` and `uri`: 0.45 -> 0.19 s). `dependentRequired` is exempt (the
# alternative is refusing it).
MAX_ANY_ORDER_WIDE = 6
# Most IR nodes of the member copies `minProperties`/`maxProperties` may write before
# the members are counted in a register instead (`_counts_in_register`).
MAX_COUNTED_MEMBERS_SIZE = 2_000
# Most properties one object may declare (`properties` and `required`).
MAX_PROPERTIES = 5_000
# Most `patternProperties` patterns, and most key regions (the keys matching exactly one
# set of patterns; only the non-empty ones are kept, so disjoint patterns make N).
MAX_PATTERN_PROPERTIES = 64
MAX_PATTERN_REGIONS = 64


def lower_object(lw, schema: dict, pointer: str) -> ir.Node:
  """The JSON objects `schema` accepts (see the module doc)."""
  if "$someUndeclared" in schema:
    return _some_undeclared(lw, schema, pointer)
  ws = lw.ws
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
    extra_schema = None if lw.options.strict_properties and declares else True
  else:
    extra_schema = None if additional is False else additional
  names = _json_scalar_schemas.name_language(lw, schema.get("propertyNames", True),
                              _pointer(pointer, "propertyNames"))
  if len(properties) + len(required) > MAX_PROPERTIES:
    raise errors.CompileBudgetError(
        f"The object at {pointer} declares {len(properties) + len(required)} properties;"
        f" expected at most {MAX_PROPERTIES} (each is a branch of the automaton). Split"
        " it, or describe the keys with patternProperties or propertyNames.")
  patterns, regions = _pattern_properties(lw, schema, pointer)
  depends = _dependent_required(lw, schema, pointer)
  sizes = _size_bounds(schema, pointer)
  members = []
  dependent_keys = [k for key, targets in depends.items() for k in (key, *targets)]
  dependent_keys += [*sizes["dependent_min"], *sizes["dependent_max"]]
  for key in dict.fromkeys([*properties, *required, *dependent_keys]):
    matches = [(s, where) for text, s, where in patterns
               if _json_scalar_schemas.has_text(text, key)]
    if key in properties:
      subschema, where = properties[key], _pointer(pointer, "properties", key)
    elif matches:
      subschema, where = True, matches[0][1]
    else:
      subschema, where = additional, _pointer(pointer, "additionalProperties")
    for pattern_schema, _ in matches:  # Every matching pattern's schema applies too.
      subschema = _lazy_all_of(subschema, pattern_schema)
    if names is not None and not _json_scalar_schemas.has_text(names, key):
      node = ir.NOTHING  # propertyNames forbids the key.
    else:
      node = lw.lower(subschema, where)
    members.append((key, node, key in required))
  declared = [k for k, _, _ in members]
  extra = extra_key = extra_rest = None
  if patterns:  # Keys matching some pattern; no others (module doc).
    extra = _pattern_members(lw, patterns, regions, declared, names, pointer)
  elif extra_schema is not None:
    colon, value = lw.extra_colon, lw.extra_value
    if extra_schema is not True:
      colon = ws.colon
      value = lw.lower(extra_schema, _pointer(pointer, "additionalProperties"))
    if names is None:
      keys = jv.string_except(declared)
    else:
      keys = _json_scalar_schemas.quoted(jv.encode_text(_json_scalar_schemas.intersect_texts(
          [names, jv.text_except(declared)], _pointer(pointer, "propertyNames"))))
    extra_key, extra_rest = keys, ir.concat(colon, value)
    extra = ir.concat(keys, colon, value)
  if extra == ir.NOTHING:
    extra = extra_key = None
  keyed = [(key, node, is_required) for key, node, is_required in members
           if is_required or node != ir.NOTHING]
  members = [(key, _member(lw, key, node), is_required) for key, node, is_required in keyed]
  counted = "minProperties" in schema or "maxProperties" in schema
  if (sizes["dependent_min"] or sizes["dependent_max"] or counted and depends
      or counted and extra is not None and sizes["min"] > len(keyed) + 1):
    # Bounds that need several distinct additional keys, or that depend on the keys
    # present: keys checked distinct and members counted on the device.
    node = None
    if not patterns and not _calls(lw, keyed, extra):
      node = _json_counted_objects.distinct_key_object(
          lw, keyed, extra_key, extra_rest, depends, sizes, pointer)
    if isinstance(node, ir.Node):
      return node
    if sizes["dependent_min"] or sizes["dependent_max"]:
      return lw.lower(_json_negation.expand_size_dependents(schema), pointer)
    why = node or "a member's value is recursive, or the object has patternProperties"
    if depends:
      where = _pointer(pointer, "dependentRequired")
      lw.unsupported(where, (
          f"dependentRequired at {where} next to minProperties/maxProperties is not"
          f" supported here: {why}. Expected one of them. Remove one, or pass"
          " lenient=True to ignore dependentRequired."))
      depends = {}
  else:
    why = None
  any_order = None
  if not counted and (lw.options.property_order != "schema" or depends):
    any_order = _any_order(lw, members, extra, depends, pointer)
    if (any_order is None and keyed and not depends and lw.use_registers
        and lw.options.property_order == "any" and not _calls(lw, keyed, extra)):
      lw.log.info("JSON Schema: the object at %s checks its %d keys on the device"
                  " (register markers).", pointer, len(keyed))
      # Equal objects share their words (and so their automaton after minimization:
      # a $ref used in many places stays one copy); they never nest in one another
      # without recursion, which does not reach here.
      key = (tuple(keyed), extra)
      first = lw.register_blocks.setdefault(key, lw.register_words)
      node, words = _json_objects.register_object(
          keyed, functools.partial(_member, lw), extra, ws, first)
      if first == lw.register_words:
        lw.register_words += words
      return node
  if any_order is None and counted and _counts_in_register(lw, keyed, extra, depends, schema,
                                                          pointer):
    low = _json_keywords.count(schema, "minProperties", pointer) or 0
    high = _json_keywords.count(schema, "maxProperties", pointer)
    lw.log.info("JSON Schema: the object at %s counts its members on the device (a"
                " register).", pointer)
    key = ("counted", tuple(keyed), extra, low, high)
    first = lw.register_blocks.setdefault(key, lw.register_words)
    node, words = _json_objects.register_object(
        keyed, functools.partial(_member, lw), extra, ws, first, counted=(low, high))
    if first == lw.register_words:
      lw.register_words += words
    return node
  if any_order is not None:
    body, can_be_empty = any_order
  elif counted:
    body, can_be_empty = _counted_members(
        lw, [(m, r) for _, m, r in members], extra, schema, pointer, why)
  else:
    body, can_be_empty = _json_objects.schema_order_members(
        [(m, r) for _, m, r in members], extra, ws, lw.memos["size"])
  parts = [ws.empty(b"{}")] if can_be_empty else []
  if body != ir.NOTHING:
    parts.append(ir.concat(ws.open(b"{"), body, ws.close(b"}")))
  return ir.union(*parts) if parts else ir.NOTHING


def _counts_in_register(lw, keyed: list, extra: ir.Node | None, depends: dict, schema: dict,
                        pointer: str) -> bool:
  """Whether `minProperties`/`maxProperties` are counted in a register word
  (`_json_objects.register_object`) rather than by copies of the members
  (`_counted_members`, one copy per count: `maxProperties` 200 of an additional member
  is 200 copies of its value). Only where the copies would be large, registers are on,
  no key is required (a full count must leave `}` open) and no additional key may count
  twice towards a minimum above 1."""
  if not (lw.use_registers and lw.options.property_order == "any") or depends:
    return False
  if _calls(lw, keyed, extra):
    return False
  if any(is_required for _, _, is_required in keyed):
    return False
  low = _json_keywords.count(schema, "minProperties", pointer) or 0
  high = _json_keywords.count(schema, "maxProperties", pointer)
  if extra is not None and low > 1 or (high is not None and high < low):
    return False
  copies = max(low, high or 0)
  size = sum(_json_objects.ir_size(node, lw.memos["size"]) for _, node, _ in keyed)
  size += 0 if extra is None else _json_objects.ir_size(extra, lw.memos["size"])
  return size * copies > MAX_COUNTED_MEMBERS_SIZE


# Object keywords after which `$someUndeclared` alone is lowered directly (the object
# says nothing else about its members).
_MEMBER_KEYWORDS = ("properties", "required", "patternProperties", "additionalProperties",
                    "propertyNames", "minProperties", "maxProperties", "dependentRequired",
                    "$unevaluatedProperties", "unevaluatedProperties", "$someUndeclared")


def _some_undeclared(lw, schema: dict, pointer: str) -> ir.Node:
  """The objects of `schema` that also have a key outside `declared` and `patterns` whose
  value satisfies `schema` of a `$someUndeclared` (`_json_negation`: the violations of
  `additionalProperties`; with `names`, of `propertyNames`: a key outside that
  language, any value), one such requirement at a time.

  The key is one the object names (`properties`, `required`, `dependentRequired`):
  `schema` with that key required and its value also in the violating schema, one
  alternative per such key (with an always-violating value and a required such key:
  `schema` itself). Or it is a key the object does not name, allowed by its
  `additionalProperties`/`patternProperties`: lowered here when the object has no other
  member keywords than `propertyNames`, as `{(any member ,)* witness (, declared member)*}` (members after
  the witness have declared keys, so none can repeat its key and override it: a parser
  keeps the last; the witness is the last undeclared member, a documented order);
  nothing when no such key can have a violating value (`_no_other_witness`); refused by
  name otherwise.
  """
  values = _merged_values(schema, "$someUndeclared")
  first, later = values[0], values[1:]
  rest = {k: v for k, v in schema.items() if k != "$someUndeclared"}
  if later:
    rest["$someUndeclared"] = later if len(later) > 1 else later[0]
  where = first.get("at", pointer)
  violating = first["schema"]
  keys, known = _witness_keys(lw, first, where)

  def undeclared(key: str) -> bool:
    return _json_scalar_schemas.has_text(keys, key)

  properties = rest.get("properties", {})
  required = rest.get("required", [])
  if not isinstance(properties, dict) or not isinstance(required, list):
    return lower_object(lw, rest, pointer)  # Malformed: reported there.
  depends = rest.get("dependentRequired", {})
  named = list(dict.fromkeys([*properties, *required, *(
      [k for key, targets in depends.items() for k in (key, *targets)]
      if isinstance(depends, dict) else [])]))
  witnesses = [k for k in named if undeclared(k)]
  if violating is True and any(k in required for k in witnesses):
    return lower_object(lw, rest, pointer)  # Every instance has a violating member.
  additional = rest.get("additionalProperties", rest.get("$unevaluatedProperties", True))
  own_patterns = rest.get("patternProperties", {})
  own_texts = ([_json_scalar_schemas.pattern_text(p, pointer) for p in own_patterns]
               if isinstance(own_patterns, dict) else [])
  parts = []
  for key in witnesses:
    if key in properties:
      base = properties[key]
    elif any(_json_scalar_schemas.has_text(t, key) for t in own_texts):
      base = True  # Its patterns' schemas apply as to any declared key.
    else:
      base = additional
    value = _lazy_all_of(base, violating)
    if value is False:
      continue
    parts.append(lower_object(lw, {**rest, "required": list(dict.fromkeys([*required, key])),
                                   "properties": {**properties, key: value}}, pointer))
  if (additional is not False or own_texts) and not _no_other_witness(
      lw, rest, keys, named, additional, own_texts, violating, where):
    if any(k in rest for k in _MEMBER_KEYWORDS if k != "propertyNames"):
      lw.unsupported(where, (
          f"not at {where} cannot be enforced exactly: it is violated by a key the other"
          " keywords do not declare, and the object it applies to"
          f" (at {pointer}) allows such keys and constrains its members. Expected"
          " additionalProperties: false, or no other member keywords, on that object."
          " Simplify the subschema, or pass lenient=True to ignore the keyword."))
    else:
      names = _json_scalar_schemas.name_language(
          lw, rest.get("propertyNames", True), _pointer(pointer, "propertyNames"))
      parts.append(_witnessed_object(lw, keys, known, violating, where, names))
  return ir.union(*parts)


def _witness_keys(lw, spec: dict, where: str) -> tuple[ir.Node, ir.Node]:
  """(the keys a `$someUndeclared` witness may have, the other keys) as decoded-text
  IR: keys outside `declared` and the `patterns` (`additionalProperties`), or, with
  `names`, keys outside the `propertyNames` language."""
  if "names" in spec:
    names = _json_scalar_schemas.name_language(lw, spec["names"], where)
    if names is None:
      return ir.NOTHING, jv.text_except([])
    return _intersect.complement_text(names), names
  texts = [_json_scalar_schemas.pattern_text(p, where) for p in spec["patterns"]]
  keys = jv.text_except(spec["declared"])
  if texts:
    keys = _json_scalar_schemas.intersect_texts(
        [keys, _intersect.complement_text(ir.union(*texts))], where)
  known = ir.union(*(ir.Bytes(k.encode()) for k in spec["declared"]), *texts)
  return keys, known


def _no_other_witness(lw, rest: dict, keys: ir.Node, named: list, additional, own_texts,
                      violating, where: str) -> bool:
  """Whether no key the object `rest` does not name can be a witness: none is allowed
  (`additionalProperties: false`), none is both a witness key and a `propertyNames` of
  `rest`, or no value satisfies both `additionalProperties` and the violation."""
  if own_texts:
    return False
  if additional is False:
    return True
  names = _json_scalar_schemas.name_language(
      lw, rest.get("propertyNames", True), _pointer(where, "propertyNames"))
  texts = [keys, jv.text_except(named)] + ([names] if names is not None else [])
  if _json_scalar_schemas.intersect_texts(texts, where) == ir.NOTHING:
    return True
  value = _lazy_all_of(additional, violating)
  try:
    return value is False or lw.lower(value, where) == ir.NOTHING
  except (errors.UnsupportedSchemaError, errors.CompileBudgetError):
    return False  # Not known to be empty: refused by the caller unless it can build it.


def _witnessed_object(lw, keys: ir.Node, known: ir.Node, violating, where: str,
                      names: ir.Node | None = None) -> ir.Node:
  """`{(any member ,)* witness (, known member)*}`: the witness's key in `keys`, its
  value in `violating`; `known` keys (not witness keys) after it; every key in `names`
  (the object's own `propertyNames`, None: any)."""
  ws = lw.ws
  value = lw.lower(violating, where)
  if names is not None:
    keys = _json_scalar_schemas.intersect_texts([keys, names], where)
    known = _json_scalar_schemas.intersect_texts([known, names], where)
  if value == ir.NOTHING or keys == ir.NOTHING:
    return ir.NOTHING
  witness = ir.concat(_json_scalar_schemas.quoted(jv.encode_text(keys)), ws.colon, value)
  any_key = (jv.string_except([]) if names is None
             else _json_scalar_schemas.quoted(jv.encode_text(names)))
  anything = ir.concat(any_key, lw.extra_colon, lw.extra_value)
  arcs = [(0, ir.concat(anything, ws.comma), 0), (0, witness, 1)]
  if known != ir.NOTHING:
    after = ir.concat(_json_scalar_schemas.quoted(jv.encode_text(known)), lw.extra_colon,
                      lw.extra_value)
    arcs.append((1, ir.concat(ws.comma, after), 1))
  body = ir.Graph(num_states=2, arcs=tuple(arcs), finals=(1,))
  return ir.concat(ws.open(b"{"), body, ws.close(b"}"))


def _dependent_required(lw, schema: dict, pointer: str) -> dict:
  """`dependentRequired` as key -> required keys (empty when absent)."""
  depends = schema.get("dependentRequired", {})
  where = _pointer(pointer, "dependentRequired")
  if not isinstance(depends, dict) or not all(
      isinstance(v, list) and all(isinstance(k, str) for k in v) for v in depends.values()):
    raise errors.SchemaError(
        f"dependentRequired at {where} is {_short(depends)}. Expected an object mapping"
        " property names to arrays of property names. Fix the value.")
  return {k: v for k, v in depends.items() if v}


def _size_bounds(schema: dict, pointer: str) -> dict:
  """`minProperties` ("min", 0 when absent), `maxProperties` ("max", None), and the
  bounds of `dependentSchemas` that only bound the size ("dependent_min",
  "dependent_max": key -> bound, `_json_negation._size_dependents`)."""
  out = {"min": _json_keywords.count(schema, "minProperties", pointer) or 0,
         "max": _json_keywords.count(schema, "maxProperties", pointer)}
  for name, keyword in (("dependent_min", "$dependentMinProperties"),
                        ("dependent_max", "$dependentMaxProperties")):
    out[name] = dict(schema.get(keyword, {}))
  return out


def _any_order(lw, members: list, extra: ir.Node | None, depends: dict,
               pointer: str) -> tuple[ir.Node, bool] | None:
  """Members in any order (`_json_objects`), or None to keep schema order.

  Schema order is kept for objects past `MAX_ANY_ORDER_SIZE`/`_WIDE` and for members that
  call a recursive rule (a subset automaton would be written out as an expression);
  `dependentRequired` needs the subsets, so there it raises instead. Calls of the
  free-form value rule (`free_form_depth=None`) do not count: that rule never comes back
  to the object, so its call sites are copied like any other member value.
  """
  sizes = [_json_objects.ir_size(member, lw.memos["size"]) for _, member, _ in members]
  result = None
  if not any(_rule_refs(lw, member) & _RECURSIVE_REF for _, member, _ in members):
    result = _json_objects.any_order_members(
        members, extra, lw.ws, depends, MAX_ANY_ORDER_SIZE, sizes,
        0 if extra is None else _json_objects.ir_size(extra, lw.memos["size"]),
        None if depends else MAX_ANY_ORDER_WIDE, lw.memos["wide"])
  if result is None and depends:
    where = _pointer(pointer, "dependentRequired")
    lw.unsupported(where, (
        f"dependentRequired at {where} needs an automaton over the sets of the"
        f" {len(members)} declared keys, which exceeds {MAX_ANY_ORDER_SIZE} IR nodes (or"
        " a member is recursive). Expected fewer or smaller properties. Split the"
        " object, or pass lenient=True to ignore dependentRequired."))
    if lw.options.property_order == "schema":
      return None
    return _any_order(lw, members, extra, {}, pointer)
  registers = (lw.options.property_order == "any" and lw.use_registers
               and not _calls(lw, members, extra))
  if result is None and lw.options.property_order != "schema" and not registers:
    lw.log.info("JSON Schema: the object at %s keeps schema order (%d members: any order"
              " would exceed %d IR nodes or %d wide parts, or a member is"
              " recursive).", pointer, len(members), MAX_ANY_ORDER_SIZE,
              MAX_ANY_ORDER_WIDE)
  return result


def _calls(lw, keyed: list, extra: ir.Node | None) -> bool:
  """Whether a member value (or the additional one) calls a grammar rule that may use
  register words (a recursive one): the words would be live across a push and a pop of
  the device stack, and the callee (the object itself, say) could clear them, so such
  an object keeps its automaton. Calls of the free-form value rule
  (`free_form_depth=None`) are fine: that rule uses no registers, so the object's words
  are the same after it returns (`automata/_rtn._check_calls` verifies it)."""
  nodes = [node for _, node, _ in keyed] + ([] if extra is None else [extra])
  return any(calls_register_rule(lw, node) for node in nodes)


def calls_register_rule(lw, node: ir.Node) -> bool:
  """Whether `node` holds an `ir.RuleRef` other than the free-form value rule's, outside
  fragment bodies (memoized by node identity across the lowering's calls, linear in all)."""
  return bool(_rule_refs(lw, node) & _REGISTER_CALL)


# Bits of `_rule_refs`.
_RECURSIVE_REF = 1  # A `RuleRef` other than the free-form value rule's, fragment
                    # bodies included.
_REGISTER_CALL = 2  # A `RuleRef` other than the free-form value rule's, outside fragments.


def _rule_refs(lw, node: ir.Node) -> int:
  """The `_RECURSIVE_REF` and `_REGISTER_CALL` bits of `node`: 0 without a walk while the
  lowering has made no `RuleRef` (`may_hold_rule_refs`: no recursion met, free-form
  values inlined), the common case; else `_rule_refs_walk`."""
  return _rule_refs_walk(lw, node) if lw.may_hold_rule_refs() else 0


def _rule_refs_walk(lw, node: ir.Node) -> int:
  """`_rule_refs` by one `ir.fold` (memo "refs", by node identity across the lowering)
  that answers both `_any_order`'s question and `calls_register_rule`'s, which then
  finds the members already walked."""
  is_free_form = lw.is_free_form

  def bits(n: ir.Node, children: tuple) -> int:
    if isinstance(n, ir.RuleRef):
      return 0 if is_free_form(n) else _RECURSIVE_REF | _REGISTER_CALL
    if isinstance(n, ir.Fragment):  # A leaf to the register analysis, not to the other.
      return children[0] & _RECURSIVE_REF
    out = 0
    for child in children:
      out |= child
    return out

  return ir.fold(node, bits, enter_fragments=True, memo=lw.memos["refs"])


def _member(lw, key: str, value: ir.Node, marker: ir.Node = ir.EPSILON) -> ir.Node:
  """`"key": value` (`marker` right after the key); a schema-free value as the shared
  fragment (`_splice.py`)."""
  if lw.is_free_form(value):
    return ir.concat(jv.canonical_string(key), marker, lw.extra_colon, lw.extra_value)
  return ir.concat(jv.canonical_string(key), marker, lw.ws.colon, value)


def _counted_members(lw, members: list, extra: ir.Node | None, schema: dict,
                     pointer: str, why: str | None = None) -> tuple[ir.Node, bool]:
  """`_members` with `minProperties`/`maxProperties`: an automaton over (member, how
  many written). Additional keys may repeat one another (keeping them distinct is not
  regular) and a parser keeps one of each, so towards `minProperties` only the first
  additional property counts; towards `maxProperties` all do. A larger minimum is
  counted on the device (`_json_counted_objects`); `why` says why it was not."""
  lo = _json_keywords.count(schema, "minProperties", pointer) or 0
  hi = _json_keywords.count(schema, "maxProperties", pointer)
  n = len(members)
  if extra is not None and lo > n + 1:
    where = _pointer(pointer, "minProperties")
    lw.unsupported(where, (
        f"minProperties {lo} at {where} needs {lo - n} additional properties with"
        f" distinct keys, which cannot be checked here: {why}. Expected at most"
        f" {n + 1} here: declare the properties, or pass lenient=True to ignore it."))
    lo = 0
  ws = lw.ws
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


def _pattern_properties(lw, schema: dict, pointer: str) -> tuple[list, list]:
  """([(decoded-text IR, schema, pointer)] of the `patternProperties` entries, their key
  regions over all keys (`_key_regions`)); ([], []) when there are none or they are
  ignored."""
  patterns = schema.get("patternProperties", {})
  where = _pointer(pointer, "patternProperties")
  if not isinstance(patterns, dict):
    raise errors.SchemaError(
        f"patternProperties at {where} is {_short(patterns)}. Expected an object mapping"
        " patterns to schemas. Fix the value.")
  if len(patterns) > MAX_PATTERN_PROPERTIES:
    lw.unsupported(where, (
        f"patternProperties at {where} has {len(patterns)} patterns. Expected at most"
        f" {MAX_PATTERN_PROPERTIES} (keys matching several patterns need every matching"
        " schema: one region per set of patterns a key matches). Merge some, or pass"
        " lenient=True to ignore the keyword."))
    return [], []
  entries = [(_json_scalar_schemas.pattern_text(p, _pointer(where, p)), subschema,
              _pointer(where, p)) for p, subschema in patterns.items()]
  regions = _key_regions([text for text, _, _ in entries], where)
  if regions is None:
    lw.unsupported(where, (
        f"patternProperties at {where}: keys match more than {MAX_PATTERN_REGIONS}"
        " distinct sets of its patterns (each set needs all of its schemas). Expected"
        " patterns that overlap less. Merge some, or pass lenient=True to ignore the"
        " keyword."))
    return [], []
  return entries, regions


def _key_regions(patterns: list, where: str) -> list | None:
  """[(keys, indices of the patterns they match)]: all keys split by which `patterns`
  they match, empty parts dropped; None past `MAX_PATTERN_REGIONS`. Disjoint patterns
  give one region each, not 2^N - 1."""
  regions = [(jv.text_except([]), ())]
  for j, pattern in enumerate(patterns):
    complement = _intersect.complement_text(pattern)
    split = []
    for text, chosen in regions:
      for part, sets in ((pattern, chosen + (j,)), (complement, chosen)):
        inside = _json_scalar_schemas.intersect_texts([text, part], where)
        if inside != ir.NOTHING:
          split.append((inside, sets))
          if len(split) > MAX_PATTERN_REGIONS:
            return None  # At once: the rest of the split would be wasted work.
    regions = split
  return regions


def _pattern_members(lw, patterns: list, regions: list, declared: list, names,
                     pointer: str):
  """The undeclared members whose keys match some pattern: for each set of patterns
  that some key matches exactly, those keys with a value that satisfies all of the set's
  schemas; None if no key can.

  `regions` (`_key_regions`) split all keys by the patterns they match; here each is
  narrowed to the undeclared keys within `propertyNames`.
  """
  ws = lw.ws
  where = _pointer(pointer, "patternProperties")
  base = [jv.text_except(declared)] + ([names] if names is not None else [])
  parts = []
  for text, chosen in regions:
    if not chosen:
      continue  # Keys matching no pattern: not generated (module doc).
    text = _json_scalar_schemas.intersect_texts([text, *base], where)
    if text == ir.NOTHING:
      continue
    schema = True
    for i in chosen:
      schema = _lazy_all_of(schema, patterns[i][1])
    value = lw.lower(schema, patterns[chosen[0]][2])
    if value != ir.NOTHING:
      parts.append(ir.concat(_json_scalar_schemas.quoted(jv.encode_text(text)), ws.colon, value))
  return ir.union(*parts) if parts else None
