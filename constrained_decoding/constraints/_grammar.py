"""Grammars over the constraint IR: the model, its analyses, and lowering to regular IR.

A grammar is a start rule plus named rules whose bodies are IR nodes that may contain
`RuleRef(name)`. The front ends (`_gbnf.py`, `_lark.py`) build a `GrammarIR` as written;
`normalize` then rewrites it so that only true recursion is left, which is all the
push-down runtime needs a stack for (Alg. 3; DESIGN.md "non-recursive rules are inlined
first"). Without recursion the grammar is regular and lowers to one IR node; with it,
`unroll` bounds the recursion depth and returns a regular IR node as well.

Public:
  GrammarIR                              a frozen, hashable grammar: start + rules.
  SourceText(text)                       offsets -> (line, column), for front-end errors.
  references(node)                       names of the rules an IR node references.
  substitute(node, replace)              an IR node with its rule references replaced.
  rebuild_simplified(node, children)     `ir.rebuild` simplifying with `concat`/`repeat`
                                         (a `build` for `ir.transform`).
  concat(*parts), repeat(node, lo, hi)   `ir.concat` / `ir.repeat`, also simplifying
                                         the empty string and the empty language.
  tree_size(node)                        size of an IR node as a tree (what automata see).
  reference_graph(grammar)               rule -> rules its body references.
  strongly_connected_components(graph)   SCCs of a graph, dependencies first (Tarjan).
  recursive_rules(grammar)               rules on a cycle of the reference graph.
  reachable_rules(grammar)               rules reachable from the start rule.
  nullable_rules(grammar)                rules that derive the empty string.
  productive_rules(grammar)              rules that derive at least one finite string.
  left_recursive_cycle(grammar)          one left-recursive cycle of rules, or None.
  prune_unreachable(grammar)             drops the rules the start rule cannot reach.
  remove_unproductive(grammar)           drops the rules that derive no finite string.
  inline_nonrecursive(grammar)           substitutes every non-recursive rule but the start.
  collapse_recursion(grammar)            inlines recursive rules into each other while
                                         a cycle can do without them.
  eliminate_left_recursion(grammar)      A -> A x | y  becomes  A -> y x*.
  normalize(grammar)                     all of the above, with the errors they imply.
  to_regular, min_depth, unroll, sample_text   lowering by recursion depth, re-exported
                                         from `_grammar_depth.py` (see there).
"""

import dataclasses
import functools
import weakref

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir

# Inlining a rule copies its body into every reference; beyond this many IR nodes in
# total (body size x references) `collapse_recursion` keeps the rule instead.
_MAX_INLINE_SIZE = 20_000


@dataclasses.dataclass(frozen=True)
class GrammarIR:
  """A context-free grammar whose rule bodies are constraint IR nodes.

  ```python
  g = GrammarIR("root", (
      ("root", ir.union(ir.Bytes(b"x"), ir.concat(ir.Bytes(b"("), ir.RuleRef("root"),
                                                   ir.Bytes(b")")))),))
  recursive_rules(g)  # frozenset({'root'})
  ```

  Rules are a tuple of `(name, body)` pairs, not a dict, so that the grammar is hashable
  and can be a cache key, like every spec. Bodies use `RuleRef(name)` for non-terminals;
  terminals are already lowered to bytes and classes by the front end.

  Attributes:
    start: Name of the start rule.
    rules: `(name, body)` pairs with unique names, in definition order.
  """

  start: str
  rules: tuple[tuple[str, ir.Node], ...]

  def __post_init__(self):
    names = [name for name, _ in self.rules]
    if len(set(names)) != len(names):
      twice = sorted({n for n in names if names.count(n) > 1})
      raise errors.GrammarError(
          f"Grammar rules {twice} are defined more than once. Expected unique rule names."
          " Merge the definitions into one rule with alternatives."
      )
    if self.start not in names:
      raise errors.GrammarError(
          f"Grammar start rule {self.start!r} is not defined. Expected one of"
          f" {_preview(names)}. Define the rule or choose another start rule."
      )
    defined = set(names)
    for name, body in self.rules:
      for ref in references(body):
        if ref not in defined:
          raise errors.GrammarError(
              f"Grammar rule {name!r} references the undefined rule {ref!r}. Expected one"
              f" of {_preview(names)}. Define {ref!r} or fix the reference."
          )

  @functools.cached_property
  def rule_map(self) -> dict[str, ir.Node]:
    """The rules as a dict (computed once; do not mutate)."""
    return dict(self.rules)

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(name for name, _ in self.rules)

  def __getitem__(self, name: str) -> ir.Node:
    return self.rule_map[name]

  def replace_rules(self, rules: dict[str, ir.Node]) -> "GrammarIR":
    """The same start rule with `rules` (a dict, in the order to keep)."""
    return GrammarIR(self.start, tuple(rules.items()))


