"""JSON Schema reading and resolving: keywords checked, `$ref`s resolved.

Functions on the lowering in progress (`_json_schema._Lowerer`, `lw`):
  check(lw, schema, pointer)        annotations dropped, draft spellings and boolean
                                    structure rewritten, unsupported keywords refused.
  resolve(lw, ref, pointer)         the subschema a `$ref` points to.
(`allOf` conjunctions, which follow `$ref`s with these, are `_json_conjunctions.py`.)

`$ref` resolution follows RFC 3986 against the `$id`s of the enclosing resources,
with anchors (`$anchor`, `$dynamicAnchor`, draft-07 `$id: "#name"`); see `_local_ref`.
`$dynamicRef` (2020-12) and `$recursiveRef` (2019-09) become `$ref`s: to their static
target where it does not depend on the path that reaches them (`_dynamic_verdict`);
else the schema is lowered specialized by the part of the dynamic scope that decides
them (see "Dynamic scopes" below: one rule per (target, scope) where recursive),
refused only where the specification and `jsonschema` resolve them differently, or
past `MAX_DYNAMIC_SCOPES` scopes (`CompileBudgetError`). `#/` is the root's member
named "" (RFC 6901, as `referencing` reads it).

Other documents (`JsonSchema(resources=...)`, read from `lw.options.resources` as
(URI, JSON text) pairs) are indexed with the root's resources (`_json_resources.py`:
documents, resources, anchors and base URIs). Pointers locate
subschemas in all of them: `#/...` in the root document, `URI#/...` in the document
given under URI. A resolved `$ref` (`$resolved`) holds such a pointer; seen from
another document, a pointer into the root is written with the root's absolute `$id`
(`R#/...`), so that no `#/...` stands for two places. A subschema taken out of its
document (merged into a conjunction lowered elsewhere, or negated) has its nested
`$ref`s resolved first (`_rebase`).
"""

import dataclasses
import re
import urllib.parse

from constrained_decoding import errors
from constrained_decoding.constraints import _json_boolean
from constrained_decoding.constraints import _json_conditionals
from constrained_decoding.constraints import _json_unevaluated_items
from constrained_decoding.constraints._json_resources import (
    _NOT_SCHEMAS,
    _base_uri,
    _canonical_pointer,
    _documents,
    _resolved_ref,
    _resource_index,
    _root_uri,
    _split,
)
from constrained_decoding.constraints._json_keywords import (
    _ANNOTATIONS,
    _BOOLEAN,
    _DEFINITIONS,
    _LEGACY_DRAFTS,
    _NEEDS,
    _SUPPORTED,
    _TYPE_OF_KEYWORD,
    _UNSUPPORTED,
    _join_uri,
    _own_id,
    _pointer,
    _split_dependencies,
    _unevaluated,
)



def check(lw, schema: dict, pointer: str) -> dict:
  """Drops annotations; refuses (or, lenient, drops) unsupported assertion keywords.

  Unknown keywords are annotations (JSON Schema 2020-12, section 6.5): ignored and
  recorded, never an error. So are keywords without the one they depend on (`then`
  without `if`) and `if` alone, which assert nothing.
  """
  dropped = []
  if schema is lw.root and pointer == "#":
    schema = _scoped_root(lw, schema)  # Where dynamic references depend on the path.
  if any(k in schema for k in ("$ref", "$recursiveRef", "$dynamicRef")):
    schema = _local_ref(lw, schema, pointer)
  if "dependencies" in schema:  # Draft-07: dependentRequired + dependentSchemas.
    schema = _split_dependencies(schema, pointer)
  if "allOf" in schema:  # Before `if` becomes `anyOf`: a chain of them multiplies.
    schema = _json_conditionals.split_conditionals(schema, _objects_only(lw, schema))
  if ("unevaluatedItems" in schema
      and any(k in schema for k in _json_unevaluated_items.KEYWORDS)):
    schema = _json_unevaluated_items.rewrite(lw, schema, pointer) or schema
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


