"""Token-level composition: a byte DFA composed with the vocabulary trie (Alg. 2).

`A ∘ T_V` for the trie form of T_V, computed directly with numpy: for every byte-DFA
state q, walk the trie and the DFA in lockstep from (root, q); every trie node spelling
a token t reached in DFA state q' gives the token edge q --t--> q'. Because the byte DFA
is deterministic and each token has exactly one byte path, the result is already
deterministic in tokens, so Alg. 2's `DETERMINIZE` has nothing left to do. It is then
trimmed: only states reachable from the start at token boundaries and able to reach
acceptance are kept, so decoding can never be steered into a dead end.

Terminal edges (Sec. 2.5.1) carry a token bitmap instead of one edge per token. A state
may have several, in precedence order: first its wide-state terminal (`_wide.py`; exact,
its tokens never also have explicit edges), then one per token-class arc of the byte DFA
(`(?P<TEXT_TOKEN>)`, ...) in `ir.TOKEN_CLASSES` order. The runtime takes an explicit
edge when the token has one, else the first terminal edge whose bitmap holds it; so a
token-class terminal only gets the tokens nothing earlier claims.

Speed (the whole compile of a small JSON schema is a few milliseconds, most of it numpy
call overhead): the explicit edges of a wide state are read from its terminal's cached
`LoopExits` (the sub-trie pre-walked in the loop automaton) rather than walked, and only
the walks past the loop's exits are done here, together with the other states' walks in
one pass over the full trie; deep, narrow levels of that pass step in plain Python.

States of spliced fragment copies (`_splice.py`) come with their edges (`GivenEdges`):
they are not walked, only the walks leaving them (their exits) join the others.

Public names:
  compose_token_dfa(dfa, trie, ...)  -> TokenDfa
  token_edges(dfa, trie, ...)        -> the explicit edges, untrimmed (for fragments)
  GivenEdges                         edges of states known before composition
  walk_plan(wide, num_states, trie)  -> the trie walks that find every explicit edge
"""

import dataclasses
import time
import weakref
from collections.abc import Callable

import numpy as np

from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._detokenizer import VocabTrie
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.errors import CompileBudgetError


@dataclasses.dataclass(frozen=True, eq=False)
class TokenDfa:
  """A trimmed deterministic automaton over token ids.

  Attributes:
    num_states: Number of states; the start state is 0.
    accepting: bool `[S]`; end of sequence is allowed here.
    edge_source, edge_token, edge_target: int32 `[E]` explicit edges, sorted by
      (source, token).
    terminal_bits: uint32 `[T, W]`; token bitmaps of the terminal edges (distinct).
    state_terminals: int32 `[S, R, 2]` (R >= 1); the (terminal id, target) pairs of
      each state's terminal edges in precedence order, -1 padded.
    byte_state: int32 `[S]`; the byte-DFA state each state was made from (None where
      unknown), for `_registers.attach`.
  """

  num_states: int
  accepting: np.ndarray
  edge_source: np.ndarray
  edge_token: np.ndarray
  edge_target: np.ndarray
  terminal_bits: np.ndarray
  state_terminals: np.ndarray
  byte_state: np.ndarray | None = None


# A frontier of at most this many (node, state) pairs is stepped in plain Python: a
# numpy step costs ~25 us whatever its size, and the deep levels of a walk (the tails of
# long tokens) hold only a few pairs each.
_PY_FRONTIER = 24


# `_TrieViews.node_token` of a node spelling several tokens (ids with the same bytes).
_SEVERAL_TOKENS = -2

# A `stop_at` state no walk reaches.
_NEVER = 2**31 - 1


class _TrieViews:
  """Per-trie arrays for the walks: packed arrays for numpy steps (fewer gathers per
  level), memoryviews for Python steps.

  Indexing a memoryview gives a Python int (~40 ns), far cheaper than a numpy scalar.
  """

  def __init__(self, trie: VocabTrie):
    self.token_count = np.diff(trie.token_start).astype(np.int32)
    # One past the last child slot, and the number of children, of each node; int64,
    # which `np.repeat` takes as counts without a conversion.
    self.child_end = trie.child_start[1:].astype(np.int64)
    self.child_count = np.diff(trie.child_start).astype(np.int64)
    # Child node << 8 | edge byte per slot: one gather gives both.
    code_type = np.int32 if trie.num_nodes < 1 << 23 else np.int64
    self.slot_code = (trie.child_node.astype(code_type) << 8) | trie.child_byte
    self._arange = np.arange(1024, dtype=np.int32)
    # The token a node spells, -1 for none, `_SEVERAL_TOKENS` for more than one.
    self.node_token = np.full(trie.num_nodes, -1, np.int32)
    one = np.flatnonzero(self.token_count == 1)
    self.node_token[one] = trie.token_ids[trie.token_start[one]]
    self.node_token[self.token_count > 1] = _SEVERAL_TOKENS
    self.child_start = memoryview(np.ascontiguousarray(trie.child_start, np.int32))
    self.child_byte = memoryview(np.ascontiguousarray(trie.child_byte, np.uint8))
    self.child_node = memoryview(np.ascontiguousarray(trie.child_node, np.int32))
    self.token_start = memoryview(np.ascontiguousarray(trie.token_start, np.int32))
    self.token_ids = memoryview(np.ascontiguousarray(trie.token_ids, np.int32))
    lo, hi = trie.child_start[0], trie.child_start[1]
    # The root's child bytes (ascending) and child nodes.
    self.root_bytes = trie.child_byte[lo:hi].astype(np.int64)
    self.root_nodes = trie.child_node[lo:hi].astype(np.int32)
    # One more than the largest token id (bounds sort keys made of token ids).
    self.token_span = int(trie.token_ids.max()) + 1 if len(trie.token_ids) else 1

  def arange(self, n: int) -> np.ndarray:
    """`np.arange(n, dtype=np.int32)`, as a view of a kept array (grown when too short)."""
    if n > len(self._arange):
      self._arange = np.arange(2 * n, dtype=np.int32)
    return self._arange[:n]


