"""Recursion depth of grammars: lowering a normalized grammar to regular IR.

A normalized grammar (`_grammar.normalize`) keeps only true recursion as rules. Without
recursion it lowers to one IR node (`to_regular`); with it, `unroll` bounds the depth of
the recursion and returns a regular IR node as well. `sample_text` draws random strings
of a bounded depth, a test oracle independent of the automata.

Public (callers import this module; it builds on `_grammar.py`, which does not import it):
  to_regular(grammar)                    the IR of a normalized grammar without recursion.
  min_depth(grammar)                     least recursion depth of any string, or None.
  unroll(grammar, max_depth)             regular IR of the strings of depth <= max_depth.
  sample_text(grammar, rng, max_depth=)  a random string of the grammar (a test oracle).

Recursion depth. After `normalize`, every rule except possibly the start is recursive.
The depth of a derivation is the largest number of recursive rules active at once along
any path of its tree (a recursive start rule counts as one): the stack depth a push-down
automaton would need. `unroll(g, n)` accepts exactly the strings with a derivation of
depth <= n; at the cut, alternatives that would recurse deeper are dropped.
"""

import random

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints._grammar import GrammarIR
from constrained_decoding.constraints._grammar import _inline
from constrained_decoding.constraints._grammar import _is_empty_class
from constrained_decoding.constraints._grammar import _preview
from constrained_decoding.constraints._grammar import recursive_rules
from constrained_decoding.constraints._grammar import substitute
from constrained_decoding.constraints._grammar import tree_size

# `unroll` refuses results larger than this many IR nodes (as a tree, which is what the
# byte automaton is built from): some ten seconds of automaton construction.
_MAX_UNROLLED_SIZE = 1_000_000
# `sample_text`: an unbounded repeat draws between min and min + this many copies.
_SAMPLE_EXTRA_REPEATS = 3
_UNBOUNDED = float("inf")


# ---------------------------------------------------------------------------------------
# Lowering to regular IR.


def to_regular(grammar: GrammarIR) -> ir.Node:
  """The IR of a normalized grammar that has no recursion left.

  Raises:
    UnsupportedFeatureError: The grammar is recursive (not regular).
  """
  recursive = recursive_rules(grammar)
  if recursive:
    raise errors.UnsupportedFeatureError(
        f"Grammar rules {_preview(sorted(recursive))} are recursive, so the grammar is not"
        " regular. Expected a grammar without recursion, or a depth bound. Pass"
        " Grammar(..., max_depth=N) to unroll the recursion N levels deep, or compile the"
        " Grammar with cd.Compiler, which builds a push-down runtime for it."
    )
  rules = _inline(grammar.rule_map, [n for n in grammar.names if n != grammar.start])
  return rules[grammar.start]


def _depth_costs(grammar: GrammarIR, recursive) -> dict[str, int | float]:
  """Rule -> least depth of a string of its body (+1 for a recursive rule itself)."""
  cost = {name: _UNBOUNDED for name in grammar.names}
  changed = True
  while changed:
    changed = False
    for name, body in grammar.rules:
      value = _node_depth(body, cost, {}) + (1 if name in recursive else 0)
      if value < cost[name]:
        cost[name] = value
        changed = True
  return cost


def _node_depth(node: ir.Node, rule_cost, memo) -> int | float:
  """Least depth of a string of `node`, given the rules' least depths (inf: none)."""
  key = id(node)
  if key in memo:
    return memo[key][1]
  if isinstance(node, ir.RuleRef):
    value = rule_cost[node.name]
  elif isinstance(node, ir.Concat):
    value = max((_node_depth(p, rule_cost, memo) for p in node.parts), default=0)
  elif isinstance(node, ir.Union):
    value = min((_node_depth(a, rule_cost, memo) for a in node.alternatives),
                default=_UNBOUNDED)
  elif isinstance(node, ir.Repeat):
    value = 0 if node.min == 0 else _node_depth(node.node, rule_cost, memo)
  else:
    value = _UNBOUNDED if _is_empty_class(node) else 0
  memo[key] = (node, value)
  return value


def min_depth(grammar: GrammarIR) -> int | None:
  """The least recursion depth (see the module docstring) of any string, None if none."""
  cost = _depth_costs(grammar, recursive_rules(grammar))[grammar.start]
  return None if cost == _UNBOUNDED else int(cost)


