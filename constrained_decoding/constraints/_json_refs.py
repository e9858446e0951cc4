"""JSON Schema reading and resolving: keywords checked, `$ref`s resolved, `allOf` merged.

Functions on the lowering in progress (`_json_schema._Lowerer`, `lw`):
  check(lw, schema, pointer)        annotations dropped, draft spellings and boolean
                                    structure rewritten, unsupported keywords refused.
  resolve(lw, ref, pointer)         the subschema a `$ref` points to.
  lower_conjunction(lw, branches, pointer, root=)
                                    `allOf` of subschemas: `$ref`s followed, `allOf`s
                                    flattened, merged (`_json_keywords.merge`), lowered;
                                    a conjunction met again inside itself becomes a
                                    grammar rule (recursive `$ref`, see `_json_schema.py`).

`$ref` resolution follows RFC 3986 against the `$id`s of the enclosing resources,
with anchors (`$anchor`, `$dynamicAnchor`, draft-07 `$id: "#name"`); see `_local_ref`.

Other documents (`JsonSchema(resources=...)`, read from `lw.options.resources` as
(URI, JSON text) pairs) are indexed with the root's resources. Pointers locate
subschemas in all of them: `#/...` in the root document, `URI#/...` in the document
given under URI. A resolved `$ref` (`$resolved`) holds such a pointer; seen from
another document, a pointer into the root is written with the root's absolute `$id`
(`R#/...`), so that no `#/...` stands for two places. A subschema taken out of its
document (merged into a conjunction lowered elsewhere, or negated) has its nested
`$ref`s resolved first (`_rebase`). Rule keys (`_rule_key`) name each conjunct's
document, so two documents' `#/definitions/x` never share a rule.
"""

import json
import urllib.parse

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_boolean
from constrained_decoding.constraints import _json_conditionals
from constrained_decoding.constraints import _json_keywords
from constrained_decoding.constraints._json_keywords import (
    _ANNOTATIONS,
    _BOOLEAN,
    _DEFINITIONS,
    _NEEDS,
    _SUPPORTED,
    _TYPE_OF_KEYWORD,
    _UNSUPPORTED,
    _conjunction_key,
    _constraining,
    _join_uri,
    _own_id,
    _normalize,
    _pointer,
    _short,
    _split_dependencies,
    _unevaluated,
)

# Keywords whose values are JSON data, not subschemas (no `$id` or anchors inside).
_NOT_SCHEMAS = ("enum", "const", "default", "examples")


def check(lw, schema: dict, pointer: str) -> dict:
  """Drops annotations; refuses (or, lenient, drops) unsupported assertion keywords.

  Unknown keywords are annotations (JSON Schema 2020-12, section 6.5): ignored and
  recorded, never an error. So are keywords without the one they depend on (`then`
  without `if`) and `if` alone, which assert nothing.
  """
  dropped = []
  if any(k in schema for k in ("$ref", "$recursiveRef", "$dynamicRef")):
    schema = _local_ref(lw, schema, pointer)
  if "dependencies" in schema:  # Draft-07: dependentRequired + dependentSchemas.
    schema = _split_dependencies(schema, pointer)
  if "allOf" in schema:  # Before `if` becomes `anyOf`: a chain of them multiplies.
    schema = _json_conditionals.split_conditionals(schema, _objects_only(lw, schema))
  if any(k in schema for k in _BOOLEAN) or (
      "contains" in schema and "unevaluatedItems" in schema):
    schema = _json_boolean.rewrite_boolean(lw, schema, pointer)
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
      lw.unsupported(where, (
          f"JSON Schema keyword {key!r} at {where} is not supported. Expected only the"
          " keywords listed in the JsonSchema documentation. Remove it, or pass"
          " lenient=True to ignore it (the output may then violate it)."))
    else:
      lw.annotation(where)
    dropped.append(key)
  if not dropped:
    return schema
  return {k: v for k, v in schema.items() if k not in dropped}


def _objects_only(lw, schema: dict) -> bool:
  """Whether `schema` generates objects only: `type: object`, or (implied types) no
  keyword beside `allOf` of another type (the conditionals in it imply objects)."""
  if "type" in schema:
    return schema["type"] in ("object", ["object"])
  implied = {_TYPE_OF_KEYWORD.get(k) for k in schema if k != "allOf"} - {None}
  return lw.options.implied_types and implied <= {"object"}