_VIEWS: "weakref.WeakKeyDictionary[VocabTrie, _TrieViews]" = weakref.WeakKeyDictionary()


def _views(trie: VocabTrie) -> _TrieViews:
  views = _VIEWS.get(trie)
  if views is None:
    views = _VIEWS[trie] = _TrieViews(trie)
  return views


def _emit(trie: VocabTrie, views: _TrieViews, node, state, origin):
  """Token edges (origin, t, state) for every token t spelled by a frontier node."""
  token = views.node_token[node]
  hit = (token != -1).nonzero()[0]
  if not len(hit):
    return None
  token = token[hit]
  if token.min() >= 0:  # the common case: one token per byte string
    return origin[hit], token, state[hit]
  k_hit = views.token_count[node[hit]]
  rep = hit.repeat(k_hit)
  slot = (trie.token_start[node[hit]] - (k_hit.cumsum() - k_hit)).repeat(k_hit)
  return origin[rep], trie.token_ids[slot + views.arange(len(rep))], state[rep]


def _python_steps(views: _TrieViews, flat, node, state, origin, found: list,
                  stop_at: int = _NEVER, stopped: list | None = None):
  """Steps a small frontier in plain Python until it is empty or grows past a few
  times `_PY_FRONTIER`; appends the edges met to `found` (flat triples), and the pairs
  reaching states >= `stop_at` to `stopped` (not walked further).

  Returns:
    The remaining frontier (node, state, origin) as lists (empty when done).
  """
  child_start, child_byte, child_node = views.child_start, views.child_byte, views.child_node
  token_start, token_ids = views.token_start, views.token_ids
  while node and len(node) <= 4 * _PY_FRONTIER:
    next_node, next_state, next_origin = [], [], []
    for n, q, o in zip(node, state, origin):
      if q >= stop_at:
        stopped.append((n, q, o))
        continue
      for i in range(token_start[n], token_start[n + 1]):
        found += (o, token_ids[i], q)
      base = q << 8
      for slot in range(child_start[n], child_start[n + 1]):
        r = flat[base + child_byte[slot]]
        if r >= 0:
          next_node.append(child_node[slot])
          next_state.append(r)
          next_origin.append(o)
    node, state, origin = next_node, next_state, next_origin
  return node, state, origin


def _numpy_step(views: _TrieViews, flat: np.ndarray, node, row, origin):
  """One level of the walk: every child of each frontier pair that the DFA allows.

  `row` is each pair's DFA state times 256 (its row in `flat`), for the next level too.
  Written for few numpy calls (about 20): on the small frontiers of most walks each
  costs about a microsecond whatever its size; array methods (`x.repeat`) skip the
  Python-level wrappers of their `np.` functions (~0.4 us each).
  """
  count = views.child_count[node]
  ends = np.add.accumulate(count)
  # Slot of output position p of pair i: child_end[i] - ends[i] + p.
  slot = views.child_end[node]
  slot -= ends
  slot = slot.repeat(count)
  slot += views.arange(int(ends[-1]))
  code = views.slot_code[slot]
  nxt = row.repeat(count)
  nxt += code & 255
  nxt = flat[nxt]
  keep = (nxt >= 0).nonzero()[0]
  return code[keep] >> 8, nxt[keep] << 8, origin.repeat(count)[keep]


def _emit_rows(trie: VocabTrie, views: _TrieViews, levels: list):
  """`_emit` of the frontiers in `levels`, (node, state row, origin) triples."""
  node, row, origin = (np.concatenate(c) for c in zip(*levels))
  return _emit(trie, views, node, row >> 8, origin)


def _too_many_edges(what: str, needs: str, max_edges: int) -> CompileBudgetError:
  return CompileBudgetError(
      f"{what} needs {needs} token edges. Expected at most "
      f"CompileOptions.max_edges={max_edges}. Raise the budget, or narrow wide "
      f"sub-expressions such as '.*' (free text is what makes token automata large).")