def _local_ref(lw, schema: dict, pointer: str, scope=None) -> dict:
  """`schema` with its reference as a JSON pointer from the root in `$ref`.

  A `$ref` is a URI reference resolved against the base URI of where it sits (the
  `$id`s of the enclosing resources, RFC 3986): a resource of this document, a JSON
  pointer in it, or an anchor of it (`$anchor`, `$dynamicAnchor`, draft-07
  `$id: "#name"`). `$recursiveRef`/`$dynamicRef` resolve statically where that is
  exact (`_dynamic_ref`), else under `scope`, the `_Scope` of the path reaching
  `pointer`; with a scope, every pointer is scoped (see "Dynamic scopes"). With a
  draft-04/06/07 `$schema`, `$ref` overrides its siblings. A reference to another
  document is left as is (`resolve` refuses it).
  """
  out = dict(schema)
  for key in ("$recursiveRef", "$dynamicRef"):
    # Strings only: `_rebase` also meets maps of names, such as the metaschemas'
    # `properties` naming "$ref" and "$dynamicRef" (any other value stays, refused).
    if isinstance(out.get(key), str):
      value = out.pop(key)
      target = _dynamic_ref(lw, key, value, isinstance(out.get("$ref"), str), pointer,
                            scope)
      if target is not None and scope is not None and _unscoped(lw, target)[1] is None:
        # Static: its target reached as `jsonschema` follows it (it looks `value` up).
        current = _base_uri(lw, pointer)
        document = _join_uri(current, value if key == "$dynamicRef" else "#")
        scope_at = _push(lw, scope, current, document.partition("#")[0])
        target = _scoped(lw, target, _enter(lw, scope_at, _base_uri(lw, target)))
      if target is not None:
        out["$ref"], out["$resolved"] = target, True
  if "$ref" not in out or not isinstance(out["$ref"], str) or out.get("$resolved"):
    return out
  out["$ref"], out["$resolved"] = (
      _resolved_ref(lw, out["$ref"], pointer) if scope is None
      else _scoped_ref(lw, out["$ref"], pointer, scope)), True
  if lw.legacy_ref:  # Resolved once: `_check` runs again.
    out = {k: v for k, v in out.items() if k in ("$ref", "$resolved", *_DEFINITIONS)}
  return out


# The draft that defines each dynamic reference keyword, as `$schema` URIs name it.
_DYNAMIC_DRAFT = {"$dynamicRef": "2020-12", "$recursiveRef": "2019-09"}


def _dynamic_ref(lw, key: str, value: str, beside_ref: bool, pointer: str,
                 scope=None) -> str | None:
  """The resolved pointer (as `_resolved_ref` returns it) that `$dynamicRef` or
  `$recursiveRef` `value` at `pointer` stands for; None once refused (lenient) or read
  as an annotation. Where the target depends on the path (`_dynamic_verdict`), `scope`
  (the `_Scope` of the path that reaches `pointer`, see "Dynamic scopes") decides it,
  and the pointer returned is scoped (`_scoped`); without one, it is refused.
  """
  where = _pointer(pointer, key)
  verdict, detail = _dynamic_verdict(lw, key, value, beside_ref, pointer)
  if verdict == "annotation":
    lw.annotation(where)  # Not a keyword of the drafts declared (as `jsonschema` reads it).
    return None
  if verdict == "static":
    return detail
  if verdict == "path" and scope is not None:
    return _scoped_target(lw, key, value, pointer, scope)
  lw.unsupported(where, detail)
  return None