def _local_ref(lw, schema: dict, pointer: str) -> dict:
  """`schema` with its reference as a JSON pointer from the root in `$ref`.

  A `$ref` is a URI reference resolved against the base URI of where it sits (the
  `$id`s of the enclosing resources, RFC 3986): a resource of this document, a JSON
  pointer in it, or an anchor of it (`$anchor`, `$dynamicAnchor`, draft-07
  `$id: "#name"`). `$recursiveRef`/`$dynamicRef` resolve statically when the document
  embeds no other resource. With a draft-04/06/07 `$schema`, `$ref` overrides its
  siblings. A reference to another document is left as is (`resolve` refuses it).
  """
  out = dict(schema)
  resources, anchors, embedded = _resource_index(lw)
  for key in ("$recursiveRef", "$dynamicRef"):
    if key in out:
      where = _pointer(pointer, key)
      if embedded or "$ref" in out or not pointer.startswith("#"):
        lw.unsupported(where, (
            f"{key} at {where} resolves through the dynamic scope of embedded resources"
            " ($id), which is not supported. Expected a single-resource schema. Use"
            " $ref, or pass lenient=True to ignore it."))
        out.pop(key)
      else:
        out["$ref"] = out.pop(key)
  if "$ref" not in out or not isinstance(out["$ref"], str) or out.get("$resolved"):
    return out
  out["$ref"], out["$resolved"] = _resolved_ref(lw, out["$ref"], pointer), True
  if lw.legacy_ref:  # Resolved once: `_check` runs again.
    out = {k: v for k, v in out.items() if k in ("$ref", "$resolved", *_DEFINITIONS)}
  return out


def _resolved_ref(lw, ref: str, pointer: str) -> str:
  """The pointer (`#/...` or `URI#/...`, see the module doc) that the `$ref` value
  `ref` at `pointer` resolves to; an anchor not found stays `#name` (`URI#name`), a
  document not found its absolute URI (`resolve` refuses both)."""
  resources, anchors, _ = _resource_index(lw)
  local = ref == "#" or ref.startswith("#/")
  if len(resources) == 1 and local:
    return ref  # A fragment of the only resource, the root: as it is.
  document, _, fragment = _join_uri(_base_uri(lw, pointer), ref).partition("#")
  if document not in resources:
    return f"{document}#{fragment}" if fragment else document
  target = resources[document]
  if not fragment:
    out = target
  elif fragment.startswith("/"):
    out = target + fragment if target != "#" else "#" + fragment
  elif (document, fragment) in anchors:
    out = anchors[document, fragment]
  else:
    out = target.partition("#")[0] + "#" + fragment
  if out.startswith("#") and not pointer.startswith("#"):
    out = _root_uri(lw) + out  # Seen from another document (which found the root by it).
  return out


def _documents(lw) -> dict:
  """URI -> schema of the documents given in `resources` (parsed once)."""
  documents = getattr(lw, "_documents", None)
  if documents is None:
    documents = {uri: json.loads(text)
                 for uri, text in lw.options.resources}
    lw._documents = documents
  return documents


def _root_uri(lw) -> str:
  """The root document's base URI (its `$id`, without fragment; "" without one)."""
  return _join_uri("", _own_id(lw.root) or "").partition("#")[0]


def _split(lw, pointer: str) -> tuple[str, object, str]:
  """(document URI, "" for the root; its schema; the fragment after `#`) of a pointer
  `#...` or `URI#...`; the schema is None for a document not known."""
  document, _, fragment = pointer.partition("#")
  if document and document == _root_uri(lw):
    document = ""
  if not document:
    return "", lw.root, fragment
  return document, _documents(lw).get(document), fragment


def _canonical_pointer(lw, ref: str) -> str:
  """`ref` (a resolved pointer) with the root's URI written as `#`."""
  document, _, fragment = ref.partition("#")
  return "#" + fragment if document and document == _root_uri(lw) else ref


def _base_uri(lw, pointer: str) -> str:
  """The base URI at `pointer` (`#/...` in the root, `URI#/...` in a document of
  `resources`): the document's `$id` (or URI), joined with the `$id` of every
  enclosing subschema."""
  document, node, fragment = _split(lw, pointer)
  base = _join_uri(document, _own_id(node) or "")
  for token in fragment[1:].split("/") if fragment.startswith("/") else ():
    token = token.replace("~1", "/").replace("~0", "~")
    if isinstance(node, dict) and token in node:
      node = node[token]
    elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
      node = node[int(token)]
    else:
      break
    if _own_id(node) and not (lw.legacy_ref and "$ref" in node):
      base = _join_uri(base, _own_id(node))  # Draft 7: `$ref` hides its siblings.
  return base.partition("#")[0]


def _index_document(lw, document, top: str, base: str, resources: dict,
                    anchors: dict) -> bool:
  """Adds the embedded resources (`$id`) and anchors of one document, whose root sits at
  pointer `top` with base URI `base`; returns whether it embeds another resource."""
  embedded = False
  todo = [(document, top, base)]
  while todo:
    node, where, base = todo.pop()
    if isinstance(node, dict):
      ident = node.get("$id", node.get("id"))
      if isinstance(ident, str) and where != top:
        if ident.startswith("#"):
          anchors.setdefault((base, ident[1:]), where)  # Draft-07 anchor.
        elif _own_id(node) and not (lw.legacy_ref and "$ref" in node):
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
  return embedded


