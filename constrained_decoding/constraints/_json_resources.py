"""JSON Schema documents and resources: where a `$ref` points, as a pointer.

Functions on the lowering in progress (`_json_schema._Lowerer`, `lw`), used by
`_json_refs.py` (resolution, `$ref`s, dynamic scopes):
  _resolved_ref(lw, ref, pointer)   the pointer (`#/...` or `URI#/...`) a `$ref` names.
  _documents(lw)                    the root and the `resources=` documents, by URI.
  _split(lw, pointer)               (document URI, document, fragment) of a pointer.
  _base_uri(lw, pointer)            the base URI in effect at a pointer (RFC 3986).
  _resource_index(lw)               resources by URI, anchors by (resource, name), and
                                    whether some resource is embedded (cached on `lw`).
Pointers and URIs are described in `_json_refs.py`'s module doc.
"""

import json

from constrained_decoding.constraints._json_keywords import _join_uri, _own_id, _pointer

# Keywords whose values are JSON data, not subschemas (no `$id` or anchors inside).
_NOT_SCHEMAS = ("enum", "const", "default", "examples")


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