def _dynamic_verdict(lw, key: str, value: str, beside_ref: bool,
                     pointer: str) -> tuple[str, str]:
  """What `$dynamicRef` or `$recursiveRef` `value` at `pointer` is, without following
  paths: ("static", resolved pointer), ("annotation", ""), ("refused", message), or
  ("path", message): its target depends on the path that reaches it.

  Draft 2020-12 (`$dynamicRef`): the reference resolves as `$ref` does, to a target T.
  When its fragment names an anchor that T's resource declares with `$dynamicAnchor`,
  the target is that anchor in the outermost resource of the dynamic scope (the
  resources evaluation passed through) declaring it. Draft 2019-09 (`$recursiveRef`,
  only "#"): T is the root of the enclosing resource; when T has `$recursiveAnchor:
  true`, the target is the outermost resource of the dynamic scope that has it too
  (`jsonschema` stops at the first resource without it: both are asked of the root
  below). Static, without following paths:
    * T, when no other resource of the documents the root refers to (`_scope_facts`)
      declares the anchor;
    * the root: when the root resource declares it, has an `$id` (`jsonschema` enters
      a root without one in no dynamic scope), and no other resource can be entered
      from the root without a `$ref` (`jsonschema` enters only resources a `$ref`
      left in the dynamic scope); for `$recursiveRef` also every resource holding a
      reference has `$recursiveAnchor: true`.
  Anything else is "path". In documents that all declare other drafts (2019-09 for
  `$dynamicRef`, 2020-12 for `$recursiveRef`, draft 7 or older for both), the keyword
  is an unknown one: an annotation.

  Raises:
    SchemaError: `$recursiveRef` other than "#", or a name declared both ways.
  """
  where = _pointer(pointer, key)
  facts = _scope_facts(lw)
  draft = _DYNAMIC_DRAFT[key]
  other = sorted(d for d in facts["drafts"] if d != draft)
  if other and draft not in facts["drafts"] and all(
      d in _DYNAMIC_DRAFT.values() or "json-schema.org" in d
      and any(old in d for old in _LEGACY_DRAFTS) for d in other):
    return "annotation", ""
  if beside_ref or other:
    why = ("sits beside $ref in one schema object" if beside_ref else
           f"is a keyword of draft {draft}, but the documents involved declare"
           f" $schema {', '.join(other)}")
    return "refused", (
        f"{key} at {where} {why}, which is not supported. Expected a {key} alone in"
        f" its schema object, in draft {draft} documents. Use $ref, or pass"
        " lenient=True to ignore it (the output may then violate it).")
  base = _base_uri(lw, pointer)
  if key == "$recursiveRef":
    if value != "#":
      raise errors.SchemaError(
          f"$recursiveRef {value!r} at {where} is not '#'. Expected '#' (draft 2019-09"
          " defines no other value). Fix the value, or use $ref.")
    resource, is_dynamic, declaring = base, base in facts["recursive"], facts["recursive"]
    static, at_root = _resolved_ref(lw, "#", pointer), "#"
  else:
    document, _, fragment = _join_uri(base, value).partition("#")
    static = _resolved_ref(lw, value, pointer)
    resources = _resource_index(lw)[0]
    if not fragment or fragment.startswith("/") or document not in resources:
      return "static", static  # A pointer, or a document not known: as $ref.
    resource = _base_uri(lw, resources[document])
    declaring = {r for r, name in facts["dynamic"] if name == fragment}
    is_dynamic = resource in declaring
    if is_dynamic and (resource, fragment) in facts["plain"]:
      raise errors.SchemaError(
          f"$dynamicRef {value!r} at {where} names {fragment!r}, which {resource!r}"
          " declares both as $anchor and as $dynamicAnchor. Expected one anchor per"
          " name in a resource. Rename one of them.")
    at_root = _resource_index(lw)[1].get((_root_uri(lw), fragment))
  others = sorted(declaring - {resource})
  if not is_dynamic or not others:
    return "static", static
  root = _root_uri(lw)
  if (root and root in declaring and at_root is not None and not facts["entered"]
      and (key == "$dynamicRef" and (root, fragment) not in facts["plain"]
           or key == "$recursiveRef" and facts["lookups"] <= facts["recursive"])):
    return "static", at_root if pointer.startswith("#") else root + at_root
  anchor = ("$recursiveAnchor: true" if key == "$recursiveRef"
            else f"$dynamicAnchor {fragment!r}")
  verb = "declares" if len(others) == 1 else "declare"
  return "path", (
      f"{key} {value!r} at {where} resolves through the dynamic scope: besides its"
      f" static target {resource or '(the root)'!r}, {', '.join(map(repr, others))}"
      f" {verb} {anchor}, and which of them is outermost depends on the path that"
      " reaches it, which is not supported here. Expected the root resource (with an"
      " $id, entering embedded resources only through $ref) to declare it, or no other"
      " resource. Use $ref to the intended target, or pass lenient=True to ignore it"
      " (the output may then violate it).")