def _preview(names, limit: int = 8) -> str:
  names = list(names)
  shown = ", ".join(repr(n) for n in names[:limit])
  return f"[{shown}{', ...' if len(names) > limit else ''}]"


class SourceText:
  """Maps character offsets of a grammar source to 1-based (line, column) positions."""

  def __init__(self, text: str):
    self.text = text

  def position(self, offset: int) -> tuple[int, int]:
    line = self.text.count("\n", 0, offset) + 1
    column = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
    return line, column

  def excerpt(self, offset: int) -> str:
    """The source line containing `offset` and a caret under it, for error messages."""
    start = self.text.rfind("\n", 0, offset) + 1
    end = self.text.find("\n", offset)
    line = self.text[start:end if end >= 0 else len(self.text)]
    return f"\n  {line}\n  {' ' * (offset - start)}^"


# ---------------------------------------------------------------------------------------
# Walking IR nodes.


# node -> `references(node)`, for nodes passed to `references` (rule bodies): the grammar
# passes ask again and again for the same bodies, which `substitute` returns unchanged.
# Weak keys: an entry lives as long as its node.
_REFERENCES: "weakref.WeakKeyDictionary[ir.Node, tuple[str, ...]]" = weakref.WeakKeyDictionary()


def references(node: ir.Node) -> tuple[str, ...]:
  """The rule names `node` references, each once, in first-occurrence order.

  Memoized per node (`_REFERENCES`); a sub-node already answered adds its answer in
  place of a walk of its sub-tree (the same names in the same order: first occurrences
  in a pre-order walk).
  """
  cached = _REFERENCES.get(node)
  if cached is not None:
    return cached
  found: dict[str, None] = {}
  seen: set[int] = set()
  stack = [node]
  while stack:
    n = stack.pop()
    if id(n) in seen:
      continue
    seen.add(id(n))
    if isinstance(n, ir.RuleRef):
      found.setdefault(n.name)
      continue
    kids = ir.children(n)
    known = _REFERENCES.get(n) if kids and n is not node else None
    if known is not None:
      found.update(dict.fromkeys(known))
    else:
      stack.extend(reversed(kids))
  result = tuple(found)
  _REFERENCES[node] = result
  return result


def concat(*parts: ir.Node) -> ir.Node:
  """`ir.concat` that returns `EPSILON` (not an empty `Concat`) for no parts."""
  node = ir.concat(*parts)
  return ir.EPSILON if node == ir.Concat(()) else node


def repeat(node: ir.Node, min_count: int, max_count: int | None) -> ir.Node:
  """`ir.repeat` that also simplifies the empty language: NOTHING{0,n} is the empty string."""
  if node == ir.NOTHING:
    return ir.EPSILON if min_count == 0 else ir.NOTHING
  return ir.repeat(node, min_count, max_count)


def substitute(node: ir.Node, replace) -> ir.Node:
  """`node` with every `RuleRef(name)` replaced by `replace(name)` (a node), simplified.

  Simplified: the empty language (`NOTHING`, empty classes) is propagated through
  concatenations, unions and repeats. Shared sub-nodes are rewritten once, so the result
  shares them too, and unchanged sub-nodes are returned as they are (so that comparing
  a rewritten grammar with the original is mostly identity checks). Graph arcs are
  rewritten too; fragments are left as they are.
  """

  def leaf(n: ir.Node) -> ir.Node | None:
    # Top-down, so that a replacement is never itself looked at again.
    if isinstance(n, ir.RuleRef):
      out = replace(n.name)
      return n if out == n else out
    return ir.NOTHING if _is_empty_class(n) else None

  return ir.transform(node, before=leaf, build=rebuild_simplified)


