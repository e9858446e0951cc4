"""Grammars as token-level push-down automata (Alg. 3, Appendix B.3).

A normalized grammar (`constraints/_grammar.py`: only true recursion left as rules) is
first turned into a *recursive transition network* (`_rtn.py`: one minimal byte DFA per
rule, call arcs that push a return address, returns from states final in their rule).
This module composes that network with the vocabulary.

The token-level PDA (the composition with the detokenizer, `P_G ∘ T_V`) is computed the
way `_compose.py` composes regexes: a numpy lockstep walk of the vocabulary trie, here
over *configurations* (state, symbols pushed during this token, symbols popped from the
stack below). Calls and returns are epsilon moves taken only when the next byte needs
them, so a token never ends with a dangling call or return. Every token edge thus
carries a pop sequence (checked against the top of the stack at run time) and a push
sequence, and may cross any number of terminal and rule boundaries (`"]},{"` pops
two rules and enters another): the failure of Outlines issue 684 is impossible here by
construction. Edges of a state are grouped by pop sequence (`tables.py`).

Tail calls (a call whose return address is final with nothing after it) push nothing,
so right recursion such as `list ::= item ("," list)?` runs in constant stack.

Bounds: a token edge pops at most `max_pops` and pushes at most `max_pushes` symbols;
paths beyond are not offered (the same bytes remain reachable with shorter tokens),
and `TokenPda.dropped_paths` counts those that pop too much. Wide states (string bodies, free text) get
terminal edges exactly as for regexes (`_wide.py`).

Determinism: for each state and token, the pop sequences of its paths must be pairwise
incompatible (neither a prefix of the other), so that whatever the stack holds at most
one path applies; otherwise `NondeterministicGrammarError` names the rules involved
and an example input.

Public names:
  TokenPda, compose_token_pda(rtn, trie, ...)  the token-level push-down automaton.
  Rtn, build_rtn(grammar)   re-exported from `_rtn.py`, where the compiler finds them.
"""

import collections
import dataclasses
import time

import numpy as np

from constrained_decoding import _arrays
from constrained_decoding import errors
from constrained_decoding.automata import _registers
from constrained_decoding.automata import _rtn
from constrained_decoding.automata._byte_dfa import NO_STATE
from constrained_decoding.automata._compose import _emit
from constrained_decoding.automata._compose import _views
from constrained_decoding.automata._compose import walk_plan
from constrained_decoding.automata._detokenizer import VocabTrie
from constrained_decoding.automata._rtn import Rtn

build_rtn = _rtn.build_rtn  # Where `_compiler.py` and tests call it.

DEFAULT_MAX_POPS = 8
DEFAULT_MAX_PUSHES = 16


@dataclasses.dataclass(frozen=True, eq=False)
class TokenPda:
  """A deterministic token-level push-down automaton, ready for `_packing.pack_pda_tables`.

  Attributes:
    num_states: States (those of the RTN); the start state is `start`.
    start: The start state.
    accepting: bool `[S]`; final in its rule.
    group_state, group_pops, group_num_pops: The edge groups, sorted by state; pops
      are listed top of stack first, -1 padded (`[G]`, `[G, P]`, `[G]`).
    edge_group, edge_token, edge_target, edge_push: The explicit edges, sorted by
      (group, token) (`[E]` each); `edge_push` is a row of `push_symbols`.
    push_symbols, push_lengths: Pushed sequences, bottom first, -1 padded (`[U, Q]`,
      `[U]`); row 0 is the empty sequence.
    terminal_bits, state_terminal, terminal_target: Terminal edges of wide states, as
      in `TokenDfa`.
    dropped_paths: Token paths not offered because they pop more than `max_pops`
      symbols (paths pushing more than `max_pushes` are cut while exploring, uncounted).
  """

  num_states: int
  start: int
  accepting: np.ndarray
  group_state: np.ndarray
  group_pops: np.ndarray
  group_num_pops: np.ndarray
  edge_group: np.ndarray
  edge_token: np.ndarray
  edge_target: np.ndarray
  edge_push: np.ndarray
  push_symbols: np.ndarray
  push_lengths: np.ndarray
  terminal_bits: np.ndarray
  state_terminal: np.ndarray
  terminal_target: np.ndarray
  dropped_paths: int
  # The `_registers.Guards` of the explicit edges (`edge_guard` in edge order), or None
  # when the grammar has no register markers (`Rtn.contracted`).
  guards: "_registers.Guards | None" = None