# ---------------------------------------------------------------------------------------
# Dynamic scopes.
#
# Where a dynamic reference's target depends on the path, the schema is lowered
# specialized by the part of the dynamic scope that decides it (`_Scope`): for each
# anchor name such a `$dynamicRef` names, the outermost resource of the scope
# declaring it (and for `$recursiveRef`, the outermost with `$recursiveAnchor: true`).
# That is finite, and usually one or two values per name. `_scoped_root` resolves the
# root's references under the root's scope (`_rebase` with a scope): every `$ref` in it
# becomes a *scoped* pointer (`_scoped`: the target's pointer and the index of the
# scope its subschema is reached in), every path-dependent `$dynamicRef` the scoped
# pointer of its target in that scope. Following a scoped pointer
# (`_json_conjunctions._flatten`, `resolve`) resolves the target's references in its scope the same way. Rule keys are
# the conjuncts' content, scoped pointers included: a recursive target becomes one rule
# per (target, scope) that tells targets apart, and a subschema whose references all
# resolve alike in two scopes is lowered once.
#
# The scope is kept twice, once as the specification defines it (every resource
# evaluation entered: the root, each `$ref` target's resource, each subschema with an
# `$id`) and once as `jsonschema` (`referencing`) builds it (a resource joins the scope
# when a reference is followed from it, and only then; the root without `$id` never):
# where the two give different targets, the reference is refused.


@dataclasses.dataclass(frozen=True)
class _Scope:
  """What decides the path-dependent references, on one path (see "Dynamic scopes").

  Attributes:
    spec: ((name, resource URI), ...): for each anchor name a path-dependent
      `$dynamicRef` names, the outermost resource entered that declares it with
      `$dynamicAnchor` (names no resource entered declares are left out).
    js: the same over the resources `jsonschema` put in its dynamic scope.
    pushed: whether `jsonschema` put any resource in it (it adds the current one when
      following a reference to another document, or to any, while none is in it).
    spec_recursive: the outermost resource entered with `$recursiveAnchor: true`, if
      a `$recursiveRef` is path-dependent.
    js_recursive: the outermost of the resources with `$recursiveAnchor: true` that
      `jsonschema` added last, one after the other (it stops at one without it);
      None when the last one added has none.
  """
  spec: tuple = ()
  js: tuple = ()
  pushed: bool = False
  spec_recursive: str | None = None
  js_recursive: str | None = None


# The scoped pointers met in one lowering are at most this many scopes apart.
MAX_DYNAMIC_SCOPES = 64
# A scoped pointer: the target's resolved pointer, then this, then the scope's index.
_SCOPE_MARK = "\N{MATHEMATICAL LEFT ANGLE BRACKET}dynamic scope "
_SCOPED = re.compile("(.*)" + _SCOPE_MARK + r"(\d+)\N{MATHEMATICAL RIGHT ANGLE BRACKET}",
                     re.DOTALL)


def _dynamic_scopes(lw) -> dict | None:
  """None if no dynamic reference's target depends on the path (the common case);
  else {"names": anchor names path-dependent `$dynamicRef`s name, "recursive": whether
  a `$recursiveRef` is path-dependent, "scopes": [_Scope], "index": {_Scope: i}}.
  Every `$dynamicRef`/`$recursiveRef` of the root document and of `resources` is asked
  (`_dynamic_verdict`); names are taken from all of them (more than needed is exact)."""
  found = getattr(lw, "_dynamic", False)
  if found is not False:
    return found
  names, recursive = set(), False
  todo = [(lw.root, "#")] + [(d, uri + "#") for uri, d in _documents(lw).items()]
  while todo:
    node, where = todo.pop()
    if isinstance(node, list):
      todo += [(v, _pointer(where, i)) for i, v in enumerate(node)]
      continue
    if not isinstance(node, dict):
      continue
    for key in ("$dynamicRef", "$recursiveRef"):
      if isinstance(node.get(key), str):
        try:
          verdict, _ = _dynamic_verdict(lw, key, node[key], isinstance(node.get("$ref"), str),
                                        where)
        except errors.ConstraintError:
          continue  # Raised again where it is lowered.
        if verdict == "path" and key == "$recursiveRef":
          recursive = True
        elif verdict == "path":
          names.add(_join_uri(_base_uri(lw, where), node[key]).partition("#")[2])
    todo += [(v, _pointer(where, k)) for k, v in node.items()
             if isinstance(v, (dict, list)) and k not in _NOT_SCHEMAS]
  found = None
  if names or recursive:
    found = {"names": names, "recursive": recursive, "scopes": [], "index": {}}
  lw._dynamic = found
  return found


def _scoped_root(lw, schema: dict) -> dict:
  """The root `schema` with its references resolved under the root's scope (see
  "Dynamic scopes"), where a dynamic reference's target depends on the path; else
  `schema` itself."""
  if _dynamic_scopes(lw) is None:
    return schema
  return _rebase(lw, schema, "#", _enter(lw, _Scope(), _root_uri(lw)))