def rebuild_simplified(node: ir.Node, new_children) -> ir.Node:
  """`ir.rebuild_simplified` with this module's `concat` and `repeat`."""
  return ir.rebuild_simplified(node, new_children, make_concat=concat, make_repeat=repeat)


def tree_size(node: ir.Node) -> int:
  """Number of nodes of `node` as a tree (shared sub-nodes counted at every use).

  A graph or a fragment counts as one node, whatever its labels or body: the inlining
  heuristics that read this size were tuned so.
  """
  memo: dict[int, int] = {}

  def walk(n: ir.Node) -> int:
    if id(n) not in memo:
      opaque = isinstance(n, (ir.Graph, ir.Fragment))
      memo[id(n)] = 1 + (0 if opaque else sum(walk(c) for c in ir.children(n)))
    return memo[id(n)]

  return walk(node)


def _is_empty_class(node: ir.Node) -> bool:
  return isinstance(node, (ir.CharClass, ir.ByteClass)) and not node.ranges


# ---------------------------------------------------------------------------------------
# Graph analyses.


def reference_graph(grammar: GrammarIR) -> dict[str, tuple[str, ...]]:
  """Each rule -> the rules its body references."""
  return {name: references(body) for name, body in grammar.rules}


def strongly_connected_components(graph: dict[str, tuple[str, ...]]) -> list[tuple[str, ...]]:
  """Tarjan's SCCs of `graph`, in reverse topological order (a component's successors
  come before it), each listed in the graph's key order. Iterative: no recursion limit."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  on_stack: set[str] = set()
  stack: list[str] = []
  components: list[tuple[str, ...]] = []
  order = {name: i for i, name in enumerate(graph)}
  for root in graph:
    if root in index:
      continue
    work = [(root, iter(graph[root]))]
    index[root] = low[root] = len(index)
    stack.append(root)
    on_stack.add(root)
    while work:
      node, successors = work[-1]
      advanced = False
      for succ in successors:
        if succ not in index:
          index[succ] = low[succ] = len(index)
          stack.append(succ)
          on_stack.add(succ)
          work.append((succ, iter(graph[succ])))
          advanced = True
          break
        if succ in on_stack:
          low[node] = min(low[node], index[succ])
      if advanced:
        continue
      work.pop()
      if work:
        parent = work[-1][0]
        low[parent] = min(low[parent], low[node])
      if low[node] == index[node]:
        members = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          members.append(member)
          if member == node:
            break
        components.append(tuple(sorted(members, key=order.__getitem__)))
  return components


def _cyclic(component: tuple[str, ...], graph: dict[str, tuple[str, ...]]) -> bool:
  return len(component) > 1 or component[0] in graph[component[0]]


def recursive_rules(grammar: GrammarIR) -> frozenset[str]:
  """Rules that lie on a cycle of the reference graph (so derive themselves)."""
  graph = reference_graph(grammar)
  return frozenset(
      name
      for component in strongly_connected_components(graph)
      if _cyclic(component, graph)
      for name in component
  )


def reachable_rules(grammar: GrammarIR) -> frozenset[str]:
  """Rules reachable from the start rule (the start included)."""
  graph = reference_graph(grammar)
  seen = {grammar.start}
  stack = [grammar.start]
  while stack:
    for succ in graph[stack.pop()]:
      if succ not in seen:
        seen.add(succ)
        stack.append(succ)
  return frozenset(seen)


def _memoized(function):
  """Memoizes `function(node, names, memo)` by node identity within one `memo` dict.

  Rule bodies are DAGs after inlining (a rule's body is shared by all its uses), so an
  unmemoized walk would take time proportional to the tree, which can be exponential.
  """

  def wrapper(node: ir.Node, names, memo: dict):
    hit = memo.get(id(node))
    if hit is None:
      hit = memo[id(node)] = (node, function(node, names, memo))  # Keeps `node` alive.
    return hit[1]

  return wrapper


def _fixpoint(grammar: GrammarIR, holds) -> frozenset[str]:
  """Least set S of rules with `holds(body, S, memo)` for each member (monotone `holds`)."""
  found: set[str] = set()
  changed = True
  while changed:
    changed = False
    memo: dict = {}  # Valid while `found` is fixed; stale answers only delay the fixpoint.
    for name, body in grammar.rules:
      if name not in found and holds(body, frozenset(found), memo):
        found.add(name)
        changed = True
        memo = {}
  return frozenset(found)


@_memoized
def _nullable(node: ir.Node, nullable_names, memo) -> bool:
  """Whether the empty string is in the language of `node`."""
  if isinstance(node, ir.Bytes):
    return not node.data
  if isinstance(node, ir.Concat):
    return all(_nullable(p, nullable_names, memo) for p in node.parts)
  if isinstance(node, ir.Union):
    return any(_nullable(a, nullable_names, memo) for a in node.alternatives)
  if isinstance(node, ir.Repeat):
    return node.min == 0 or _nullable(node.node, nullable_names, memo)
  if isinstance(node, ir.RuleRef):
    return node.name in nullable_names
  return False  # Classes and terminals consume input.


@_memoized
def _productive(node: ir.Node, productive_names, memo) -> bool:
  """Whether `node` derives at least one finite string."""
  if isinstance(node, ir.Concat):
    return all(_productive(p, productive_names, memo) for p in node.parts)
  if isinstance(node, ir.Union):
    return any(_productive(a, productive_names, memo) for a in node.alternatives)
  if isinstance(node, ir.Repeat):
    return node.min == 0 or _productive(node.node, productive_names, memo)
  if isinstance(node, ir.RuleRef):
    return node.name in productive_names
  return not _is_empty_class(node)


def nullable_rules(grammar: GrammarIR) -> frozenset[str]:
  """Rules that derive the empty string."""
  return _fixpoint(grammar, _nullable)


def productive_rules(grammar: GrammarIR) -> frozenset[str]:
  """Rules that derive at least one finite string (the others only recurse forever)."""
  return _fixpoint(grammar, _productive)


def _left_references(node: ir.Node, nullable_names, memo: dict, nullable_memo: dict):
  """Rules that can be the first symbol of `node` (after nullable prefixes)."""
  hit = memo.get(id(node))
  if hit is not None:
    return hit[1]
  found: frozenset[str] = frozenset()
  if isinstance(node, ir.RuleRef):
    found = frozenset((node.name,))
  elif isinstance(node, ir.Concat):
    for part in node.parts:
      found |= _left_references(part, nullable_names, memo, nullable_memo)
      if not _nullable(part, nullable_names, nullable_memo):
        break
  elif isinstance(node, ir.Union):
    for alternative in node.alternatives:
      found |= _left_references(alternative, nullable_names, memo, nullable_memo)
  elif isinstance(node, ir.Repeat) and node.max != 0:
    found = _left_references(node.node, nullable_names, memo, nullable_memo)
  memo[id(node)] = (node, found)
  return found


def left_recursive_cycle(grammar: GrammarIR) -> tuple[str, ...] | None:
  """One cycle `(a, b, ..., a)` of rules each starting with the next, or None.

  A rule is left-recursive when it can derive a string of symbols starting with itself
  (directly, through other rules, or after nullable symbols). A top-down parser, and so
  a push-down automaton built from the rules (Alg. 3), would recurse forever on it.
  """
  nullable_names = nullable_rules(grammar)
  memo, nullable_memo = {}, {}
  graph = {name: tuple(sorted(_left_references(body, nullable_names, memo, nullable_memo)))
           for name, body in grammar.rules}
  for component in strongly_connected_components(graph):
    if _cyclic(component, graph):
      return _cycle_through(component[0], set(component), graph)
  return None


def _cycle_through(first: str, members: set[str], graph) -> tuple[str, ...]:
  """A shortest path first -> ... -> first inside `members` (BFS)."""
  parents = {first: None}
  queue = [first]
  for node in queue:
    for succ in graph[node]:
      if succ == first:
        path = [node]
        while parents[path[-1]] is not None:
          path.append(parents[path[-1]])
        return (first, *reversed(path[:-1]), first) if len(path) > 1 else (first, first)
      if succ in members and succ not in parents:
        parents[succ] = node
        queue.append(succ)
  raise ValueError(f"Expected a cycle through {first!r}, found none.")


# ---------------------------------------------------------------------------------------
# Rewrites. Each returns a new GrammarIR with the same language.


def _inline(rules: dict[str, ir.Node], names) -> dict[str, ir.Node]:
  """Substitutes the bodies of `names` (acyclic among themselves) everywhere; drops them."""
  names = set(names)
  resolved: dict[str, ir.Node] = {}

  def body_of(name: str) -> ir.Node:
    if name not in resolved:
      resolved[name] = substitute(rules[name], replace)
    return resolved[name]

  def replace(name: str) -> ir.Node:
    return body_of(name) if name in names else ir.RuleRef(name)

  return {name: substitute(body, replace) for name, body in rules.items() if name not in names}


def prune_unreachable(grammar: GrammarIR) -> GrammarIR:
  """Drops the rules the start rule cannot reach (they cannot affect the language)."""
  keep = reachable_rules(grammar)
  return grammar.replace_rules({n: b for n, b in grammar.rules if n in keep})


def remove_unproductive(grammar: GrammarIR) -> GrammarIR:
  """Replaces references to rules without finite strings by the empty language.

  Raises:
    EmptyConstraintError: The start rule itself derives no finite string.
  """
  productive = productive_rules(grammar)
  dead = [name for name in grammar.names if name not in productive]
  if grammar.start in dead:
    raise errors.EmptyConstraintError(
        f"Grammar start rule {grammar.start!r} derives no finite string: rules"
        f" {_preview(dead)} only recurse, without an alternative that ends. Expected every"
        " recursive rule to have a non-recursive alternative. Add a base case."
    )
  dead_set = set(dead)
  rules = {name: substitute(body, lambda r: ir.NOTHING if r in dead_set else ir.RuleRef(r))
           for name, body in grammar.rules if name not in dead_set}
  return prune_unreachable(grammar.replace_rules(rules))


def inline_nonrecursive(grammar: GrammarIR, keep=frozenset()) -> GrammarIR:
  """Substitutes every rule that is not recursive, except the start rule and `keep`,
  into its users."""
  recursive = recursive_rules(grammar)
  names = [n for n in grammar.names
           if n not in recursive and n != grammar.start and n not in keep]
  if not names:
    return grammar
  return grammar.replace_rules(_inline(grammar.rule_map, names))


def collapse_recursion(grammar: GrammarIR) -> GrammarIR:
  """Inlines recursive rules into each other until every cycle keeps few rules.

  In a strongly connected component of rules, a rule that does not reference itself can
  be substituted into the others without changing the language; repeating this leaves
  the rules that close a cycle on their own (JSON keeps `value` out of `value`, `object`,
  `member`, `array`). Candidates with the fewest references from their component go
  first; the start rule is kept, and so is a rule whose inlining would copy more than
  `_MAX_INLINE_SIZE` IR nodes.
  """
  rules = dict(grammar.rules)
  skipped: set[str] = set()
  while True:
    graph = {name: references(body) for name, body in rules.items()}
    pick = _collapse_candidate(grammar.start, rules, graph, skipped)
    if pick is None:
      return grammar.replace_rules(rules)
    rules = _inline(rules, [pick])


def _collapse_candidate(start, rules, graph, skipped) -> str | None:
  for component in strongly_connected_components(graph):
    if not _cyclic(component, graph):
      continue
    members = set(component)
    candidates = []
    for name in component:
      if name == start or name in graph[name] or name in skipped:
        continue
      users = [u for u in graph if name in graph[u]]
      cost = tree_size(rules[name]) * len(users)
      if cost > _MAX_INLINE_SIZE:
        skipped.add(name)
        continue
      in_component = sum(1 for u in users if u in members)
      candidates.append((in_component, tree_size(rules[name]), name))
    if candidates:
      return min(candidates)[2]
  return None


def _split_left(node: ir.Node, name: str) -> tuple[list[ir.Node], ir.Node]:
  """Splits `node` into `name x1 | name x2 | ... | rest`: returns ([x1, x2, ...], rest).

  Only leading `RuleRef(name)`s reachable through unions, the first part of
  concatenations and the first copy of repeats are split off; `rest` may still start
  with `name` after a nullable prefix, which `left_recursive_cycle` reports.
  """
  if isinstance(node, ir.RuleRef) and node.name == name:
    return [ir.EPSILON], ir.NOTHING
  if isinstance(node, ir.Union):
    suffixes, rests = [], []
    for alternative in node.alternatives:
      s, r = _split_left(alternative, name)
      suffixes += s
      rests.append(r)
    return (suffixes, ir.union(*rests)) if suffixes else ([], node)
  if isinstance(node, ir.Concat):
    s, r = _split_left(node.parts[0], name)
    if not s:
      return [], node
    tail = concat(*node.parts[1:])
    return [concat(x, tail) for x in s], concat(r, tail)
  if isinstance(node, ir.Repeat) and node.max != 0:
    s, r = _split_left(node.node, name)
    if not s:
      return [], node
    # x{m,n} = x x{m-1,n-1} (and the empty string too when m == 0).
    later = repeat(node.node, max(node.min - 1, 0), None if node.max is None else node.max - 1)
    rest = concat(r, later)
    if node.min == 0:
      rest = ir.union(ir.EPSILON, rest)
    return [concat(x, later) for x in s], rest
  return [], node


def eliminate_left_recursion(grammar: GrammarIR) -> GrammarIR:
  """Rewrites immediate left recursion `A -> A x1 | ... | A xk | y` as `A -> y (x1|...|xk)*`.

  The rule's alternatives that start with the rule itself are found through unions,
  groups and repeats (`A -> (A "+" | B) C` is `A -> A "+" C | B C`). Other left
  recursion (through other rules, or after a nullable prefix) is left as is.
  """
  rules = {}
  for name, body in grammar.rules:
    suffixes, rest = _split_left(body, name)
    if suffixes:
      body = concat(rest, repeat(ir.union(*suffixes), 0, None))
    rules[name] = body
  return grammar.replace_rules(rules)


def normalize(grammar: GrammarIR, keep=frozenset()) -> GrammarIR:
  """The equivalent grammar in which only true recursion (and the rules in `keep`,
  called rather than copied though not recursive) is left as rules.

  Steps: drop unreachable rules; drop rules without finite strings; then until nothing
  changes: inline non-recursive rules, collapse cycles (`collapse_recursion`), eliminate
  immediate left recursion. Afterwards every rule except the start is recursive and none
  is left-recursive, and a grammar without recursion is a single start rule without
  references.

  Raises:
    EmptyConstraintError: The grammar derives no finite string.
    GrammarRecursionError: Left recursion remains that is not of the immediate form
      (it names the rules of one cycle).
  """
  grammar = remove_unproductive(prune_unreachable(grammar))
  while True:
    before = grammar
    grammar = collapse_recursion(inline_nonrecursive(grammar, keep))
    grammar = prune_unreachable(eliminate_left_recursion(grammar))
    if grammar == before:
      break
  cycle = left_recursive_cycle(grammar)
  if cycle is not None:
    path = " -> ".join(repr(n) for n in cycle)
    raise errors.GrammarRecursionError(
        f"Grammar rules {path} are left-recursive: each can start with the next, so a"
        " top-down push-down automaton would recurse forever. Expected left recursion only"
        " in the immediate form `a ::= a x | y`, which is rewritten as `y x*`. Rewrite the"
        " rules with repetition (e.g. `a ::= y x*`) or move the recursion to the right."
    )
  return grammar

