"""Shared definitions: a `$ref` target lowered in several places, called as one rule.

Public functions:
  SHARED_DEFINITIONS              the values of `SchemaOptions.shared_definitions`.
  record(lw, key, hint, body)     notes one inlined lowering of a `$ref` conjunction.
  share(lw, root, rules)          (root, rules): chosen bodies replaced by `RuleRef`s.

By default every non-recursive `$ref` is inlined: its target is lowered again at each
use (minimization then merges the copies whose continuations agree, as in register
objects, where every member returns to one state). With `shared_definitions="call"`
a target lowered to the same IR in two places or more becomes a rule of the push-down
grammar, like a recursive target, called on the device stack: its states exist once.

Measured (issue 15; `benchmarks/schema_corpus.py --shared-definitions call`, Gemma 3):
calls did not pay off. On the 8 corpus schemas where they apply, compile time rose 3 to
10x and tables grew by 0.2 to 10 MiB; two no longer compiled (a time budget; a call
that makes the grammar nondeterministic at the token level, `[` starting both a called
array and an array of it). Synthetic (one definition used n = 2 to 200 times, byte
vocabulary) the inlined tables do not grow with n at all, so there is nothing for a
call to save. On the public schemas (`benchmarks/public_schemas.py`), calls change 26 of
179: cfnlint's IAM policy schemas compile 1.5 to 2x faster with tables half as big on
the byte vocabulary but 1 to 4 MiB bigger with Gemma 3 (20 to 24 MiB); nbformat 3 to
7x slower; three no longer compile (nondeterministic at the token level). Push-down composition costs more per state than the copies do, and the
push-down path lacks the regular one's counted chains and spliced fragments. Hence
inlining stays the default, with no automatic choice.

The lowering itself is not changed: every decision it makes by looking at a member's IR
(any order or schema order, registers, unions lifted) is made on the inlined body, as
without sharing. Only afterwards (`share`) are the recorded bodies found again in the
lowered IR, by object identity (whole nodes, or a contiguous run of a concatenation's
parts, where `ir.concat` flattened a body into its context), and replaced by a call.
A call means exactly its body, so the language is unchanged; an occurrence not found
(merged into a union, rewritten by a later pass) simply stays inlined. Bodies that use
register words or call a rule other than the free-form value's stay inlined: a callee
must leave its callers' register words alone (`_callable`).
"""

from constrained_decoding.constraints import _ir as ir

SHARED_DEFINITIONS = ("inline", "call")


def record(lw, key: str, hint: str, body: ir.Node) -> None:
  """Notes that the conjunction `key` (first `$ref`: `hint`) was lowered to `body` inline."""
  if lw.options.shared_definitions == "inline":
    return
  lw.inlined.setdefault(key, (hint, []))[1].append(body)


def _callable(lw, body: ir.Node) -> bool:
  """Whether `body` touches no register word (`ir.Marker`) and calls no rule but the
  free-form value's, which touches none either: the row's words are not saved on the
  stack, so a callee must leave its callers' words alone (`automata/_rtn._check_calls`
  refuses a call where it might not, and the compiler would then fall back to objects
  in schema order: a narrower language)."""
  return not ir.fold(body, lambda n, children: isinstance(n, ir.Marker) or (
      isinstance(n, ir.RuleRef) and not lw.is_free_form(n)) or any(children),
      memo=lw.memos["callable"])


def _chosen(lw) -> dict[str, list[ir.Node]]:
  """Rule name -> the occurrences (equal bodies) of each target that becomes a rule."""
  taken = set(lw.names.values()) | set(lw.rules)
  chosen = {}
  for hint, bodies in lw.inlined.values():
    same = [b for b in bodies if b is bodies[0] or b == bodies[0]]
    if (len(same) < 2 or same[0] == ir.NOTHING or isinstance(same[0], ir.RuleRef)
        or not _callable(lw, same[0])):
      continue
    name = next(n for n in (hint, *(f"{hint} ({i})" for i in range(2, len(taken) + 3)))
                if n not in taken)
    taken.add(name)
    chosen[name] = same
  return chosen


def share(lw, root: ir.Node, rules: dict[str, ir.Node]
          ) -> tuple[ir.Node, dict[str, ir.Node], frozenset[str]]:
  """(`root`, `rules` plus the new ones, the new names): in all of them, each chosen
  body's occurrences replaced by a call."""
  chosen = _chosen(lw)
  if not chosen:
    return root, rules, frozenset()
  whole: dict[int, str] = {}
  runs: dict[int, list[tuple[tuple[int, ...], str]]] = {}
  for name, bodies in chosen.items():
    for body in bodies:
      whole[id(body)] = name
      if isinstance(body, ir.Concat):
        ids = tuple(map(id, body.parts))
        runs.setdefault(ids[0], []).append((ids, name))
  memo: dict[int, tuple] = {}

  def walk(n: ir.Node, own: str | None = None) -> ir.Node:
    if own is None:
      hit = memo.get(id(n))
      if hit is not None:
        return hit[1]
      if id(n) in whole:
        out = ir.RuleRef(whole[id(n)])
        memo[id(n)] = (n, out)
        return out
    if isinstance(n, ir.Fragment):
      out = n  # A free-form value: no definition inside.
    elif isinstance(n, ir.Concat):
      out = _calls_in_concat(n, own)
    else:
      out = ir.rebuild(n, [walk(c) for c in ir.children(n)])
    if own is None:
      memo[id(n)] = (n, out)
    return out

  def _calls_in_concat(n: ir.Concat, own: str | None) -> ir.Node:
    parts, i = [], 0
    while i < len(n.parts):
      for ids, name in runs.get(id(n.parts[i]), ()):
        if name != own and tuple(map(id, n.parts[i:i + len(ids)])) == ids:
          parts.append(ir.RuleRef(name))
          i += len(ids)
          break
      else:
        parts.append(walk(n.parts[i]))
        i += 1
    if len(parts) == len(n.parts):
      return ir.rebuild(n, parts)
    return parts[0] if len(parts) == 1 else ir.Concat(tuple(parts))

  called = {name: walk(bodies[0], own=name) for name, bodies in chosen.items()}
  return (walk(root), {**{n: walk(b) for n, b in rules.items()}, **called},
          frozenset(called))