def _scoped(lw, target: str, scope: _Scope) -> str:
  """The scoped pointer of `target` (a resolved pointer) reached in `scope`.

  Raises:
    CompileBudgetError: more than `MAX_DYNAMIC_SCOPES` scopes.
  """
  if target.startswith("#") and _root_uri(lw):
    target = _root_uri(lw) + target  # Unambiguous wherever it goes (as `_rebase` writes).
  dynamic = _dynamic_scopes(lw)
  index = dynamic["index"].get(scope)
  if index is None:
    if len(dynamic["scopes"]) >= MAX_DYNAMIC_SCOPES:
      raise errors.CompileBudgetError(
          f"$dynamicRef/$recursiveRef targets depend on the path in more than"
          f" {MAX_DYNAMIC_SCOPES} ways (dynamic scopes: for each of the anchor names"
          f" {sorted(dynamic['names'])}, the outermost resource declaring it), each"
          " lowered apart. Expected fewer resources declaring the same dynamic anchor."
          " Use $ref to the intended targets.")
    index = dynamic["index"][scope] = len(dynamic["scopes"])
    dynamic["scopes"].append(scope)
  return f"{target}{_SCOPE_MARK}{index}\N{MATHEMATICAL RIGHT ANGLE BRACKET}"


def _unscoped(lw, ref):
  """(resolved pointer, _Scope or None) of a `$ref` value, scoped (`_scoped`) or not."""
  match = _SCOPED.fullmatch(ref) if isinstance(ref, str) else None
  dynamic = _dynamic_scopes(lw) if match else None
  if dynamic is None or int(match[2]) >= len(dynamic["scopes"]):
    return ref, None
  return match[1], dynamic["scopes"][int(match[2])]


def _declared(lw, resource: str) -> list[str]:
  """The names of path-dependent `$dynamicRef`s that `resource` declares dynamically."""
  names = _dynamic_scopes(lw)["names"]
  return sorted(n for r, n in _scope_facts(lw)["dynamic"] if r == resource and n in names)


def _enter(lw, scope: _Scope, resource: str) -> _Scope:
  """`scope` once evaluation enters `resource` (a `$ref` target's, or an `$id`'s)."""
  spec = dict(scope.spec)
  for name in _declared(lw, resource):
    spec.setdefault(name, resource)
  recursive = scope.spec_recursive
  if (recursive is None and _dynamic_scopes(lw)["recursive"]
      and resource in _scope_facts(lw)["recursive"]):
    recursive = resource
  return dataclasses.replace(scope, spec=tuple(sorted(spec.items())),
                             spec_recursive=recursive)


def _push(lw, scope: _Scope, current: str, document: str) -> _Scope:
  """`scope` once `jsonschema` follows a reference from resource `current` into
  `document` (the target's URI without fragment): `Resolver._evolve` adds `current`
  unless it is "" (a root without `$id`), or the target is in `current` while the scope
  holds some resource already."""
  if not current or scope.pushed and document == current:
    return scope
  js = dict(scope.js)
  for name in _declared(lw, current):
    js.setdefault(name, current)
  recursive = None
  if current in _scope_facts(lw)["recursive"]:
    recursive = scope.js_recursive or current
  return dataclasses.replace(scope, js=tuple(sorted(js.items())), pushed=True,
                             js_recursive=recursive)


def _scoped_ref(lw, ref: str, pointer: str, scope: _Scope) -> str:
  """The scoped pointer of the `$ref` value `ref` at `pointer`, reached in `scope`."""
  current = _base_uri(lw, pointer)
  target = _resolved_ref(lw, ref, pointer)
  document = _join_uri(current, ref).partition("#")[0]
  scope = _enter(lw, _push(lw, scope, current, document), _base_uri(lw, target))
  return _scoped(lw, target, scope)


