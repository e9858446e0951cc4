"""`unevaluatedItems` next to `anyOf`/`oneOf`, `not`, `if`/`then`/`else`, `contains`,
`allOf` and `$ref`, rewritten as positive schemas without it.

Function (`lw` is the lowering in progress, `_json_schema._Lowerer`):
  rewrite(lw, schema, pointer)   `schema` as an `anyOf` of branches without
                                 `unevaluatedItems`, or None (the caller refuses).

What a matching schema evaluates is, here, always "the first L items, and each later
item that matches one of the `contains` schemas C1..Cn" (`_Evaluated`): `prefixItems`
and array-form `items` evaluate a prefix, `items`/`additionalItems` everything after
it, `contains` the items it matches, `not` nothing. That is static per branch once the
branch says which alternatives match and which do not, so each branch ("these
alternatives match, those fail") ends with the positional schema
`{prefixItems: [true] * L, items: anyOf [C1..Cn, U]}` for `unevaluatedItems: U`: exact,
and nothing merged into the branch (a negation's parts) is counted as evaluated.
"""

import math

from constrained_decoding import errors
from constrained_decoding.constraints import _json_negation
from constrained_decoding.constraints._json_keywords import (
    _ANNOTATIONS,
    _DEFINITIONS,
    _pointer,
    evaluated_through,
)

# Keywords of the schema whose branches this module builds.
KEYWORDS = ("not", "if", "anyOf", "oneOf", "contains", "allOf", "$ref")
# Most branches written (each a conjunction with negations).
MAX_BRANCHES = 64
# Most `anyOf` alternatives whose regions (2^n - 1 sets matching together) are built when
# they evaluate through `contains`.
MAX_REGION_ALTERNATIVES = 4
# Keywords past which what a schema evaluates is not static (or is refused here).
_DYNAMIC = frozenset({
    "anyOf", "oneOf", "if", "then", "else", "dependentSchemas", "dependencies",
    "$dynamicRef", "$recursiveRef", "unevaluatedItems", "$unevaluatedItems",
    "unevaluatedProperties", "$unevaluatedProperties", "$fromNot", "$id", "id",
    "$anchor", "$dynamicAnchor", "$recursiveAnchor"})
_PLACES = ("$id", "id", "$anchor", "$dynamicAnchor", "$recursiveAnchor")


class _Evaluated:
  """Items a matching schema evaluates: the first `length` (math.inf: all) and each
  later one matching a schema of `contains`."""

  def __init__(self, length: int | float = 0, contains: tuple = ()):
    self.length, self.contains = length, tuple(contains)

  def union(self, *others: "_Evaluated") -> "_Evaluated":
    return _Evaluated(max([self.length, *(o.length for o in others)]),
                      self.contains + tuple(c for o in others for c in o.contains))

  def positional(self, unevaluated):
    """The schema holding every item not evaluated here to `unevaluated`."""
    if self.length == math.inf or unevaluated is True:
      return True
    rest = {"anyOf": [*self.contains, unevaluated]} if self.contains else unevaluated
    out = {"items": rest}
    if self.length:
      out["prefixItems"] = [True] * int(self.length)
    return out


def _evaluated(lw, schema, pointer: str) -> _Evaluated | None:
  """What a matching `schema` evaluates (through `allOf` and `$ref`), None where that
  is not static (`_DYNAMIC`)."""

  def own(k, value, schema):
    if k in _DYNAMIC:
      return None
    if k == "items":
      return _Evaluated(len(value) if isinstance(value, list) else math.inf)
    if k == "prefixItems":
      return _Evaluated(len(value)) if isinstance(value, list) else None
    if k == "additionalItems" and isinstance(schema.get("items"), list):
      return _Evaluated(math.inf)
    if k == "contains":
      if _draft_2019(lw):
        return None  # There `contains` evaluates nothing: not handled here.
      return _Evaluated(0, (value,))
    return _Evaluated()

  return evaluated_through(lw, schema, pointer, own, _Evaluated())


def _draft_2019(lw) -> bool:
  uri = lw.root.get("$schema") if isinstance(lw.root, dict) else None
  return isinstance(uri, str) and "2019-09" in uri