def _resource_index(lw) -> tuple[dict[str, str], dict[tuple[str, str], str], bool]:
  """(resource URI -> pointer, (resource URI, anchor) -> pointer, whether the
  document embeds resources other than the root)."""
  if lw._anchors is None:
    root_base = _join_uri("", _own_id(lw.root) or "").partition("#")[0]
    resources, anchors = {root_base: "#"}, {}
    embedded = _index_document(lw, lw.root, "#", root_base, resources, anchors)
    for uri, document in _documents(lw).items():
      base = _join_uri(uri, _own_id(document) or "").partition("#")[0]
      resources.setdefault(uri, uri + "#")  # Found under its key and its own `$id`.
      resources.setdefault(base, uri + "#")
      _index_document(lw, document, uri + "#", base, resources, anchors)
    lw._anchors = (resources, anchors, embedded)
  return lw._anchors


def _rebase(lw, schema, pointer: str):
  """`schema` (at `pointer`) with every `$ref` in it resolved (`$resolved`), so that it
  means the same wherever it is lowered. Definitions are left out: the resolved
  `$ref`s point into the documents themselves."""
  if isinstance(schema, list):
    return [_rebase(lw, v, _pointer(pointer, i)) for i, v in enumerate(schema)]
  if not isinstance(schema, dict):
    return schema
  out = {k: v if k in _NOT_SCHEMAS or k in _DEFINITIONS
         else _rebase(lw, v, _pointer(pointer, k)) for k, v in schema.items()}
  if any(k in out for k in ("$ref", "$recursiveRef", "$dynamicRef")):
    out = _local_ref(lw, out, pointer)
    if isinstance(out.get("$ref"), str) and out["$ref"].startswith("#") and _root_uri(lw):
      out["$ref"] = _root_uri(lw) + out["$ref"]  # Unambiguous wherever it goes.
  return out


def _check_unevaluated(lw, merged: dict, pointer: str) -> dict:
  """Refuses `unevaluated*` where a merged part came from a negation (`$fromNot`):
  its properties and items do not count as evaluated, but merging would count them."""
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


def resolve(lw, ref, pointer: str):
  """The subschema a `$ref` value met inside the schema at `pointer` points to.

  `#...` there means the root's pointer (as a resolved `$ref` holds it) when `pointer`
  is in the root document. A target in another document, or under another base URI,
  comes with its `$ref`s resolved (`_rebase`), as the caller lowers it at `pointer`.
  """
  if isinstance(ref, str) and not (
      (ref == "#" or ref.startswith("#/")) and pointer.startswith("#")):
    ref = _resolved_ref(lw, ref, pointer)
  node = _target(lw, ref, pointer)
  if _resource_index(lw)[2] or _documents(lw):
    where = _canonical_pointer(lw, ref)
    if where.partition("#")[0] or _base_uri(lw, where) != _base_uri(lw, pointer):
      node = _rebase(lw, node, where)
  return node


def _target(lw, ref, pointer: str):
  """The subschema at a resolved `$ref` (`#/...` or `URI#/...`) met at `pointer`."""
  where = _pointer(pointer, "$ref")
  if not isinstance(ref, str):
    raise errors.SchemaError(
        f"$ref {ref!r} at {where} is not a string. Expected a JSON pointer such as"
        " '#/$defs/Name'. Fix the reference."
    )
  document, node, fragment = _split(lw, ref)
  if node is None:
    raise errors.UnsupportedSchemaError(
        f"$ref {ref!r} at {where} is not a local JSON pointer: it points to the document"
        f" {document!r}, which is neither this schema nor one of its resources. Expected"
        f" that document in resources=: pass JsonSchema(..., resources={{{document!r}:"
        " <its schema>}) (nothing is fetched).")
  if fragment and not fragment.startswith("/"):
    raise errors.UnsupportedSchemaError(
        f"$ref {ref!r} at {where} is not a local JSON pointer and names no anchor"
        f" ($anchor, $dynamicAnchor) of {document or 'this schema'!r}. Expected '#',"
        " '#/...' or a defined anchor. Fix the reference, or define the anchor."
    )
  for token in fragment[1:].split("/") if fragment else ():
    token = urllib.parse.unquote(token).replace("~1", "/").replace("~0", "~")
    if isinstance(node, dict) and token in node:
      node = node[token]
    elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
      node = node[int(token)]
    else:
      raise errors.SchemaError(
          f"$ref {ref!r} at {where} does not resolve: no {token!r} there. Expected a"
          " pointer to a subschema of its document. Fix the pointer or add the"
          " definition under $defs."
      )
  return node


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
    target = _target(lw, schema["$ref"], where)
    ref = _canonical_pointer(lw, schema["$ref"]) if isinstance(schema["$ref"], str) else ""
    refs.append(ref)
    if lw.options.max_ref_depth is None:
      if ref in lw.chain:
        _ref_cycle(lw, ref, where)
    elif lw.expanding[ref] + refs.count(ref) > lw.options.max_ref_depth:
      lw.cut.append(ref)
      return False
    lw.chain.append(ref)
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
    return body
  lw.rules[name] = body
  return ir.RuleRef(name)
