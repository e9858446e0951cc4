"""`allOf` of JSON subschemas: `$ref`s followed, `allOf`s flattened, parts merged, lowered.

Functions on the lowering in progress (`_json_schema._Lowerer`, `lw`):
  lower_conjunction(lw, branches, pointer, root=)
      `allOf` of (schema, pointer) branches: `$ref`s followed (`_json_refs`), `allOf`s
      flattened, merged (`_json_keywords.merge`), lowered; a conjunction met again
      inside itself becomes a grammar rule (recursive `$ref`, see `_json_schema.py`),
      and one lowered the same in several places is recorded for
      `shared_definitions="call"` (`_json_shared`).

Rule keys (`_rule_key`) are the flattened conjuncts' content, with each conjunct's
document when there are several, so two documents' `#/definitions/x` never share a rule.
"""

import json

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_keywords
from constrained_decoding.constraints import _json_shared
from constrained_decoding.constraints._json_keywords import (
    _conjunction_key,
    _constraining,
    _normalize,
    _pointer,
    _short,
)
from constrained_decoding.constraints._json_refs import _rebase, _target, _unscoped, check
from constrained_decoding.constraints._json_resources import (
    _base_uri,
    _canonical_pointer,
    _documents,
    _resource_index,
)


def lower_conjunction(lw, branches: list, pointer: str, *, root: bool = False) -> ir.Node:
  """`allOf` of (schema, pointer) branches: `$ref`s resolved, `allOf`s flattened, merged.

  A branch's `$ref` target and `allOf` parts come before its own keywords (so the
  properties of a referenced base come first). With `max_ref_depth=N`, each `$ref`
  met here counts as one expansion while the merged schema is lowered; with None, a
  conjunction through a `$ref` (or the `root`) may become a rule (`_lower_rule`).
  """
  flat, refs = [], []
  for schema, where in branches:
    if not _flatten(lw, schema, where, flat, refs):
      return ir.NOTHING
  if not flat:
    merged, where = {}, pointer
  elif len(flat) == 1:
    merged, where = flat[0]
  else:
    where = pointer
    if _resource_index(lw)[2] or _documents(lw):  # Parts lowered away from their base.
      base = _base_uri(lw, pointer)
      flat = [(s, w) if _base_uri(lw, w) == base and w.startswith("#") == pointer.startswith("#")
               else (_rebase(lw, s, w), w) for s, w in flat]
    merged = flat[0][0]
    for schema, _ in flat[1:]:
      merged = _json_keywords.merge(merged, schema, where)
      if merged is False:
        return ir.NOTHING
  merged = _check_unevaluated(lw, merged, where)
  if lw.options.max_ref_depth is None:
    if refs:
      return _lower_rule(lw, flat, refs[0], merged, where)
    if root:  # Keyed lazily: most schemas never refer to the root.
      lw.root_flat = flat
      return _lower_rule(lw, None, "#", merged, where)
    return lw.lower_plain(merged, where)
  for ref in refs:
    lw.expanding[ref] += 1
  try:
    return lw.lower_plain(merged, where)
  finally:
    for ref in refs:
      lw.expanding[ref] -= 1


def _flatten(lw, schema, where: str, flat: list, refs: list) -> bool:
  """Appends the conjuncts of `schema` to `flat`; False if one is `false` or cut."""
  if schema is True:
    return True
  if schema is False:
    return False
  schema = _normalize(check(lw, _json_keywords.schema_dict(schema, where), where), where)
  if "$ref" in schema:
    ref, scope = _unscoped(lw, schema["$ref"])
    target = _target(lw, ref, where)
    ref = _canonical_pointer(lw, ref) if isinstance(ref, str) else ""
    if scope is not None:  # Its references resolved in the scope it is reached in.
      target = _rebase(lw, target, ref, scope)
    scoped = _canonical_pointer(lw, schema["$ref"]) if scope is not None else ref
    refs.append(ref)
    if lw.options.max_ref_depth is None:
      if scoped in lw.chain:
        _ref_cycle(lw, scoped, where)
    elif lw.expanding[ref] + refs.count(ref) > lw.options.max_ref_depth:
      lw.cut.append(ref)
      return False
    lw.chain.append(scoped)
    try:
      if not _flatten(lw, target, ref, flat, refs):
        return False
    finally:
      lw.chain.pop()
  if "allOf" in schema:
    parts = schema["allOf"]
    if not isinstance(parts, list) or not parts:
      raise errors.SchemaError(
          f"allOf at {_pointer(where, 'allOf')} is {_short(parts)}. Expected a"
          " non-empty array of schemas. Fix the value."
      )
    for i, part in enumerate(parts):
      if not _flatten(lw, part, _pointer(where, "allOf", i), flat, refs):
        return False
  own = {k: v for k, v in schema.items() if k not in ("$ref", "allOf")}
  if _constraining(own):
    flat.append((own, where))
  return True