def _any_of_options(lw, alternatives, pointer: str):
  """(positives, negatives) per region of `anyOf`: the alternatives that match, the
  ones that fail. Without `contains`, only the alternative evaluating the longest
  prefix matters: alternative i, and none evaluating more than it."""
  evaluated = [_evaluated(lw, a, pointer) for a in alternatives]
  if any(e is None for e in evaluated):
    return None
  n = len(alternatives)
  if not any(e.contains for e in evaluated):
    return [([a], [b for j, b in enumerate(alternatives)
                   if evaluated[j].length > evaluated[i].length])
            for i, a in enumerate(alternatives)]
  if n > MAX_REGION_ALTERNATIVES:
    return None
  return [([a for i, a in enumerate(alternatives) if mask >> i & 1],
           [a for i, a in enumerate(alternatives) if not mask >> i & 1])
          for mask in range(1, 1 << n)]


def _options(lw, schema, pointer: str, depth: int = 0) -> list | None:
  """`schema` as (positive parts, negated parts) per branch, each positive part
  evaluating statically (`_evaluated`): `not`, `if`/`then`/`else` (nested ones too),
  `anyOf` and `oneOf` at its top split into branches. None where that fails, or past
  `MAX_BRANCHES`."""
  if _evaluated(lw, schema, pointer) is not None:
    return [([schema], [])]
  if not isinstance(schema, dict) or depth > 4 or any(k in schema for k in _PLACES):
    return None
  moved = ("not", "if", "then", "else", "anyOf", "oneOf")
  rest = {k: v for k, v in schema.items() if k not in moved}
  if _evaluated(lw, rest, pointer) is None:
    return None
  options = [([rest], [])]  # (positive parts, negated parts) of each branch.

  def product(options, more):
    out = [(p + mp, n + mn) for p, n in options for mp, mn in more]
    return out if len(out) <= MAX_BRANCHES else None

  if "not" in schema:
    options = [(p, [*n, schema["not"]]) for p, n in options]
  if "if" in schema:
    condition = schema["if"]
    matched = _options(lw, condition, pointer, depth + 1)
    then = _options(lw, schema.get("then", True), pointer, depth + 1)
    otherwise = _options(lw, schema.get("else", True), pointer, depth + 1)
    if matched is None or then is None or otherwise is None:
      return None
    branches = product(matched, then)
    if branches is None:
      return None
    branches += [(p, [*n, condition]) for p, n in otherwise]
    options = product(options, branches)
  for key in ("anyOf", "oneOf"):
    if key not in schema or options is None:
      continue
    alternatives = schema[key]
    if not isinstance(alternatives, list) or not alternatives:
      return None  # Lowering reports it.
    if key == "anyOf":
      regions = _any_of_options(lw, alternatives, pointer)
      if regions is None:
        return None
    else:
      regions = []
      for i, a in enumerate(alternatives):
        own = _options(lw, a, pointer, depth + 1)
        if own is None:
          return None
        others = [b for j, b in enumerate(alternatives) if j != i]
        regions += [(p, [*n, *others]) for p, n in own]
    options = product(options, regions)
  return options


def rewrite(lw, schema: dict, pointer: str) -> dict | None:
  """`schema` (with `unevaluatedItems` and some of `KEYWORDS`) as an `anyOf` of
  branches (`_options`), each "its positive parts match, its negated parts fail, and
  the items they leave unevaluated match `unevaluatedItems`" (see the module doc).
  None where a part evaluates dynamically, a negation is not exact
  (`_json_negation.negate`), the schema has its own `$id` or anchors, or past
  `MAX_BRANCHES`."""
  if any(k in schema for k in _PLACES) or "unevaluatedProperties" in schema:
    return None
  unevaluated = schema["unevaluatedItems"]
  top = {k: v for k, v in schema.items() if k in _ANNOTATIONS or k in _DEFINITIONS}
  options = _options(lw, {k: v for k, v in schema.items()
                          if k not in top and k != "unevaluatedItems"}, pointer)
  if options is None:
    return None
  resolve = lambda ref: lw.resolve(ref, pointer)  # noqa: E731
  branches = []
  for positives, negatives in options:
    evaluated = [_evaluated(lw, p, pointer) for p in positives]
    if any(e is None for e in evaluated):
      return None
    try:
      negated = [_json_negation.negate(x, resolve, pointer) for x in negatives]
    except errors.UnsupportedSchemaError:
      return None
    if any(x is False for x in negated):
      continue  # A negated part accepts everything: no value is in this branch.
    parts = [*positives, *(x for x in negated if x is not True),
             _Evaluated().union(*evaluated).positional(unevaluated)]
    branches.append({"allOf": [p for p in parts if p is not True] or [True]})
  lw.log.info("JSON Schema: unevaluatedItems at %s is lowered as %d branches (what each"
              " evaluates is static).", _pointer(pointer, "unevaluatedItems"), len(branches))
  return {**top, "anyOf": branches or [False]}
