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

Public functions:
  compose_token_dfa(dfa, trie, ...)  -> TokenDfa
  walk_plan(wide, num_states, trie)  -> the trie walks that find every explicit edge
"""

import dataclasses
import time
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
  """

  num_states: int
  accepting: np.ndarray
  edge_source: np.ndarray
  edge_token: np.ndarray
  edge_target: np.ndarray
  terminal_bits: np.ndarray
  state_terminals: np.ndarray


def _emit(trie: VocabTrie, node, state, origin):
  """Token edges (origin, t, state) for every token t spelled by a frontier node."""
  k = trie.token_start[node + 1] - trie.token_start[node]
  hit = np.nonzero(k)[0]
  if not len(hit):
    return None
  k_hit = k[hit]
  if (k_hit == 1).all():  # the common case: one token per byte string
    return origin[hit], trie.token_ids[trie.token_start[node[hit]]], state[hit]
  rep = np.repeat(hit, k_hit)
  slot = np.repeat(trie.token_start[node[hit]] - (np.cumsum(k_hit) - k_hit), k_hit)
  return origin[rep], trie.token_ids[slot + np.arange(len(rep))], state[rep]


def _walk(dfa: ByteDfa, trie: VocabTrie, origins: np.ndarray, *, max_edges: int,
          deadline: float, what: str, first_bytes: np.ndarray | None = None):
  """All token edges (q, t, q') of the byte DFA composed with the trie, for q in origins.

  `first_bytes` (bool `[len(origins), 256]`) limits each origin to tokens whose first
  byte it allows.
  """
  # Level 1 straight from the DFA table: (q, b) with a transition and a root child b.
  root = trie.child_start[0], trie.child_start[1]
  root_bytes = trie.child_byte[root[0]:root[1]]
  next_state = dfa.transitions[origins][:, root_bytes]
  if first_bytes is not None:
    next_state = np.where(first_bytes[:, root_bytes], next_state, NO_STATE)
  row, slot = np.nonzero(next_state != NO_STATE)
  state = next_state[row, slot]
  node = trie.child_node[root[0] + slot]
  origin = origins[row].astype(np.int32)
  parts = []
  num_edges = 0
  while len(node):
    found = _emit(trie, node, state, origin)
    if found is not None:
      parts.append(found)
      num_edges += len(found[0])
      if num_edges > max_edges:
        raise CompileBudgetError(
            f"{what} needs more than {max_edges} token edges. Expected at most "
            f"CompileOptions.max_edges={max_edges}. Raise the budget, or narrow wide "
            f"sub-expressions such as '.*' (free text is what makes token automata large)."
        )
    if time.perf_counter() > deadline:
      raise CompileBudgetError(
          f"{what} exceeded its compile time budget during composition with the "
          f"vocabulary. Raise CompileOptions.max_seconds or simplify the constraint."
      )
    # Expand every frontier pair (node, state) into the node's children.
    pair, slot = trie.child_slots(node)
    nxt = dfa.transitions[state[pair], trie.child_byte[slot]]
    keep = np.nonzero(nxt != NO_STATE)[0]
    node, state, origin = trie.child_node[slot[keep]], nxt[keep], origin[pair[keep]]
  if not parts:
    empty = np.zeros(0, np.int32)
    return empty, empty, empty
  return tuple(np.concatenate(column).astype(np.int32) for column in zip(*parts))


def _live_states(num_states: int, src: np.ndarray, dst: np.ndarray, start: int,
                 accepting: np.ndarray) -> np.ndarray:
  """States reachable from `start` that can also reach an accepting state."""
  # Collapse parallel token edges to the state graph first: at most Q^2 pairs.
  pairs = np.unique(src.astype(np.int64) * num_states + dst)
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
    edges[s] = [(edge.bits, edge.target)]
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