def _walk_frontier(transitions: np.ndarray, trie: VocabTrie, node, state, origin, *,
                   max_edges: int, deadline: float, what: str, num_edges: int = 0,
                   stop_at: int = _NEVER, stopped: list | None = None):
  """Token edges of the lockstep walk of `trie` and the DFA from a frontier of pairs.

  Each frontier pair (trie node, DFA state, origin) stands for the byte path from the
  root to the node read from `origin` into `state`; every token at or below the node
  whose bytes the DFA accepts from there gives an edge (origin, token, state reached).
  Pairs that reach a state >= `stop_at` are appended to `stopped` instead, as
  (node, state, origin) arrays or tuples, and neither emitted nor walked further.

  Returns:
    A list of (source, token, target) int arrays, in no particular order (to be
    concatenated with the caller's other edges: one concatenation for all).
  """
  views = _views(trie)
  flat = transitions.reshape(-1)
  flat_view = None
  parts, found = [], []
  # Frontiers whose tokens are not emitted yet: one `_emit` at the end costs less than
  # one per level. `pending` estimates their edges, so that a walk over the edge budget
  # emits and stops early; the budget itself is checked on emitted edges only.
  levels, pending = [], 0

  def check():
    nonlocal num_edges, pending, levels
    if num_edges + pending > max_edges and levels:
      edges = _emit_rows(trie, views, levels)
      levels, pending = [], 0
      if edges is not None:
        parts.append(edges)
        num_edges += len(edges[0])
    if num_edges > max_edges:
      raise _too_many_edges(what, f"more than {max_edges}", max_edges)
    if time.perf_counter() > deadline:
      raise CompileBudgetError(
          f"{what} exceeded its compile time budget during composition with the "
          f"vocabulary. Raise CompileOptions.max_seconds or simplify the constraint."
      )

  row = state << 8  # Frontier states as offsets of their rows in `flat`.
  while len(node):
    if stop_at != _NEVER:
      at_stop = row >= stop_at << 8
      if at_stop.any():
        stopped.append((node[at_stop], row[at_stop] >> 8, origin[at_stop]))
        node, row, origin = node[~at_stop], row[~at_stop], origin[~at_stop]
        continue
    if len(node) <= _PY_FRONTIER:
      if flat_view is None:
        flat_view = memoryview(np.ascontiguousarray(flat, np.int32))
      before = len(found)
      node, state, origin = _python_steps(views, flat_view, node.tolist(),
                                          (row >> 8).tolist(), origin.tolist(), found,
                                          stop_at, stopped)
      num_edges += (len(found) - before) // 3
      check()
      if not node:
        break
      node, row, origin = (np.asarray(node, np.int32), np.asarray(state, np.int32) << 8,
                           np.asarray(origin, np.int32))
    levels.append((node, row, origin))
    pending += len(node) * 4  # Rarely more than a few tokens share one byte string.
    check()
    node, row, origin = _numpy_step(views, flat, node, row, origin)
  if levels:
    edges = _emit_rows(trie, views, levels)
    if edges is not None:
      parts.append(edges)
      num_edges += len(edges[0])
      check()
  if found:  # Flat (source, token, target) triples: a [3, n] array's rows.
    parts.append(np.array(found, np.int32).reshape(-1, 3).T)
  return parts


# A frontier at least this long is walked once per distinct (node, state) pair (below
# it, sorting the pairs costs about what sharing saves).
_SHARED_FRONTIER = 2048


def _walk_shared_frontier(transitions: np.ndarray, trie: VocabTrie, node, state, origin, *,
                          max_edges: int, deadline: float, what: str):
  """`_walk_frontier` (without stops), walking each distinct (node, state) pair once.

  What lies below a pair does not depend on its origin, and the states of one string
  body (its loop states and the near-loop states of keys that must differ from declared
  ones) share their exits: RPG's default schema has 17,200 frontier pairs, 1,806 of
  them distinct. Each distinct pair is walked once and its edges copied to every origin
  that has it.
  """
  budget = dict(max_edges=max_edges, deadline=deadline, what=what)
  if len(node) < _SHARED_FRONTIER:
    return _walk_frontier(transitions, trie, node, state, origin, **budget)
  key = node.astype(np.int64) << 32 | state
  order = key.argsort(kind="stable")
  key = key[order]
  starts = np.flatnonzero(np.diff(key, prepend=-1))
  if 2 * len(starts) > len(node):  # Mostly distinct already.
    return _walk_frontier(transitions, trie, node, state, origin, **budget)
  parts = _walk_frontier(transitions, trie, node[order[starts]], state[order[starts]],
                         np.arange(len(starts), dtype=np.int32), **budget)
  if not parts:
    return parts
  pair, tok, dst = _concatenate_columns(parts)
  bounds = np.append(starts, len(node))
  which, index = _ranges(bounds[pair], bounds[pair + 1])
  if len(which) > max_edges:
    raise _too_many_edges(what, f"more than {max_edges}", max_edges)
  return [(origin[order[index]], tok[which], dst[which])]