def _scoped_target(lw, key: str, value: str, pointer: str, scope: _Scope) -> str | None:
  """The scoped pointer of the path-dependent `$dynamicRef`/`$recursiveRef` `value` at
  `pointer` reached in `scope`; None once refused (lenient): where the specification
  and `jsonschema` resolve it to different resources, or `jsonschema` would read the
  target's own references against another base URI."""
  where = _pointer(pointer, key)
  current = _base_uri(lw, pointer)
  resources, anchors, _ = _resource_index(lw)
  if key == "$recursiveRef":
    static, name = current, None
    spec, js = scope.spec_recursive or current, scope.js_recursive or current
    document = js  # `lookup_recursive_ref` looks the chosen resource up.
  else:
    document, _, name = _join_uri(current, value).partition("#")
    static = _base_uri(lw, resources[document])
    spec = dict(scope.spec).get(name, static)
    js = dict(_push(lw, scope, current, document).js).get(name, static)
  if spec != js:
    why = ("jsonschema's dynamic scope holds only the resources a reference was"
           " followed from, never a root without $id")
    if key == "$recursiveRef":
      why += ", and it stops at the first one without $recursiveAnchor: true"
    lw.unsupported(where, (
        f"{key} {value!r} at {where} resolves through the dynamic scope, and on a path"
        f" that reaches it the specification and jsonschema resolve it to different"
        f" resources: {spec or '(the root)'!r} against {js or '(the root)'!r} ({why}),"
        " which is not supported. Expected the resources that declare the anchor to be"
        " entered through $ref, under an $id. Use $ref to the intended target, or pass"
        " lenient=True to ignore it (the output may then violate it)."))
    return None
  if key == "$recursiveRef":
    target = resources[spec]
  else:
    target = (_resolved_ref(lw, value, pointer) if spec == static
              else anchors[spec, name])
  node = _target(lw, target, pointer)
  entered = _base_uri(lw, target)
  if key == "$dynamicRef" and entered != static:
    # `DynamicAnchor.resolve` keeps the static target's base URI, joined with the
    # anchor's own `$id`: the target's references would be read against it.
    seen = _join_uri(document, _own_id(node) or "").partition("#")[0]
    if seen != entered and _refers(node):
      lw.unsupported(where, (
          f"{key} {value!r} at {where} resolves, on some path that reaches it, to"
          f" {target!r}, which holds references of its own that jsonschema would"
          f" read against the base URI {seen!r} instead of {entered!r}, which is not"
          " supported. Expected the dynamic anchor on a resource's root (with its"
          " $id), or no reference under it. Move $dynamicAnchor to the resource's"
          " root, or pass lenient=True to ignore it (the output may then violate it)."))
      return None
  scope = _enter(lw, _push(lw, scope, current, document), entered)
  return _scoped(lw, target, scope)


def _refers(schema) -> bool:
  """Whether `schema` holds a reference or an embedded resource (`$id`) below its top."""
  todo = [(schema, True)]
  while todo:
    node, top = todo.pop()
    if isinstance(node, list):
      todo += [(v, False) for v in node]
      continue
    if not isinstance(node, dict):
      continue
    if any(isinstance(node.get(k), str) for k in ("$ref", "$dynamicRef", "$recursiveRef")):
      return True
    if not top and _own_id(node):
      return True
    todo += [(v, False) for k, v in node.items() if k not in _NOT_SCHEMAS]
  return False


# Keywords whose value maps names to subschemas (the names are not keywords).
_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas", "dependencies")


def _entered_without_ref(schema) -> bool:
  """Whether a subschema with its own `$id` is reached from `schema` through
  applicators alone (no `$ref`; definitions are reached only through one)."""
  todo = [schema]
  while todo:
    node = todo.pop()
    if not isinstance(node, dict):
      continue
    if node is not schema and _own_id(node):
      return True
    for key, value in node.items():
      if key in _DEFINITIONS or key in _NOT_SCHEMAS:
        continue
      if key in _SCHEMA_MAPS and isinstance(value, dict):
        todo += value.values()
      elif isinstance(value, list):
        todo += value
      else:
        todo.append(value)  # Unknown keywords too: over, never under.
  return False