def _ref_cycle(lw, ref: str, where: str) -> None:
  cycle = " -> ".join(lw.chain[lw.chain.index(ref):] + [ref])
  raise errors.SchemaError(
      f"$ref {ref!r} at {_pointer(where, '$ref')} refers back to itself ({cycle}) with"
      " no JSON value in between, so the schema accepts no finite value. Expected each"
      " recursive $ref inside an object property, an array item or an anyOf branch."
      " Remove the cycle."
  )


def _rule_key(lw, flat: list) -> str:
  """`_conjunction_key`, with each conjunct's document when there are several (the
  same text means different `$ref` targets in two documents)."""
  if not _documents(lw):
    return _conjunction_key(flat)
  return json.dumps([[s, w.partition("#")[0]] for s, w in flat], ensure_ascii=False,
                    separators=(",", ":"))


def _lower_rule(lw, flat: list | None, hint: str, merged: dict, where: str) -> ir.Node:
  """`lw.lower_plain(merged)`, or a `RuleRef` if this conjunction recurses into itself.

  The key is the content of the flattened conjuncts (`$ref` targets, `allOf` parts and
  siblings), so the rule is the merged schema, not the bare `$ref` target; `flat` is
  None for the root, whose key is computed only once another key is.
  """
  key = "#" if flat is None else _rule_key(lw, flat)
  if lw.root_key is None and lw.root_flat is not None and flat is not None:
    lw.root_key = _rule_key(lw, lw.root_flat)
  if key == lw.root_key:
    key = "#"  # The root, lowered before its key was known.
  name = lw.names.get(key)
  if name is not None and name in lw.rules:
    return ir.RuleRef(name)
  if key in lw.active:
    if name is None:
      taken = set(lw.names.values())
      name = next(n for n in (hint, *(f"{hint} ({i})" for i in range(2, len(taken) + 3)))
                  if n not in taken)
      lw.names[key] = name
    return ir.RuleRef(name)
  lw.active.add(key)
  try:
    body = lw.lower_plain(merged, where)
  finally:
    lw.active.discard(key)
  name = lw.names.get(key)
  if name is None:
    if flat is not None:
      _json_shared.record(lw, key, hint, body)
    return body
  lw.rules[name] = body
  return ir.RuleRef(name)


def _check_unevaluated(lw, merged: dict, pointer: str) -> dict:
  """Refuses `unevaluated*` where a merged part came from a negation (`$fromNot`):
  its properties and items do not count as evaluated, but merging would count them.
  Refuses `unevaluatedItems` next to a merged `contains` too: the items it matches
  count as evaluated, which `$unevaluatedItems` (read as `items`) would not see
  (`_json_unevaluated_items` handles the static cases before merging)."""
  if "$unevaluatedItems" in merged and "contains" in merged:
    where = _pointer(pointer, "unevaluatedItems")
    lw.unsupported(where, (
        f"unevaluatedItems at {where} next to a contains merged from allOf or $ref parts"
        " that also evaluate dynamically is not supported. Expected what each part"
        " evaluates to be static. Pass lenient=True to ignore unevaluatedItems."))
    merged = {k: v for k, v in merged.items() if k != "$unevaluatedItems"}
  if "$fromNot" not in merged:
    return merged
  for key in ("$unevaluatedProperties", "$unevaluatedItems"):
    if key in merged:
      where = _pointer(pointer, key[1:])
      lw.unsupported(where, (
          f"{key[1:]} at {where} applies to a schema with not, or if/else, in an allOf"
          " or $ref: their annotations do not count as evaluated, which is not"
          f" supported. Expected them apart. Pass lenient=True to ignore {key[1:]}."))
      merged = {k: v for k, v in merged.items() if k != key}
  return merged