def _root_frontier(dfa: ByteDfa, trie: VocabTrie, origins: np.ndarray,
                   first_bytes: np.ndarray | None = None):
  """The frontier after one byte from each origin: (node, state, origin) int32 arrays.

  `first_bytes` (bool `[len(origins), 256]`) limits each origin to tokens whose first
  byte it allows.
  """
  # Level 1 straight from the DFA table: (q, b) with a transition and a root child b.
  views = _views(trie)
  next_state = dfa.transitions.take(origins, axis=0).take(views.root_bytes, axis=1)
  if first_bytes is not None:
    next_state = np.where(first_bytes[:, views.root_bytes], next_state, NO_STATE)
  row, column = (next_state != NO_STATE).nonzero()
  return (views.root_nodes[column], next_state[row, column],
          origins[row].astype(np.int32, copy=False))


def _walk(dfa: ByteDfa, trie: VocabTrie, origins: np.ndarray, *, max_edges: int,
          deadline: float, what: str, first_bytes: np.ndarray | None = None):
  """All token edges (q, t, q') of the byte DFA composed with the trie, for q in origins,
  as a list of (source, token, target) arrays.

  `first_bytes` (bool `[len(origins), 256]`) limits each origin to tokens whose first
  byte it allows.
  """
  return _walk_frontier(dfa.transitions, trie, *_root_frontier(dfa, trie, origins, first_bytes),
                        max_edges=max_edges, deadline=deadline, what=what)


