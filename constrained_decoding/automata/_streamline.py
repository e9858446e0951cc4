"""Streamlining a token-level push-down automaton: drop the edge groups no stack reaches.

Adapted from mask-store streamlining (paper 004) to the edge groups of `TokenPda`. The
paper keeps masks per (lexer state, terminal sequence) and asks which are never legal,
always legal, or jointly legal; here a group is (state, pop sequence) and the question
is which stacks can occur in a state.

* Never-legal groups. A bigram abstraction of the reachable stacks, computed as a least
  fixpoint over the edges: `tops[q]`, the symbols that can be on top in state q (BOTTOM
  for an empty stack), and `below[x]`, the symbols that can lie directly under x. It
  over-approximates every reachable (state, stack): each transition's effect is applied
  to the abstraction of its source. A group whose pop sequence is not a chain of it
  (`p1` in `tops[q]`, `p2` in `below[p1]`, ...) never matches and is removed with its
  edges, as are the pop groups and edges of states nothing reaches. Exact: no reachable
  configuration loses an edge.
* Always-legal groups are merged into their state's mask rows by `_packing.pack_pda_tables`:
  whenever a group matches, so does every group of its state that pops a prefix of its
  pops, so one mask row per group (its own tokens and its prefixes') makes the runtime's
  mask one gather per row instead of one per group.
* Interchangeable stack symbols would have identical futures; stack symbols are return
  addresses, states of per-rule minimal DFAs, so two with equal futures in one rule are
  already one state. Not searched across rules (see the README's grammar section).

Public:
  StreamlineReport                 groups and edges before and after.
  stack_abstraction(token_pda)     (tops, below) of the reachable stacks.
  streamline(token_pda)            (TokenPda without never-legal groups, report).
"""

import dataclasses

import numpy as np

BOTTOM = -1  # The "symbol" under the bottom of the stack (an empty stack's top).


@dataclasses.dataclass(frozen=True)
class StreamlineReport:
  """What `streamline` removed.

  Attributes:
    groups_before, groups_after: Edge groups.
    edges_before, edges_after: Explicit token edges.
    unreachable_states: States no configuration reaches (their groups lose their edges).
  """

  groups_before: int
  groups_after: int
  edges_before: int
  edges_after: int
  unreachable_states: int


def _pop_sequences(token_pda) -> list[tuple[int, ...]]:
  return [tuple(int(x) for x in row[:n])
          for row, n in zip(token_pda.group_pops, token_pda.group_num_pops)]


def _revealed(popped: tuple[int, ...], top: set, below: dict) -> set:
  """Symbols that can be on top after `popped` is popped from a stack abstracted by
  (top, below); empty if the pops are not a chain of the abstraction."""
  if not popped:
    return top
  if popped[0] not in top:
    return set()
  for upper, lower in zip(popped, popped[1:]):
    if lower not in below.get(upper, ()):
      return set()
  return below.get(popped[-1], set())


def stack_abstraction(token_pda) -> tuple[list[set], dict[int, set]]:
  """Least (tops, below) closed under the automaton's edges, from an empty stack.

  Returns:
    tops: Per state, the symbols that can be on top of the stack there (BOTTOM: empty).
    below: Per stack symbol, the symbols that can lie directly under it (BOTTOM: none).
  """
  pops = _pop_sequences(token_pda)
  pushes = [tuple(int(x) for x in row[:n])
            for row, n in zip(token_pda.push_symbols, token_pda.push_lengths)]
  # Each group's distinct (push row, target) pairs: the moves its edges make.
  shift = max(int(token_pda.num_states), len(pushes), 1).bit_length()
  moves = np.sort((token_pda.edge_group.astype(np.int64) << (2 * shift))
                  | (token_pda.edge_push.astype(np.int64) << shift)
                  | token_pda.edge_target.astype(np.int64))
  moves = moves[np.diff(moves, prepend=-1) != 0]  # np.unique hashes: ~10x slower.
  mask = (1 << shift) - 1
  moves_of_group: dict[int, list[tuple[int, int]]] = {}
  for move in moves.tolist():
    moves_of_group.setdefault(move >> (2 * shift), []).append(
        ((move >> shift) & mask, move & mask))
  groups_of_state: dict[int, list[int]] = {}
  for group, state in enumerate(token_pda.group_state.tolist()):
    groups_of_state.setdefault(state, []).append(group)
  terminal_of = {q: int(t) for q, t in enumerate(token_pda.terminal_target.tolist())
                 if token_pda.state_terminal[q] >= 0}

  tops: list[set] = [set() for _ in range(token_pda.num_states)]
  below: dict[int, set] = {}
  tops[token_pda.start].add(BOTTOM)
  dirty = {token_pda.start}

  def grow(target: set, items) -> bool:
    size = len(target)
    target.update(items)
    return len(target) != size

  while dirty:
    # Re-examine every state whose tops grew, and (below changes) every state with pops.
    state = dirty.pop()
    changed_below = False
    targets_grown = set()
    for group in groups_of_state.get(state, ()):
      revealed = _revealed(pops[group], tops[state], below)
      if not revealed:
        continue
      for push, target in moves_of_group.get(group, ()):
        pushed = pushes[push]
        if not pushed:
          if grow(tops[target], revealed):
            targets_grown.add(target)
          continue
        changed_below |= grow(below.setdefault(pushed[0], set()), revealed)
        for lower, upper in zip(pushed, pushed[1:]):
          changed_below |= grow(below.setdefault(upper, set()), (lower,))
        if grow(tops[target], (pushed[-1],)):
          targets_grown.add(target)
    if state in terminal_of and grow(tops[terminal_of[state]], tops[state]):
      targets_grown.add(terminal_of[state])
    dirty |= targets_grown
    if changed_below:  # Chains through `below` may now match anywhere.
      dirty |= {q for q in range(token_pda.num_states) if tops[q]}
  return tops, below


def streamline(token_pda):
  """The automaton without its never-legal groups and unreachable states' edges.

  Every state keeps its pop-free group (possibly without edges): it carries the state's
  terminal bits, and the tables' invariants expect it.
  """
  tops, below = stack_abstraction(token_pda)
  pops = _pop_sequences(token_pda)
  keep = np.array([
      (not popped and bool(tops[state])) or bool(_revealed(popped, tops[state], below))
      for state, popped in zip(token_pda.group_state.tolist(), pops)], bool)
  keep_group = keep | (token_pda.group_num_pops == 0)
  keep_edge = keep[token_pda.edge_group]
  new_id = np.cumsum(keep_group) - 1
  report = StreamlineReport(
      groups_before=len(keep), groups_after=int(keep_group.sum()),
      edges_before=len(keep_edge), edges_after=int(keep_edge.sum()),
      unreachable_states=sum(1 for t in tops if not t))
  streamlined = dataclasses.replace(
      token_pda,
      group_state=token_pda.group_state[keep_group],
      group_pops=token_pda.group_pops[keep_group],
      group_num_pops=token_pda.group_num_pops[keep_group],
      edge_group=new_id[token_pda.edge_group[keep_edge]].astype(np.int32),
      edge_token=token_pda.edge_token[keep_edge],
      edge_target=token_pda.edge_target[keep_edge],
      edge_push=token_pda.edge_push[keep_edge],
      guards=None if token_pda.guards is None else dataclasses.replace(
          token_pda.guards, edge_guard=token_pda.guards.edge_guard[keep_edge]))
  return streamlined, report