def _scope_facts(lw) -> dict:
  """What `_dynamic_ref` needs of the documents the root refers to, directly or not
  (the root document, then each document of `resources` a reference in them names):
    dynamic:   {(resource URI, name)} declared by `$dynamicAnchor`;
    plain:     {(resource URI, name)} declared by `$anchor`;
    recursive: {resource URI} whose root has `$recursiveAnchor: true`;
    lookups:   {resource URI} holding a `$ref`, `$recursiveRef` or `$dynamicRef`;
    drafts:    the drafts ("2019-09", "2020-12", or the URI) their `$schema`s name;
    entered:   whether the root enters a resource without `$ref`.
  Resource URIs are base URIs ("" for a root without `$id`).
  """
  facts = getattr(lw, "_scope", None)
  if facts is not None:
    return facts
  facts = {"dynamic": set(), "plain": set(), "recursive": set(), "lookups": set(),
           "drafts": set(), "entered": _entered_without_ref(lw.root)}
  resources = _resource_index(lw)[0]
  documents = _documents(lw)
  seen, todo = {""}, [("", lw.root, _root_uri(lw))]
  while todo:
    _, document, base = todo.pop()
    stack = [(document, base, True)]
    while stack:
      node, base, top = stack.pop()
      if isinstance(node, list):
        stack += [(v, base, False) for v in node]
        continue
      if not isinstance(node, dict):
        continue
      if _own_id(node) and not top:
        base = _join_uri(base, _own_id(node)).partition("#")[0]
      if node.get("$recursiveAnchor") is True:
        facts["recursive"].add(base)
      for key, kind in (("$dynamicAnchor", "dynamic"), ("$anchor", "plain")):
        if isinstance(node.get(key), str):
          facts[kind].add((base, node[key]))
      if isinstance(node.get("$schema"), str):
        uri = node["$schema"]
        facts["drafts"].add(next((d for d in ("2019-09", "2020-12") if d in uri), uri))
      for key in ("$ref", "$recursiveRef", "$dynamicRef"):
        if isinstance(node.get(key), str):
          facts["lookups"].add(base)
          target = resources.get(_join_uri(base, node[key]).partition("#")[0])
          name = target.partition("#")[0] if target is not None else None
          if name and name not in seen:
            seen.add(name)
            todo.append((name, documents[name],
                         _join_uri(name, _own_id(documents[name]) or "").partition("#")[0]))
      stack += [(v, base, False) for k, v in node.items()
                if isinstance(v, (dict, list)) and k not in _NOT_SCHEMAS]
  lw._scope = facts
  return facts


def _rebase(lw, schema, pointer: str, scope=None, top: bool = True):
  """`schema` (at `pointer`) with every `$ref` in it resolved (`$resolved`), so that it
  means the same wherever it is lowered. Definitions are left out: the resolved
  `$ref`s point into the documents themselves. With a `scope` (the `_Scope` at
  `pointer`, its resource entered), the pointers are scoped (see "Dynamic scopes"):
  below `schema`, a subschema with an `$id` enters its resource."""
  if isinstance(schema, list):
    return [_rebase(lw, v, _pointer(pointer, i), scope, False) for i, v in enumerate(schema)]
  if not isinstance(schema, dict):
    return schema
  if (scope is not None and not top and _own_id(schema)
      and not (lw.legacy_ref and "$ref" in schema)):
    scope = _enter(lw, scope, _base_uri(lw, pointer))
  out = {k: v if k in _NOT_SCHEMAS or k in _DEFINITIONS
         else _rebase(lw, v, _pointer(pointer, k), scope, False) for k, v in schema.items()}
  if any(k in out for k in ("$ref", "$recursiveRef", "$dynamicRef")):
    out = _local_ref(lw, out, pointer, scope)
    if isinstance(out.get("$ref"), str) and out["$ref"].startswith("#") and _root_uri(lw):
      out["$ref"] = _root_uri(lw) + out["$ref"]  # Unambiguous wherever it goes.
  return out


def resolve(lw, ref, pointer: str):
  """The subschema a `$ref` value met inside the schema at `pointer` points to.

  `#...` there means the root's pointer (as a resolved `$ref` holds it) when `pointer`
  is in the root document. A target in another document, or under another base URI,
  comes with its `$ref`s resolved (`_rebase`), as the caller lowers it at `pointer`.
  """
  ref, scope = _unscoped(lw, ref)
  if scope is not None:  # Its references resolved in the scope it is reached in.
    ref = _canonical_pointer(lw, ref)
    return _rebase(lw, _target(lw, ref, pointer), ref, scope)
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
      # `#/` is the member named "" (RFC 6901), as `referencing` reads it: not the root.
      hint = (" ('#/' names the member \"\" of the root, not the root: that is '#')"
              if fragment == "/" else "")
      raise errors.SchemaError(
          f"$ref {ref!r} at {where} does not resolve: no {token!r} there{hint}."
          " Expected a pointer to a subschema of its document. Fix the pointer or add"
          " the definition under $defs."
      )
  return node
