"""Passes over the grammar a recursive JSON Schema lowers to (`_json_schema.py`).

Public function:
  recursive_grammar(schema, root, rules)   the normalized `GrammarIR` of a schema whose
                                           recursive `$ref` targets are `rules`.
  has_rule_ref(node, memo)                 whether an IR tree calls a rule.

The other functions are generic IR walks it needs: FIRST sets of rules, lifting unions
whose alternatives start alike into rules of their own, and writing `ir.Graph`s that
call rules as expressions (the push-down compiler reads rules as expressions).
"""

from constrained_decoding import errors
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _grammar_depth
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_keywords

def recursive_grammar(schema, root: ir.Node, rules: dict[str, ir.Node],
                      keep: frozenset[str] = frozenset(),
                      graph_calls: frozenset[str] = frozenset()):
  """The normalized grammar of the root's IR and the rules of recursive `$ref` targets.

  Returns a regular IR node instead when normalization leaves no recursion (as for
  `{"anyOf": [{"$ref": "#"}, {"type": "null"}]}`, which is just `null`). The rules in
  `keep` (shared definitions, `_json_shared.py`) stay rules though not recursive.
  Graphs whose calls are all to rules in `graph_calls` stay graphs (see
  `_without_rule_graphs`).

  Raises:
    SchemaError: The start derives no finite JSON text (recursion that never ends).
  """
  memo: dict = {}
  # The grammar analyses and the push-down builder work on plain IR.
  root = ir.inline_fragments(root)
  rules = {name: ir.inline_fragments(body) for name, body in rules.items()}
  bodies = {name: _without_rule_graphs(body, memo, graph_calls) for name, body in rules.items()}
  if isinstance(root, ir.RuleRef):
    start = root.name
  else:
    start = next(n for n in ("#", "# (root)") if n not in bodies)
    bodies = {start: _without_rule_graphs(root, memo, graph_calls), **bodies}
  grammar = _grammar.GrammarIR(start, tuple(bodies.items()))
  productive = _grammar.productive_rules(grammar)
  if start not in productive:
    dead = [name for name in rules if name not in productive]
    if not dead:
      raise _json_keywords.unsatisfiable(schema)
    raise errors.SchemaError(
        f"Recursive $ref {dead[0]!r} never ends: every alternative of its target refers"
        f" to {dead} again, so the schema accepts no finite JSON value. Expected an"
        " optional property, a possibly empty array or an anyOf branch that ends the"
        " recursion. Add one."
    )
  grammar = _grammar.normalize(_lift_overlapping_unions(grammar), keep=keep)
  if not _grammar.recursive_rules(grammar) and not set(grammar.names) & keep:
    return _grammar_depth.to_regular(grammar)
  return grammar


_MAX_LIFTS = 32  # Unions `_lift_overlapping_unions` turns into rules, at most.
_ALL_BYTES = frozenset(range(256))
_UTF8_LEADS = frozenset(range(0xC2, 0xF5))


def _lift_overlapping_unions(grammar: _grammar.GrammarIR) -> _grammar.GrammarIR:
  """Turns each union that calls a rule and may start like another alternative into a rule.

  `{"anyOf": [{"$ref": "#/$defs/Add"}, {"$ref": "#/$defs/Num"}]}` inside `Add` (what
  pydantic writes for a recursive union of models) is `Add | Num` with `Add` a rule:
  both start with `{`, and a push-down automaton must decide at the `{` whether to
  call `Add`, which one byte of lookahead cannot. The union `u` becomes the rule
  `U = Add' | Num'` (each rule alternative replaced by its body, `u` by `U` everywhere),
  so the choice is made inside one rule, by its DFA. Unions whose alternatives start
  with different bytes (`Node | null`) are left alone.
  """
  rules = dict(grammar.rules)
  for _ in range(_MAX_LIFTS):
    union = _overlapping_union(rules)
    if union is None:
      break
    called = [a.name for a in union.alternatives if isinstance(a, ir.RuleRef) and a.name in rules]
    taken = set(rules)
    base = " | ".join(called) + (" | ..." if len(called) < len(union.alternatives) else "")
    name = next(n for n in (base, *(f"{base} ({i})" for i in range(2, len(taken) + 3)))
                if n not in taken)
    lifted = ir.RuleRef(name)
    memo: dict = {}
    rules = {r: _replace_node(body, union, lifted, memo) for r, body in rules.items()}
    rules[name] = ir.union(*(rules[a.name] if isinstance(a, ir.RuleRef) and a.name in rules
                             else _replace_node(a, union, lifted, memo)
                             for a in union.alternatives))
  return grammar.replace_rules(rules)