def walk_plan(wide: dict, num_states: int, trie: VocabTrie):
  """The trie walks that find every explicit edge: [(trie, origins, first bytes)].

  The full trie for ordinary states, and for entry states the first bytes that do not
  enter a loop; then, per cached terminal, its sub-trie (the tokens its bitmap leaves
  out) for the states using it, limited to the part's first bytes.
  """
  narrow = np.array([s for s in range(num_states)
                     if s not in wide or not wide[s].first_bytes.all()], np.int64)
  outside = (np.stack([~wide[s].first_bytes if s in wide else np.ones(256, bool)
                       for s in narrow.tolist()]) if len(narrow) else np.ones((0, 256), bool))
  plan = [(trie, narrow, outside)]
  by_key: dict[str, list] = {}
  for s, edge in wide.items():
    for terminal, first in edge.parts:
      by_key.setdefault(terminal.key, []).append((s, terminal, first))
  for key in sorted(by_key):
    group = by_key[key]
    origins = np.array([s for s, _, _ in group], np.int64)
    first_bytes = np.stack([np.ones(256, bool) if first is None else first
                            for _, _, first in group])
    plan.append((group[0][1].subtrie, origins, first_bytes))
  return plan


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

  Returns:
    A `TokenDfa` whose start state is 0, or one with zero states when no token sequence
    of this vocabulary is accepted.
  """
  wide = wide or {}
  no_terminals = np.zeros((0, num_words), np.uint32)
  empty = TokenDfa(0, np.zeros(0, bool), *(np.zeros(0, np.int32),) * 3, no_terminals,
                   np.zeros((0, 1, 2), np.int32))
  if dfa.num_states == 0:
    return empty
  if token_class_bits is None:
    from constrained_decoding.automata import _token_classes  # pylint: disable=g-import-not-at-top

    def token_class_bits(name):
      return _token_classes.class_bits(trie, name, num_words)

  q = dfa.num_states
  budget = dict(max_edges=max_edges, deadline=deadline, what=what)
  parts = [_walk(dfa, part_trie, origins, first_bytes=first_bytes, **budget)
           for part_trie, origins, first_bytes in walk_plan(wide, q, trie)]
  terminal_edges = _terminal_edges(dfa, wide, token_class_bits, num_words)
  src, tok, dst = (np.concatenate(column) for column in zip(*parts))
  term_src = np.array([s for s, edges in terminal_edges.items() for _ in edges], np.int32)
  term_dst = np.array([t for edges in terminal_edges.values() for _, t in edges], np.int32)
  if trie.is_byte_complete and len(term_src) == len(wide) + len(dfa.token_arcs):
    # Every byte is a token, every token class used is non-empty and `ByteDfa`s are
    # trimmed, so each state is reached and can finish at token boundaries too (spell
    # the bytes one by one): nothing to prune.
    live = np.ones(q, bool)
  else:
    live = _live_states(q, np.concatenate([src, term_src]), np.concatenate([dst, term_dst]),
                        dfa.start, dfa.accepting)
  if not live[dfa.start]:
    return empty
  # Renumber live states, start first, then in byte-DFA order.
  order = np.concatenate([[dfa.start], np.nonzero(live)[0][np.nonzero(live)[0] != dfa.start]])
  new_id = np.full(q, -1, np.int32)
  new_id[order] = np.arange(len(order), dtype=np.int32)
  state_terminals, terminal_bits = _pack_terminals(terminal_edges, new_id, len(order),
                                                   no_terminals)
  if live.all() and dfa.start == 0:
    order = np.argsort(src.astype(np.int64) << 32 | tok, kind="stable")
    return TokenDfa(num_states=q, accepting=dfa.accepting.astype(bool),
                    edge_source=src[order], edge_token=tok[order], edge_target=dst[order],
                    terminal_bits=terminal_bits, state_terminals=state_terminals)
  keep = live[src] & live[dst]
  src, tok, dst = new_id[src[keep]], tok[keep], new_id[dst[keep]]
  by_source_token = np.argsort(src.astype(np.int64) << 32 | tok, kind="stable")
  return TokenDfa(
      num_states=len(order),
      accepting=dfa.accepting[order].astype(bool),
      edge_source=src[by_source_token],
      edge_token=tok[by_source_token],
      edge_target=dst[by_source_token],
      terminal_bits=terminal_bits,
      state_terminals=state_terminals,
  )


def _pack_terminals(terminal_edges: dict, new_id: np.ndarray, num_states: int,
                    no_terminals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(state_terminals `[S, R, 2]`, distinct bitmaps `[T, W]`) of the live terminal edges."""
  live_edges = {}
  for s, edges in terminal_edges.items():
    if new_id[s] >= 0:
      kept = [(bits, new_id[t]) for bits, t in edges if new_id[t] >= 0]
      if kept:
        live_edges[int(new_id[s])] = kept
  width = max((len(edges) for edges in live_edges.values()), default=1)
  state_terminals = np.full((num_states, width, 2), -1, np.int32)
  bitmaps: dict[bytes, int] = {}
  for s, edges in live_edges.items():
    for r, (bits, target) in enumerate(edges):
      state_terminals[s, r] = (bitmaps.setdefault(bits.tobytes(), len(bitmaps)), target)
  terminal_bits = (np.stack([np.frombuffer(b, np.uint32) for b in bitmaps])
                   if bitmaps else no_terminals)
  return state_terminals, terminal_bits