class _Configurations:
  """Interned walk configurations (state, pushed) and their byte successors.

  `pushed` are the return addresses pushed since the token began (bottom first). What a
  path pops from the stack below the token is not part of the configuration (that would
  multiply configurations by every pop history): each successor instead carries the
  *chunk* of symbols its epsilon closure popped, and the walk accumulates chunks into
  pop sequences (`_PopSequences`). Successors are computed once per configuration, as
  sorted `(config * 256 + byte) -> (config, chunk)` arrays for numpy lookups.
  """

  def __init__(self, rtn: Rtn, max_pops: int, max_pushes: int):
    self.rtn = rtn
    self.max_pops = max_pops
    self.max_pushes = max_pushes
    self.items: list[tuple[int, tuple[int, ...]]] = []
    self.index: dict = {}
    self.chunks: list[tuple[int, ...]] = [()]
    self.chunk_index: dict = {(): 0}
    self.expanded: set[int] = set()
    self.keys = np.zeros(0, np.int64)
    self.targets = np.zeros(0, np.int64)
    self.target_chunks = np.zeros(0, np.int64)
    self._byte_rows = [np.nonzero(row >= 0)[0] for row in rtn.transitions]
    # Register operations read with a byte arc (`Rtn.contracted`): interned op tuples,
    # 0 for none; each successor carries the id of the arc it read.
    self.arc_ops = {} if rtn.contracted is None else rtn.contracted.arc_ops
    self.ops: list[tuple] = [()]
    self.ops_index: dict = {(): 0}
    self.target_ops = np.zeros(0, np.int64)

  def intern(self, config) -> int:
    found = self.index.get(config)
    if found is None:
      found = self.index[config] = len(self.items)
      self.items.append(config)
    return found

  def _closure(self, config):
    """(state, pushed, popped chunk) reachable by calls and returns without input."""
    rtn = self.rtn
    start = config + ((),)
    seen = {start}
    todo = [start]
    while todo:
      state, pushed, popped = todo.pop()
      moves = []
      for rule, ret in rtn.calls[state]:
        entry = rtn.rule_start[rule]
        if rtn.is_tail(ret):
          moves.append((entry, pushed, popped))
        elif len(pushed) < self.max_pushes:
          moves.append((entry, pushed + (ret,), popped))
      if rtn.accepting[state]:
        if pushed:
          moves.append((pushed[-1], pushed[:-1], popped))
        elif len(popped) < self.max_pops:
          moves.extend((ret, (), popped + (ret,))
                       for ret in rtn.tops[rtn.rule_of_state[state]])
      for move in moves:
        if move not in seen:
          seen.add(move)
          todo.append(move)
    return seen

  def expand(self, wanted: np.ndarray) -> None:
    """Computes the successors of the configurations in `wanted` not expanded yet.

    Only configurations the walk actually reached are expanded: expanding every
    interned successor would explore all byte strings, not the vocabulary's.
    """
    new = sorted(c for c in set(wanted.tolist()) if c not in self.expanded)
    if not new:
      return
    keys, targets, chunks = [self.keys], [self.targets], [self.target_chunks]
    ops = [self.target_ops]
    transitions = self.rtn.transitions
    arc_ops = self.arc_ops
    for c in new:
      self.expanded.add(c)
      triples = set()
      for state, pushed, popped in self._closure(self.items[c]):
        row = transitions[state]
        chunk = self.chunk_index.setdefault(popped, len(self.chunk_index))
        if chunk == len(self.chunks):
          self.chunks.append(popped)
        for b in self._byte_rows[state].tolist():
          if arc_ops:
            crossed = arc_ops.get((state, b), ())
            op = self.ops_index.setdefault(crossed, len(self.ops_index))
            if op == len(self.ops):
              self.ops.append(crossed)
            triples.add((b, self.intern((int(row[b]), pushed)), chunk, op))
          else:
            triples.add((b, self.intern((int(row[b]), pushed)), chunk, 0))
      if triples:
        found = np.array(sorted(triples), np.int64)
        keys.append(c * 256 + found[:, 0])
        targets.append(found[:, 1])
        chunks.append(found[:, 2])
        ops.append(found[:, 3])
    key = np.concatenate(keys)
    order = np.argsort(key, kind="stable")
    self.keys = key[order]
    self.targets = np.concatenate(targets)[order]
    self.target_chunks = np.concatenate(chunks)[order]
    self.target_ops = np.concatenate(ops)[order]

  def step(self, config: np.ndarray, byte: np.ndarray):
    """(which input, successor, popped chunk, operations id) for each (config, byte)
    input pair."""
    key = config.astype(np.int64) * 256 + byte
    lo = np.searchsorted(self.keys, key, "left")
    hi = np.searchsorted(self.keys, key, "right")
    count = hi - lo
    which = np.repeat(np.arange(len(key)), count)
    slot = np.repeat(lo - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
    return which, self.targets[slot], self.target_chunks[slot], self.target_ops[slot]


class _Interned:
  """Interned tuples (id 0: the empty one), each extended in bulk by a piece id."""

  def __init__(self):
    self.items: list[tuple] = [()]
    self.index: dict = {(): 0}

  def _extend(self, sequence: np.ndarray, piece: np.ndarray, combine) -> np.ndarray:
    """The ids of `combine(items[sequence], piece)` where piece > 0 (sequence unchanged
    elsewhere); -1 where `combine` gives None. Each distinct pair is combined once."""
    out = sequence.copy()
    todo = np.nonzero(piece > 0)[0]
    if not len(todo):
      return out
    key = sequence[todo] * (1 << 32) + piece[todo]
    unique, inverse = np.unique(key, return_inverse=True)
    ids = np.empty(len(unique), np.int64)
    for k, value in enumerate(unique.tolist()):
      combined = combine(self.items[value >> 32], value & 0xFFFFFFFF)
      if combined is None:
        ids[k] = -1
        continue
      ids[k] = self.index.setdefault(combined, len(self.index))
      if ids[k] == len(self.items):
        self.items.append(combined)
    out[todo] = ids[inverse]
    return out


class _CrossedOps(_Interned):
  """Interned sequences ((byte position, operations), ...) of the register operations a
  path's bytes cross, in order (id 0: none), extended in bulk as the walk goes deeper."""

  def __init__(self, ops: list[tuple]):
    super().__init__()
    self.ops = ops  # shared with `_Configurations`, which appends to it

  def extend(self, sequence: np.ndarray, op: np.ndarray, position: int) -> np.ndarray:
    return self._extend(sequence, op,
                        lambda prefix, o: prefix + ((position, self.ops[o]),))


class _PopSequences(_Interned):
  """Interned pop sequences (top of stack first), extended chunk by chunk in bulk."""

  def __init__(self, chunks: list[tuple[int, ...]], max_pops: int):
    super().__init__()
    self.chunks = chunks  # shared with `_Configurations`, which appends to it
    self.max_pops = max_pops
    self.dropped = 0

  def extend(self, sequence: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """The ids of sequence + chunk, or -1 where that pops more than `max_pops`."""
    def combine(prefix, c):
      combined = prefix + self.chunks[c]
      return combined if len(combined) <= self.max_pops else None
    return self._extend(sequence, chunk, combine)


def _walk(configs: _Configurations, pops: _PopSequences, trie: VocabTrie,
          origins: np.ndarray, first_bytes: np.ndarray, *, max_edges: int,
          deadline: float, what: str, crossed_ops: _CrossedOps | None = None):
  """Token edges (origin, token, end configuration, pop sequence, crossed operations)
  from the given states (the last column zeros without `crossed_ops`)."""
  start_cfg = np.array([configs.intern((int(q), ())) for q in origins.tolist()], np.int64)
  configs.expand(start_cfg)
  root = slice(trie.child_start[0], trie.child_start[1])
  root_bytes = trie.child_byte[root]
  root_nodes = trie.child_node[root]
  # Level 1: every origin with every root byte it allows.
  row, col = np.nonzero(first_bytes[:, root_bytes])
  which, cfg, chunk, op = configs.step(start_cfg[row], root_bytes[col])
  node = root_nodes[col[which]]
  origin = origins[row[which]]
  popped = np.zeros(len(cfg), np.int64)
  crossed = np.zeros(len(cfg), np.int64)
  parts, num_edges, position = [], 0, 0
  while True:
    popped = pops.extend(popped, chunk)
    if crossed_ops is not None:
      crossed = crossed_ops.extend(crossed, op, position)
    keep = popped >= 0
    if not keep.all():
      pops.dropped += int((~keep).sum())
      node, cfg, origin, popped = node[keep], cfg[keep], origin[keep], popped[keep]
      crossed = crossed[keep]
    if not len(node):
      break
    # Emit with the frontier index as "state", then look the columns up.
    found = _emit(trie, _views(trie), node, np.arange(len(node)), origin)
    if found is not None:
      src, tok, at = found
      parts.append((src, tok, cfg[at], popped[at], crossed[at]))
      num_edges += len(src)
      if num_edges > max_edges:
        raise errors.CompileBudgetError(
            f"{what} needs more than {max_edges} token edges. Expected at most "
            f"CompileOptions.max_edges={max_edges}. Raise the budget or simplify the "
            "grammar's free-text parts.")
    if time.perf_counter() > deadline:
      raise errors.CompileBudgetError(
          f"{what} exceeded its compile time budget during composition with the "
          "vocabulary. Raise CompileOptions.max_seconds or simplify the grammar.")
    configs.expand(cfg)
    pair, slot = trie.child_slots(node)
    which, cfg, chunk, op = configs.step(cfg[pair], trie.child_byte[slot])
    node, origin, popped = trie.child_node[slot[which]], origin[pair[which]], popped[pair[which]]
    crossed = crossed[pair[which]]
    position += 1
  if not parts:
    empty = np.zeros(0, np.int64)
    return empty, empty, empty, empty, empty
  return tuple(np.concatenate(column).astype(np.int64) for column in zip(*parts))


def _describe_path(rtn: Rtn, target: int) -> bytes:
  """A short byte string leading from the start to `target` (calls followed, returns not)."""
  previous = {rtn.start: None}
  queue = collections.deque([rtn.start])
  while queue:
    state = queue.popleft()
    if state == target:
      break
    steps = [(int(b), int(n)) for b, n in enumerate(rtn.transitions[state].tolist()) if n >= 0]
    steps += [(-1, rtn.rule_start[rule]) for rule, _ in rtn.calls[state]]
    for b, n in steps:
      if n not in previous:
        previous[n] = (state, b)
        queue.append(n)
  out = bytearray()
  state = target
  while previous.get(state) is not None:
    state, b = previous[state]
    if b >= 0:
      out.append(b)
  return bytes(reversed(out))


def _check_deterministic(rtn: Rtn, configs: _Configurations, pops: _PopSequences,
                         origin, token, cfg, popped, vocab_bytes):
  """Raises `NondeterministicGrammarError` if some (state, token) has paths whose pop
  sequences are compatible (one a prefix of the other: some stack allows both).

  Among the paths of one (state, token), sorted by pop sequence, a compatible pair
  exists iff some *adjacent* pair is compatible (everything sorted between a sequence
  and one it prefixes shares that prefix), so only adjacent pairs are compared.
  """
  if not len(origin):
    return
  width = max(len(p) for p in pops.items)
  padded = np.full((len(pops.items), max(width, 1)), -1, np.int64)
  for i, p in enumerate(pops.items):
    padded[i, :len(p)] = p
  lengths = np.array([len(p) for p in pops.items], np.int64)
  rank = np.empty(len(pops.items), np.int64)
  rank[np.lexsort(padded.T[::-1])] = np.arange(len(pops.items))
  key = origin * (1 << 32) + token
  order = np.lexsort((rank[popped], key))
  same = key[order][1:] == key[order][:-1]
  a, b = popped[order][:-1][same], popped[order][1:][same]
  if not len(a):
    return
  short = np.minimum(lengths[a], lengths[b])
  columns = np.arange(padded.shape[1])[None, :] < short[:, None]
  compatible = np.all((padded[a] == padded[b]) | ~columns, axis=1)
  if not compatible.any():
    return
  k = int(np.nonzero(compatible)[0][0])
  first = order[:-1][same][k]
  second = order[1:][same][k]
  q = int(origin[first])
  state_a, state_b = configs.items[int(cfg[first])][0], configs.items[int(cfg[second])][0]
  rules = sorted({rtn.rules[rtn.rule_of_state[s]] for s in (q, state_a, state_b)})
  text = vocab_bytes(int(token[first]))
  raise errors.NondeterministicGrammarError(
      f"Grammar is ambiguous at the token level in rules {rules}: after"
      f" {_describe_path(rtn, q)!r} the token {text!r} can be read in two ways"
      f" (ending in rules {rtn.rules[rtn.rule_of_state[state_a]]!r} and"
      f" {rtn.rules[rtn.rule_of_state[state_b]]!r}) under the same stack. Expected a"
      " grammar that a left-to-right parser can follow with one byte of lookahead"
      " (no two alternatives that match the same text). Make the alternatives"
      " differ, or bound the recursion to compile a regular version instead:"
      " Grammar(..., max_depth=N), or JsonSchema(..., max_ref_depth=N) for a schema.")


def compose_token_pda(
    rtn: Rtn,
    trie: VocabTrie,
    *,
    vocab_bytes,
    wide: dict | None = None,
    num_words: int = 0,
    max_pops: int = DEFAULT_MAX_POPS,
    max_pushes: int = DEFAULT_MAX_PUSHES,
    max_edges: int = 20_000_000,
    deadline: float = float("inf"),
    what: str = "The grammar",
    token_bytes=None,
) -> TokenPda:
  """The token-level PDA of `rtn` composed with the vocabulary trie.

  Args:
    rtn: From `build_rtn`.
    trie: The vocabulary trie.
    vocab_bytes: token id -> bytes, for error messages.
    wide: Wide states of `rtn.byte_dfa()` (`_wide.WideStates.find`).
    num_words: Bitmask width, ceil(V / 32).
    max_pops, max_pushes: Most symbols one token edge may pop / push.
    max_edges, deadline, what: Budgets and the name used in errors.
    token_bytes: The bytes of each token id: needed for the guards of a grammar with
      register markers (`Rtn.contracted`; `TokenPda.guards`).

  Raises:
    NondeterministicGrammarError: Some (state, token) has two paths that the same
      stack allows.
    CompileBudgetError: Too many edges or too slow.
  """
  wide = wide or {}
  q = rtn.num_states
  configs = _Configurations(rtn, max_pops, max_pushes)
  budget = dict(max_edges=max_edges, deadline=deadline, what=what)
  pops = _PopSequences(configs.chunks, max_pops)
  crossed_ops = None if rtn.contracted is None else _CrossedOps(configs.ops)
  parts = [_walk(configs, pops, part_trie, origins, first_bytes, crossed_ops=crossed_ops,
                 **budget)
           for part_trie, origins, first_bytes in walk_plan(wide, q, trie)]
  origin, token, cfg, popped, crossed = (np.concatenate(column) for column in zip(*parts))
  _check_deterministic(rtn, configs, pops, origin, token, cfg, popped, vocab_bytes)

  # Edge groups: one per (origin, pop sequence); push sequences interned.
  items = configs.items
  push_ids: dict[tuple[int, ...], int] = {(): 0}
  unique_cfg, inverse = _arrays.sorted_unique(cfg, return_inverse=True)
  cfg_target = np.array([items[int(c)][0] for c in unique_cfg], np.int64)
  cfg_push = np.array([push_ids.setdefault(items[int(c)][1], len(push_ids))
                       for c in unique_cfg], np.int64)
  pair, group_of_edge = _arrays.sorted_unique(origin * (1 << 32) + popped,
                                              return_inverse=True)
  group_ids = {(int(v >> 32), pops.items[int(v & 0xFFFFFFFF)]): g
               for g, v in enumerate(pair.tolist())}
  edge_group = group_of_edge.astype(np.int64)
  # Every state keeps a pop-free group (possibly empty): it carries terminal bits.
  for s in range(q):
    group_ids.setdefault((s, ()), len(group_ids))
  group_keys = sorted(group_ids, key=lambda k: (k[0], len(k[1]), k[1]))
  renumber = np.empty(len(group_keys), np.int64)
  for new, k in enumerate(group_keys):
    renumber[group_ids[k]] = new
  edge_group = renumber[edge_group]
  order = np.lexsort((token, edge_group))
  width = max((len(k[1]) for k in group_keys), default=0)
  group_pops = np.full((len(group_keys), width), NO_STATE, np.int32)
  for g, (_, popped) in enumerate(group_keys):
    group_pops[g, :len(popped)] = popped
  push_width = max((len(p) for p in push_ids), default=0)
  push_symbols = np.full((len(push_ids), push_width), NO_STATE, np.int32)
  push_lengths = np.zeros(len(push_ids), np.int32)
  for pushed, u in push_ids.items():
    push_symbols[u, :len(pushed)] = pushed
    push_lengths[u] = len(pushed)

  state_terminal = np.full(q, -1, np.int32)
  terminal_target = np.full(q, -1, np.int32)
  bitmaps: dict[bytes, int] = {}
  for s, edge in wide.items():
    state_terminal[s] = bitmaps.setdefault(edge.bits.tobytes(), len(bitmaps))
    terminal_target[s] = edge.target
  terminal_bits = (np.stack([np.frombuffer(b, np.uint32) for b in bitmaps]) if bitmaps
                   else np.zeros((0, num_words), np.uint32))
  token_pda = TokenPda(
      num_states=q, start=rtn.start, accepting=rtn.accepting.copy(),
      group_state=np.array([k[0] for k in group_keys], np.int32), group_pops=group_pops,
      group_num_pops=np.array([len(k[1]) for k in group_keys], np.int32),
      edge_group=edge_group[order].astype(np.int32), edge_token=token[order].astype(np.int32),
      edge_target=cfg_target[inverse][order].astype(np.int32),
      edge_push=cfg_push[inverse][order].astype(np.int32), push_symbols=push_symbols,
      push_lengths=push_lengths, terminal_bits=terminal_bits, state_terminal=state_terminal,
      terminal_target=terminal_target, dropped_paths=pops.dropped)
  if crossed_ops is None or token_bytes is None:
    return token_pda
  return dataclasses.replace(token_pda, guards=_guards(rtn, token_pda, crossed[order],
                                                       crossed_ops, token_bytes))


def _guards(rtn: Rtn, token_pda: TokenPda, crossed: np.ndarray, crossed_ops: _CrossedOps,
            token_bytes) -> "_registers.Guards":
  """The guards of `token_pda`'s explicit edges (`_registers.attach`, with the operations
  each edge's path crossed, calls and returns included, as the walk recorded them).

  Register blocks stay in the row's words while the stack works: the front ends write
  no call inside a register construct, so no push or pop happens while one is open."""
  view = _EdgeView(
      edge_source=token_pda.group_state[token_pda.edge_group],
      edge_token=token_pda.edge_token, edge_target=token_pda.edge_target,
      state_terminals=np.stack([token_pda.state_terminal, token_pda.terminal_target],
                               axis=-1)[:, None, :],
      terminal_bits=token_pda.terminal_bits)
  crossed_at = {int(i): crossed_ops.items[int(c)] for i, c in
                zip(np.flatnonzero(crossed).tolist(), crossed[crossed > 0].tolist())}
  return _registers.attach(view, np.arange(token_pda.num_states), rtn.contracted,
                           token_bytes, crossed_at=crossed_at)


@dataclasses.dataclass(frozen=True)
class _EdgeView:
  """What `_registers.attach` reads of a token automaton."""

  edge_source: np.ndarray
  edge_token: np.ndarray
  edge_target: np.ndarray
  state_terminals: np.ndarray
  terminal_bits: np.ndarray