def _overlapping_union(rules: dict[str, ir.Node]) -> ir.Union | None:
  """A union with a rule alternative whose first bytes meet another alternative's."""
  firsts = _rule_firsts(rules)
  memo: dict = {}
  seen: set[int] = set()
  stack = list(rules.values())
  while stack:
    node = stack.pop()
    if id(node) in seen:
      continue
    seen.add(id(node))
    if isinstance(node, ir.Union) and any(isinstance(a, ir.RuleRef) for a in node.alternatives):
      starts = [_first(a, firsts, memo)[0] for a in node.alternatives]
      for i, a in enumerate(node.alternatives):
        if isinstance(a, ir.RuleRef) and any(
            starts[i] & other for j, other in enumerate(starts) if j != i):
          return node
    stack.extend(ir.children(node))
  return None


def _rule_firsts(rules: dict[str, ir.Node]) -> dict:
  """Rule -> (bytes a string of it may start with, whether it is nullable): a fixpoint."""
  firsts = {name: (frozenset(), False) for name in rules}
  changed = True
  while changed:
    changed = False
    memo: dict = {}
    for name, body in rules.items():
      value = _first(body, firsts, memo)
      if value != firsts[name]:
        firsts[name] = value
        changed = True
  return firsts


def _first(node: ir.Node, firsts: dict, memo: dict) -> tuple[frozenset, bool]:
  """(first bytes, nullable) of `node`, over-approximated for graphs and terminals."""
  hit = memo.get(id(node))
  if hit is not None:
    return hit[1]
  if isinstance(node, ir.Bytes):
    value = (frozenset(node.data[:1]), not node.data)
  elif isinstance(node, ir.CharClass):
    ascii_bytes = {b for lo, hi in node.ranges for b in range(lo, min(hi, 0x7F) + 1)}
    wide = any(hi > 0x7F for _, hi in node.ranges)
    value = (frozenset(ascii_bytes) | (_UTF8_LEADS if wide else frozenset()), False)
  elif isinstance(node, ir.ByteClass):
    value = (frozenset(b for lo, hi in node.ranges for b in range(lo, hi + 1)), False)
  elif isinstance(node, ir.Concat):
    out, nullable = frozenset(), True
    for part in node.parts:
      part_first, part_nullable = _first(part, firsts, memo)
      out |= part_first
      if not part_nullable:
        nullable = False
        break
    value = (out, nullable)
  elif isinstance(node, ir.Union):
    pairs = [_first(a, firsts, memo) for a in node.alternatives]
    value = (frozenset().union(*(f for f, _ in pairs)), any(n for _, n in pairs))
  elif isinstance(node, ir.Repeat):
    inner, nullable = _first(node.node, firsts, memo)
    value = (inner, nullable or node.min == 0)
  elif isinstance(node, ir.RuleRef):
    value = firsts.get(node.name, (frozenset(), False))
  elif isinstance(node, ir.Graph):
    value = (frozenset().union(*(_first(label, firsts, memo)[0] for _, label, _ in node.arcs)),
             0 in node.finals)
  else:  # Terminal: any token.
    value = (_ALL_BYTES, False)
  memo[id(node)] = (node, value)
  return value