def _live_states(num_states: int, src: np.ndarray, dst: np.ndarray, start: int,
                 accepting: np.ndarray) -> np.ndarray:
  """States reachable from `start` that can also reach an accepting state."""
  # Collapse parallel token edges to the state graph first: at most Q^2 pairs.
  pairs = np.sort(src.astype(np.int64) * num_states + dst)
  pairs = pairs[np.diff(pairs, prepend=-1) != 0]  # np.unique hashes: ~10x slower.
  forward: dict[int, list[int]] = {}
  backward: dict[int, list[int]] = {}
  for a, b in zip((pairs // num_states).tolist(), (pairs % num_states).tolist()):
    forward.setdefault(a, []).append(b)
    backward.setdefault(b, []).append(a)

  def closure(seeds, graph):
    seen = set(seeds)
    stack = list(seeds)
    while stack:
      for r in graph.get(stack.pop(), ()):
        if r not in seen:
          seen.add(r)
          stack.append(r)
    return seen

  live = np.zeros(num_states, bool)
  both = closure([start], forward) & closure(np.nonzero(accepting)[0].tolist(), backward)
  live[list(both)] = True
  return live


def _terminal_edges(dfa: ByteDfa, wide: dict, class_bits, num_words: int):
  """{state: [(bitmap, target), ...]} in precedence order; empty token classes dropped."""
  edges: dict[int, list] = {}
  for s, edge in wide.items():
    edges[s] = [(edge.bits, edge.target)] + edge.inside_edges()
  if len(dfa.token_arcs):
    if num_words <= 0:
      raise ValueError(
          f"compose_token_dfa got num_words={num_words} for an automaton with token-class"
          " arcs. Expected ceil(vocab_size / 32), the width of their bitmaps.")
    for s, k, target in dfa.token_arcs.tolist():
      bits = class_bits(ir.TOKEN_CLASSES[k])
      if bits.any():
        edges.setdefault(s, []).append((bits, target))
  return edges


def _covers_all_bytes(edge) -> bool:
  """Whether a wide edge's parts handle every first byte (a part with None does)."""
  return any(first is None for _, first in edge.parts) or bool(edge.first_bytes.all())


def _narrow(wide: dict, num_states: int, given: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray | None]:
  """States walked in the full trie, and the first bytes each of them walks there
  (None: every byte, for every state). States where `given` is set are not walked."""
  partial = {s: edge for s, edge in wide.items() if not _covers_all_bytes(edge)}
  narrow = np.array([s for s in range(num_states)
                     if (s not in wide or s in partial) and (given is None or not given[s])],
                    np.int64)
  if not partial:
    return narrow, None
  outside = np.ones((len(narrow), 256), bool)
  rows = np.searchsorted(narrow, list(partial))
  outside[rows] = ~np.stack([edge.first_bytes for edge in partial.values()])
  return narrow, outside


def _group_parts(wide: dict, fast: bool) -> tuple[dict, dict]:
  """Terminal key -> [(state, terminal, first bytes, loop states, inside cover)], for
  plain sub-trie walks and (with `fast`) for `_loop_part_edges`; loop parts with
  different covers (`_loops.InsideCover`, first parts only) are grouped apart.

  Plain walks emit every token of a sub-trie: only the fast path uses covers (and
  `_terminal_edges` their terminals, which explicit edges would override anyway).
  """
  plain: dict[str, list] = {}
  loops: dict[str, list] = {}
  for s, edge in wide.items():
    states = edge.part_states or (None,) * len(edge.parts)
    for k, ((terminal, first), phi) in enumerate(zip(edge.parts, states)):
      use_loop = fast and phi is not None and terminal.loop is not None
      cover = edge.inside if k == 0 and use_loop else None
      key = terminal.key if cover is None else f"{terminal.key}|{cover.key}"
      (loops if use_loop else plain).setdefault(key, []).append(
          (s, terminal, first, phi, cover))
  return plain, loops


def _plain_plan(trie: VocabTrie, narrow, outside, plain: dict) -> list:
  plan = [(trie, narrow, outside)]
  for key in sorted(plain):
    group = plain[key]
    origins = np.array([s for s, *_ in group], np.int64)
    first_bytes = np.stack([np.ones(256, bool) if first is None else first
                            for _, _, first, *_ in group])
    plan.append((group[0][1].subtrie, origins, first_bytes))
  return plan


def walk_plan(wide: dict, num_states: int, trie: VocabTrie):
  """The trie walks that find every explicit edge: [(trie, origins, first bytes)].

  The full trie for ordinary states, and for entry states the first bytes that do not
  enter a loop; then, per cached terminal, its sub-trie (the tokens its bitmap leaves
  out) for the states using it, limited to the part's first bytes.
  """
  narrow, outside = _narrow(wide, num_states)
  if outside is None:
    outside = np.ones((len(narrow), 256), bool)
  plain, _ = _group_parts(wide, fast=False)
  return _plain_plan(trie, narrow, outside, plain)


def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(which, index): every index in lo[k]..hi[k]-1 for each k, and its k."""
  counts = hi - lo
  ends = np.cumsum(counts)
  total = int(ends[-1]) if len(ends) else 0
  which = np.repeat(np.arange(len(lo)), counts)
  return which, np.repeat(lo - (ends - counts), counts) + np.arange(total)


_EXIT_GROUPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _exit_groups(exits) -> tuple[np.ndarray, np.ndarray]:
  """(loop state, byte) of each exit's group, aligned with `exits.group_full_node`.

  Per cached `LoopExits` (long-lived, like the trie): computed once.
  """
  pair = _EXIT_GROUPS.get(exits)
  if pair is None:
    group = np.repeat(np.arange(len(exits.group_from)), np.diff(exits.group_start))
    pair = _EXIT_GROUPS[exits] = (exits.group_from[group], exits.group_byte[group])
  return pair


def _explicit_inside(exits, cover) -> tuple[np.ndarray, np.ndarray]:
  """(token, loop state) of the inside tokens of `exits` that stay explicit edges: all
  of them, or those a `_loops.InsideCover` keeps."""
  if cover is None:
    return exits.inside_token, exits.inside_state
  return exits.inside_token[cover.keep], exits.inside_state[cover.keep]


def _resolved_at_root(trans: np.ndarray, exits, origins: np.ndarray, phi: np.ndarray,
                      cover=None):
  """`_loop_part_edges` when every origin is its part's entry state (loop states and
  pre-entries): all (explicit) inside tokens of `exits`, and the exits' frontier (a DFA
  lookup per exit: fewer numpy calls than one per group expanded to its exits)."""
  inside_token, inside_state = _explicit_inside(exits, cover)
  edges = (np.repeat(origins, len(inside_token)), np.tile(inside_token, len(origins)),
           phi[:, inside_state].ravel())
  exit_from, exit_byte = _exit_groups(exits)
  nxt = trans[phi[:, exit_from], exit_byte]  # [O, exits]
  row, column = np.nonzero(nxt != NO_STATE)
  frontier = (exits.group_full_node[column], nxt[row, column], origins[row])
  return edges, frontier


def _resolved_at_root_once(trans: np.ndarray, exits, origin: int, phi: np.ndarray,
                           cover=None):
  """`_resolved_at_root` for a single origin (the usual case): one-dimensional lookups,
  a third fewer numpy calls."""
  inside_token, inside_state = _explicit_inside(exits, cover)
  edges = (np.full(len(inside_token), origin, np.int32), inside_token, phi[inside_state])
  exit_from, exit_byte = _exit_groups(exits)
  nxt = trans[phi[exit_from], exit_byte]
  keep = (nxt != NO_STATE).nonzero()[0]
  frontier = (exits.group_full_node[keep], nxt[keep], np.full(len(keep), origin, np.int32))
  return edges, frontier


def _loop_part_edges(dfa: ByteDfa, group: list):
  """Explicit edges of the states whose wide edges share one loop terminal's part.

  The sub-trie is walked in lockstep from each state p (in the DFA) and from the part's
  entry in the loop automaton, as far as the two disagree: read through the loop's
  states phi, a walk that reaches loop state i in DFA state phi(i) agrees with the
  cached walk of `LoopTerminal.exits` below that node, so its tokens and exits are read
  from those arrays (for loop and entry states that is at once, at the root). Exits and
  pairs that leave the loop automaton while disagreeing are walked in the DFA alone.
  Exact: the same edges as walking the whole sub-trie from p, less the inside tokens
  that the group's `_loops.InsideCover` turns into terminal edges.

  Returns:
    (edges found, frontier): the edges (source, token, target) read so far, and the
    pairs still to walk in the DFA alone as (full-trie node, state, origin) arrays
    (`LoopExits.full_node`: below them the full trie is the sub-trie).
  """
  terminal, cover = group[0][1], group[0][4]
  exits, sub, loop = terminal.exits, terminal.subtrie, terminal.loop
  trans = dfa.transitions
  at_root = not terminal.after_first_byte and all(states[terminal.entry] == s
                                                  for s, _, _, states, _ in group)
  if at_root and len(group) == 1:
    origin, _, _, states, _ = group[0]
    return _resolved_at_root_once(trans, exits, int(origin), np.asarray(states, np.int32),
                                  cover)
  origins = np.array([s for s, *_ in group], np.int32)
  phi = np.array([states for _, _, _, states, _ in group], np.int32)  # [O, L]
  if at_root:
    return _resolved_at_root(trans, exits, origins, phi, cover)
  views = _views(sub)
  if terminal.after_first_byte:
    lo, hi = sub.child_start[0], sub.child_start[1]
    first = np.stack([np.ones(256, bool) if f is None else f for _, _, f, *_ in group])
    root_bytes = sub.child_byte[lo:hi]
    true = trans[origins][:, root_bytes]
    which, column = np.nonzero(first[:, root_bytes] & (true != NO_STATE))
    node, state = sub.child_node[lo + column], true[which, column]
  else:
    which = np.arange(len(origins))
    node, state = np.zeros(len(origins), np.int32), origins
  loop_state = np.full(len(node), terminal.entry, np.int32)
  found, plain, resolved = [], [], []
  if (phi[which, terminal.entry] == state).all():  # Loop and entry states: at once.
    resolved.append((node, which))
    node = node[:0]
  while len(node):
    agree = loop_state >= 0
    agree[agree] = phi[which[agree], loop_state[agree]] == state[agree]
    resolved.append((node[agree], which[agree]))
    alone = ~agree & (loop_state < 0)
    plain.append((node[alone], state[alone], origins[which[alone]]))
    walk = np.flatnonzero(~agree & (loop_state >= 0))
    if not len(walk):
      break
    node, state, loop_state, which = node[walk], state[walk], loop_state[walk], which[walk]
    edges = _emit(sub, views, node, state, origins[which])
    if edges is not None:
      found.append(edges)
    pair, slot = sub.child_slots(node)
    byte = sub.child_byte[slot]
    nxt = trans[state[pair], byte]
    keep = np.flatnonzero(nxt != NO_STATE)
    pair, byte = pair[keep], byte[keep]
    node, state = sub.child_node[slot[keep]], nxt[keep]
    loop_state, which = loop[loop_state[pair], byte], which[pair]
  node, which = (np.concatenate(c) for c in zip(*resolved))
  end = exits.node_end[node]
  k, i = _ranges(np.searchsorted(exits.inside_node, node), np.searchsorted(exits.inside_node, end))
  if cover is not None:
    explicit = cover.keep[i]
    k, i = k[explicit], i[explicit]
  o = which[k]
  found.append((origins[o], exits.inside_token[i], phi[o, exits.inside_state[i]]))
  k, i = _ranges(np.searchsorted(exits.exit_node, node), np.searchsorted(exits.exit_node, end))
  o = which[k]
  nxt = trans[phi[o, exits.exit_from[i]], exits.exit_byte[i]]
  keep = np.flatnonzero(nxt != NO_STATE)
  plain.append((exits.exit_node[i[keep]], nxt[keep], origins[o[keep]]))
  node, state, origin = (np.concatenate(c).astype(np.int32) for c in zip(*plain))
  edges = tuple(np.concatenate(column).astype(np.int32) for column in zip(*found))
  return edges, (exits.full_node[node], state, origin)


@dataclasses.dataclass(frozen=True, eq=False)
class GivenEdges:
  """Edges known before composition (spliced fragment copies, `_splice.py`).

  Attributes:
    states: bool `[Q]`; the states whose edges these are (they are not walked).
    edges: (source, token, target) int32 arrays: their explicit edges that stay in
      known territory.
    terminals: {state: [(bitmap, target), ...]} their terminal edges, in precedence order.
    frontier: (full-trie node, state, origin) int32 arrays: walks still to do from
      them (tokens that leave a copy; walked with every other state's).
    arc_ops: The register operations of the spliced DFA's byte arcs, (state, byte) ->
      ops (`_registers.Contracted.arc_ops`, renumbered, and copied to the copies'
      accepting states that continue like a tagged state), when `splice` was given some.
  """

  states: np.ndarray
  edges: tuple[np.ndarray, np.ndarray, np.ndarray]
  terminals: dict
  frontier: tuple[np.ndarray, np.ndarray, np.ndarray]
  arc_ops: dict | None = None


def token_edges(dfa: ByteDfa, trie: VocabTrie, *, wide: dict,
                given: GivenEdges | None = None, max_edges: int = 20_000_000,
                deadline: float = float("inf"), what: str = "The constraint",
                stop_at: int = _NEVER, stopped: list | None = None):
  """The explicit edges (source, token, target) of `dfa` composed with `trie`, untrimmed,
  unsorted, byte-DFA states: those of `given` and those found by walking the other
  states (see `compose_token_dfa`).

  Walks in the full trie that reach a state >= `stop_at` stop there and are appended
  to `stopped` ((node, state, origin) arrays or tuples); `_splice.py` finds a
  fragment's exits so. Walks of other tries (terminals' sub-tries) must not reach one.
  """
  budget = dict(max_edges=max_edges, deadline=deadline, what=what)
  if given is not None and any(given.states[s] for s in wide):
    raise ValueError("A state has both given edges and a wide edge. Expected the wide "
                     "states found with the given states skipped (`WideStates.find`).")
  narrow, outside = _narrow(wide, dfa.num_states, None if given is None else given.states)
  plain, loops = _group_parts(wide, fast=True)
  # One walk of the full trie: the narrow states and every loop part's exits together.
  full_plan, *sub_plans = _plain_plan(trie, narrow, outside, plain)
  _, narrow, outside = full_plan
  if outside is not None and outside.all():
    outside = None
  frontiers = [_root_frontier(dfa, trie, narrow, outside)]
  parts = []
  if given is not None:
    frontiers.append(given.frontier)
    parts.append(given.edges)
  for key in sorted(loops):
    edges, frontier = _loop_part_edges(dfa, loops[key])
    parts.append(edges)
    frontiers.append(frontier)
  frontier = _concatenate_columns(frontiers)
  if stop_at == _NEVER:
    parts += _walk_shared_frontier(dfa.transitions, trie, *frontier, **budget)
  else:
    parts += _walk_frontier(dfa.transitions, trie, *frontier, **budget, stop_at=stop_at,
                            stopped=stopped)
  for part_trie, origins, first_bytes in sub_plans:
    parts += _walk(dfa, part_trie, origins, first_bytes=first_bytes, **budget)
  src, tok, dst = _concatenate_columns(parts) if parts else (np.zeros(0, np.int32),) * 3
  if len(src) > max_edges:
    raise _too_many_edges(what, str(len(src)), max_edges)
  return src, tok, dst


def compose_token_dfa(
    dfa: ByteDfa,
    trie: VocabTrie,
    *,
    wide: dict | None = None,
    token_class_bits: Callable[[str], np.ndarray] | None = None,
    num_words: int = 0,
    max_edges: int = 20_000_000,
    deadline: float = float("inf"),
    what: str = "The constraint",
    given: GivenEdges | None = None,
) -> TokenDfa:
  """The trimmed token-level DFA accepting token sequences whose bytes `dfa` accepts.

  Args:
    dfa: A deterministic, trimmed byte automaton (with token-class arcs, if any).
    trie: The vocabulary trie.
    wide: Wide states of `dfa` -> (their `LoopTerminal`, its target state), see
      `_wide.py`; these get one terminal edge plus the explicit edges found in the
      terminal's sub-trie.
    token_class_bits: Token class name -> uint32 `[W]` bitmap of its tokens, for the
      token-class arcs of `dfa` (the compiler passes its per-vocabulary cache,
      `WideStates.token_class_bits`); None computes them uncached.
    num_words: Bitmask width, ceil(V / 32).
    max_edges: Budget on explicit token edges (raises `CompileBudgetError` beyond it).
    deadline: `time.perf_counter()` value after which composition gives up.
    what: How to name the constraint in error messages.
    given: Edges of some states known beforehand (spliced fragment copies): those
      states are not walked.

  Returns:
    A `TokenDfa` whose start state is 0, or one with zero states when no token sequence
    of this vocabulary is accepted.
  """
  wide = wide or {}
  if dfa.num_states == 0:
    return _empty_token_dfa(num_words)
  if token_class_bits is None:
    from constrained_decoding.automata import _token_classes  # pylint: disable=g-import-not-at-top

    def token_class_bits(name):
      return _token_classes.class_bits(trie, name, num_words)

  q = dfa.num_states
  src, tok, dst = token_edges(dfa, trie, wide=wide, given=given, max_edges=max_edges,
                              deadline=deadline, what=what)
  terminal_edges = _terminal_edges(dfa, wide, token_class_bits, num_words)
  num_given = 0
  if given is not None:
    terminal_edges.update(given.terminals)
    num_given = sum(map(len, given.terminals.values()))
  if (trie.is_byte_complete
      and sum(map(len, terminal_edges.values()))
      == sum(1 + len(edge.inside_edges()) for edge in wide.values())
      + len(dfa.token_arcs) + num_given):
    # Every byte is a token, every token class used is non-empty and `ByteDfa`s are
    # trimmed, so each state is reached and can finish at token boundaries too (spell
    # the bytes one by one): nothing to prune.
    live = None
  else:
    term_src = np.array([s for s, edges in terminal_edges.items() for _ in edges], np.int32)
    term_dst = np.array([t for edges in terminal_edges.values() for _, t in edges], np.int32)
    live = _live_states(q, np.concatenate([src, term_src]), np.concatenate([dst, term_dst]),
                        dfa.start, dfa.accepting)
    if not live[dfa.start]:
      return _empty_token_dfa(num_words)
  if dfa.start == 0 and (live is None or live.all()):  # Nothing to renumber.
    state_terminals, terminal_bits = _pack_terminals(terminal_edges, range(q), q, num_words)
    src, tok, dst = _sorted_edges(src, tok, dst, q, _views(trie).token_span)
    return TokenDfa(num_states=q, accepting=dfa.accepting.astype(bool),
                    edge_source=src, edge_token=tok, edge_target=dst,
                    terminal_bits=terminal_bits, state_terminals=state_terminals,
                    byte_state=np.arange(q, dtype=np.int32))
  if live is None:
    live = np.ones(q, bool)
  # Renumber live states, start first, then in byte-DFA order.
  order = np.concatenate([[dfa.start], np.nonzero(live)[0][np.nonzero(live)[0] != dfa.start]])
  new_id = np.full(q, -1, np.int32)
  new_id[order] = np.arange(len(order), dtype=np.int32)
  state_terminals, terminal_bits = _pack_terminals(terminal_edges, new_id.tolist(), len(order),
                                                   num_words)
  keep = live[src] & live[dst]
  src, tok, dst = _sorted_edges(new_id[src[keep]], tok[keep], new_id[dst[keep]], len(order),
                                _views(trie).token_span)
  return TokenDfa(
      num_states=len(order),
      accepting=dfa.accepting[order].astype(bool),
      edge_source=src,
      edge_token=tok,
      edge_target=dst,
      terminal_bits=terminal_bits,
      state_terminals=state_terminals,
      byte_state=order.astype(np.int32),
  )


def _empty_token_dfa(num_words: int) -> TokenDfa:
  """The token DFA of the empty language (zero states)."""
  return TokenDfa(0, np.zeros(0, bool), *(np.zeros(0, np.int32),) * 3,
                  np.zeros((0, num_words), np.uint32), np.zeros((0, 1, 2), np.int32))


def _concatenate_columns(parts: list) -> tuple[np.ndarray, ...]:
  """Column-wise concatenation of (a, b, c, ...) array tuples, as int32 arrays."""
  return tuple(np.concatenate(column, dtype=np.int32) for column in zip(*parts))


# Below this many edges, an argsort and three gathers (fewer numpy calls) sort faster.
_FEW_EDGES = 4096


def _sorted_edges(src: np.ndarray, tok: np.ndarray, dst: np.ndarray, num_states: int,
                  token_span: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The edges sorted by (source, token) (the pairs are unique, so any sort), as int32.

  Sorting one int64 key of bit fields (source, token, target) is about twice as fast as
  an argsort and three gathers.
  """
  state_bits = max(int(num_states - 1).bit_length(), 1)
  token_bits = max(int(token_span - 1).bit_length(), 1)
  if len(src) < _FEW_EDGES or 2 * state_bits + token_bits > 63:
    order = (src.astype(np.int64) << 32 | tok).argsort()
    return src[order], tok[order], dst[order]
  key = (src.astype(np.int64) << token_bits | tok) << state_bits | dst
  key.sort()
  state_mask, token_mask = (1 << state_bits) - 1, (1 << token_bits) - 1
  return ((key >> (token_bits + state_bits)).astype(np.int32),
          (key >> state_bits & token_mask).astype(np.int32),
          (key & state_mask).astype(np.int32))