def unroll(grammar: GrammarIR, max_depth: int) -> ir.Node:
  """Regular IR of the strings whose derivation has recursion depth <= `max_depth`.

  Each reference to a recursive rule opens one more level; a reference that would
  exceed `max_depth` becomes the empty language, which drops the alternatives through
  it. Expansions are shared per (rule, level), so the result is a DAG of at most
  (rules x levels) expanded bodies, though the byte automaton still sees each use.

  Raises:
    GrammarRecursionError: No string has depth <= `max_depth`; names the least depth.
    CompileBudgetError: The unrolled IR has more than `_MAX_UNROLLED_SIZE` nodes.
  """
  recursive = recursive_rules(grammar)
  rules = grammar.rule_map
  memo: dict[tuple[str, int], ir.Node] = {}

  def expand(name: str, level: int) -> ir.Node:
    key = (name, level)
    if key not in memo:
      memo[key] = substitute(rules[name], lambda ref: reference(ref, level))
    return memo[key]

  def reference(name: str, level: int) -> ir.Node:
    if name not in recursive:
      return expand(name, level)
    return expand(name, level + 1) if level + 1 <= max_depth else ir.NOTHING

  node = reference(grammar.start, 0)
  if node == ir.NOTHING:
    least = min_depth(grammar)
    raise errors.GrammarRecursionError(
        f"Grammar max_depth={max_depth} leaves no string: the shallowest one needs"
        f" {least} nested recursive rules {_preview(sorted(recursive))}. Expected"
        f" max_depth >= {least}. Increase max_depth."
    )
  size = tree_size(node)
  if size > _MAX_UNROLLED_SIZE:
    raise errors.CompileBudgetError(
        f"Grammar max_depth={max_depth} unrolls to {size} IR nodes: each reference to a"
        f" recursive rule {_preview(sorted(recursive))} copies the rule's body at every"
        f" level. Expected at most {_MAX_UNROLLED_SIZE}. Lower max_depth, or reference the"
        " recursive rules from fewer places."
    )
  return node


# ---------------------------------------------------------------------------------------
# Random strings, for tests (an oracle independent of the automata).


def sample_text(grammar: GrammarIR, rng: random.Random, *, max_depth: int) -> bytes:
  """A random string of `grammar` whose derivation has recursion depth <= `max_depth`.

  Alternatives are drawn uniformly among those that fit the remaining depth; an
  unbounded repeat draws between min and min + 3 copies; a class draws one of its
  ranges uniformly, then a value in it. Every string of depth <= `max_depth` has a
  positive probability only up to those repeat counts: this is a test oracle, not a
  uniform sampler.

  Raises:
    ValueError: No string has depth <= `max_depth`, or the grammar has `Terminal`s.
  """
  recursive = recursive_rules(grammar)
  cost = _depth_costs(grammar, recursive)
  memo: dict = {}
  rules = grammar.rule_map

  def depth_of(node: ir.Node) -> int | float:
    return _node_depth(node, cost, memo)

  def sample(node: ir.Node, budget: int) -> bytes:
    if isinstance(node, ir.Bytes):
      return node.data
    if isinstance(node, ir.CharClass):
      lo, hi = rng.choice(node.ranges)
      return chr(rng.randint(lo, hi)).encode("utf-8")
    if isinstance(node, ir.ByteClass):
      lo, hi = rng.choice(node.ranges)
      return bytes([rng.randint(lo, hi)])
    if isinstance(node, ir.Concat):
      return b"".join(sample(p, budget) for p in node.parts)
    if isinstance(node, ir.Union):
      fits = [a for a in node.alternatives if depth_of(a) <= budget]
      return sample(rng.choice(fits), budget)
    if isinstance(node, ir.Repeat):
      if depth_of(node.node) > budget:
        return b""  # Only reached when node.min == 0.
      high = node.min + _SAMPLE_EXTRA_REPEATS if node.max is None else node.max
      return b"".join(sample(node.node, budget) for _ in range(rng.randint(node.min, high)))
    if isinstance(node, ir.RuleRef):
      if node.name in recursive:
        return sample(rules[node.name], budget - 1)
      return sample(rules[node.name], budget)
    raise ValueError(f"Expected a grammar over bytes and classes, got {node!r} instead.")

  if cost[grammar.start] > max_depth:
    raise ValueError(
        f"Grammar has no string of depth <= {max_depth}. Expected max_depth >="
        f" {cost[grammar.start]}. Increase max_depth."
    )
  return sample(ir.RuleRef(grammar.start), max_depth)