def _replace_node(node: ir.Node, old: ir.Node, new: ir.Node, memo: dict) -> ir.Node:
  """`node` with every sub-node equal to `old` replaced by `new`, simplified where changed.

  `memo` is shared by the calls with the same `old` and `new`."""
  return ir.transform(node, before=lambda n: new if n == old else None,
                      build=_grammar.rebuild_simplified, memo=memo)


def has_rule_ref(node: ir.Node, memo: dict) -> bool:
  """Whether `node` (graph arcs included) contains a `RuleRef`; memoized by identity."""
  hit = memo.get(id(node))
  if hit is None:
    found = isinstance(node, ir.RuleRef) or any(has_rule_ref(c, memo)
                                                for c in ir.children(node))
    hit = memo[id(node)] = (node, found)  # Keeps `node` alive so that its id stays unique.
  return hit[1]


def _without_rule_graphs(node: ir.Node, memo: dict,
                         graph_calls: frozenset[str] = frozenset()) -> ir.Node:
  """`node` with each `ir.Graph` that contains a `RuleRef` rewritten as Concat/Union/Repeat.

  The grammar analyses (`_grammar._nullable`, `_productive`, `_left_references`) read a
  graph as one opaque symbol that consumes input, so a rule reference must not hide in
  one (`separated` arrays of a recursive item, `_members` with a recursive additional
  property). Graphs without references stay as they are, and so do graphs that only
  call rules in `graph_calls` and whose start is not final: rules that derive no empty
  string and never call back (the free-form value rule), for which that reading is
  exact. State elimination could turn such a graph (an any-order object whose extra
  values are calls: 66 states) into millions of IR nodes; the push-down builder compiles
  a graph's arcs, calls included, as it compiles expressions.
  """
  refs: dict = {}

  def rewrite(n: ir.Node) -> ir.Node:
    # Only nodes above a reference get here (see `before`); they are simplified anew.
    match n:
      case ir.Graph(num_states, arcs, finals):
        return _graph_expression(num_states, list(arcs), finals)
      case ir.Concat(parts):
        return _grammar.concat(*parts)
      case ir.Union(alternatives):
        return ir.union(*alternatives)
      case ir.Repeat(body, lo, hi):
        return _grammar.repeat(body, lo, hi)
    return n

  def before(n: ir.Node) -> ir.Node | None:
    if not has_rule_ref(n, refs):
      return n
    if (isinstance(n, ir.Graph) and graph_calls and 0 not in n.finals
        and set(_grammar.references(n)) <= graph_calls):
      return n
    return None

  return ir.transform(node, rewrite, before=before, memo=memo)


def _graph_expression(num_states: int, arcs: list, finals) -> ir.Node:
  """The language of an `ir.Graph` as one expression, by state elimination.

  States go in order of fewest (incoming x outgoing) arcs, which for the small graphs
  of `separated` and `_members` writes each label at most twice.
  """
  start, final = num_states, num_states + 1
  edges: dict[tuple[int, int], ir.Node] = {}

  def add(source: int, target: int, label: ir.Node) -> None:
    old = edges.get((source, target))
    edges[(source, target)] = label if old is None else ir.union(old, label)

  add(start, 0, ir.EPSILON)
  for source, label, target in arcs:
    add(source, target, label)
  for state in finals:
    add(state, final, ir.EPSILON)
  remaining = set(range(num_states))
  while remaining:
    def cost(q: int) -> tuple[int, int]:
      ins = sum(1 for s, t in edges if t == q and s != q)
      outs = sum(1 for s, t in edges if s == q and t != q)
      return ins * outs, q
    k = min(remaining, key=cost)
    remaining.discard(k)
    loop = edges.pop((k, k), None)
    middle = ir.EPSILON if loop is None else _grammar.repeat(loop, 0, None)
    incoming = [(s, edges.pop((s, t))) for s, t in list(edges) if t == k]
    outgoing = [(t, edges.pop((s, t))) for s, t in list(edges) if s == k]
    for source, before in incoming:
      for target, after in outgoing:
        add(source, target, _grammar.concat(before, middle, after))
  return edges.get((start, final), ir.NOTHING)