def _pack_terminals(terminal_edges: dict, new_id, num_states: int,
                    num_words: int) -> tuple[np.ndarray, np.ndarray]:
  """(state_terminals `[S, R, 2]`, distinct bitmaps `[T, W]`) of the live terminal edges.

  `new_id` maps byte-DFA states to token-DFA states (-1: dropped), e.g. a list.
  """
  rows, distinct = [], []
  by_sample: dict[bytes, list[int]] = {}  # A sample of words -> distinct bitmaps with it.
  by_id: dict[int, int] = {}  # Edges often share one array: compare it once.
  width = 1
  for s, edges in terminal_edges.items():
    source = new_id[s]
    if source < 0:
      continue
    rank = 0
    for bits, target in edges:
      target = new_id[target]
      if target < 0:
        continue
      k = by_id.get(id(bits))
      if k is None:
        same = by_sample.setdefault(bits[::61].tobytes(), [])
        k = next((j for j in same if np.array_equal(distinct[j], bits)), None)
        if k is None:
          k = len(distinct)
          distinct.append(bits)
          same.append(k)
        by_id[id(bits)] = k
      rows.append((source, rank, k, target))
      rank += 1
    width = max(width, rank)
  state_terminals = np.full((num_states, width, 2), -1, np.int32)
  if rows:
    source, rank, k, target = np.array(rows, np.int32).T
    state_terminals[source, rank, 0] = k
    state_terminals[source, rank, 1] = target
  terminal_bits = np.array(distinct) if distinct else np.zeros((0, num_words), np.uint32)
  return state_terminals, terminal_bits
