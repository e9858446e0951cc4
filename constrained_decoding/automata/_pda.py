"""Grammars as token-level push-down automata (Alg. 3, Appendix B.3).

A normalized grammar (`constraints/_grammar.py`: only true recursion left as rules) is
first turned into a *recursive transition network* (`_rtn.py`: one minimal byte DFA per
rule, call arcs that push a return address, returns from states final in their rule).
This module composes that network with the vocabulary.

The token-level PDA (the composition with the detokenizer, `P_G ∘ T_V`) is computed the
way `_compose.py` composes regexes: a numpy lockstep walk of the vocabulary trie, here
over *configurations* (state, symbols pushed during this token, symbols popped from the
stack below). Most token paths meet no call, return or register operation: those are
walked as a regular language first (`_pda_plain.py`), and the configuration walk only
continues the ones that reach a state where one may happen. Calls and returns are epsilon moves taken only when the next byte needs
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
from constrained_decoding.automata import _pda_plain
from constrained_decoding.automata import _registers
from constrained_decoding.automata import _rtn
from constrained_decoding.automata._byte_dfa import NO_STATE
from constrained_decoding.automata._compose import _emit
from constrained_decoding.automata._compose import _ranges
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


class _Growing:
  """An int64 array appended to in place (capacity doubled when full): the successor
  lists grow by a few entries per step, and copying them whole each time cost more
  than the steps themselves."""

  def __init__(self, initial: np.ndarray):
    self._data = initial.copy()
    self._size = len(initial)

  def extend(self, values: np.ndarray) -> None:
    end = self._size + len(values)
    if end > len(self._data):
      grown = np.empty(max(end, 2 * len(self._data), 1024), np.int64)
      grown[:self._size] = self._data[:self._size]
      self._data = grown
    self._data[self._size:end] = values
    self._size = end

  def view(self) -> np.ndarray:
    return self._data[:self._size]


class _Configurations:
  """Interned walk configurations (state, pushed) and their byte successors.

  `pushed` are the return addresses pushed since the token began (bottom first). What a
  path pops from the stack below the token is not part of the configuration (that would
  multiply configurations by every pop history): each successor instead carries the
  *chunk* of symbols its epsilon closure popped, and the walk accumulates chunks into
  pop sequences (`_PopSequences`). Successors are computed once per configuration and
  listed by (configuration, byte), with offsets per (row, byte) for numpy lookups.

  Only the epsilon closures are Python loops (a few moves per configuration); the byte
  arcs of a whole batch of closures are gathered, interned and sorted in numpy, with
  configuration ids assigned in first-seen order (closure by closure, bytes ascending).
  """

  def __init__(self, rtn: Rtn, max_pops: int, max_pushes: int):
    self.rtn = rtn
    self.max_pops = max_pops
    self.max_pushes = max_pushes
    self.items: list[tuple[int, tuple[int, ...]]] = []
    self.index: dict = {}  # pushed id * num_states + state -> configuration id
    self.states: list[int] = []  # per configuration: its state and pushed id
    self.pushes: list[int] = []
    self.pushed: list[tuple[int, ...]] = [()]
    self.pushed_index: dict = {(): 0}
    self.chunks: list[tuple[int, ...]] = [()]
    self.chunk_index: dict = {(): 0}
    # Successors, listed by (row, byte) over the expanded configurations' rows:
    # row_of[config] (-1: not expanded), row_start[row * 256 + byte] (CSR offsets).
    self.row_of = np.zeros(0, np.int64)
    self.num_rows = 0
    self._row_start = _Growing(np.zeros(1, np.int64))
    self._targets, self._target_chunks, self._target_ops = (
        _Growing(np.zeros(0, np.int64)) for _ in range(3))
    self.row_start, self.targets = self._row_start.view(), self._targets.view()
    self.target_chunks, self.target_ops = self._target_chunks.view(), self._target_ops.view()
    # The byte arcs of every state as one sorted (state, byte) list.
    transitions = rtn.transitions
    self._arc_state, self._arc_byte = np.nonzero(transitions >= 0)
    self._arc_target = transitions[self._arc_state, self._arc_byte].astype(np.int64)
    degree = np.bincount(self._arc_state, minlength=rtn.num_states)
    self._arc_start = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
    self._is_tail = (rtn.accepting & ~(transitions != NO_STATE).any(axis=1)
                     & np.array([not c for c in rtn.calls], bool))
    # Register operations read with a byte arc (`Rtn.contracted`): interned op tuples,
    # 0 for none; each successor carries the id of the arc it read.
    arc_ops = {} if rtn.contracted is None else rtn.contracted.arc_ops
    self.ops: list[tuple] = [()]
    ops_index: dict = {(): 0}
    self._arc_op = np.zeros(len(self._arc_state), np.int64)
    for (state, b), crossed in arc_ops.items():
      at = int(np.searchsorted(self._arc_byte[self._arc_start[state]:
                                              self._arc_start[state + 1]], b))
      self._arc_op[self._arc_start[state] + at] = ops_index.setdefault(crossed,
                                                                       len(ops_index))
    self.ops.extend(sorted(ops_index, key=ops_index.get)[1:])

  def intern(self, config) -> int:
    state, pushed = config
    push = self.pushed_index.setdefault(pushed, len(self.pushed_index))
    if push == len(self.pushed):
      self.pushed.append(pushed)
    key = push * self.rtn.num_states + state
    found = self.index.get(key)
    if found is None:
      found = self.index[key] = len(self.items)
      self.items.append(config)
      self.states.append(state)
      self.pushes.append(push)
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
        if self._is_tail[ret]:
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

  def _intern_many(self, state: np.ndarray, push: np.ndarray) -> np.ndarray:
    """Configuration ids of (state, pushed id) pairs, new ones numbered in order of
    first occurrence."""
    key = push * self.rtn.num_states + state
    unique, first, inverse = _arrays.sorted_unique(key, return_index=True,
                                                   return_inverse=True)
    index = self.index
    ids = np.array([index.get(k, -1) for k in unique.tolist()], np.int64)
    new = np.flatnonzero(ids < 0)
    if len(new):
      new = new[np.argsort(first[new], kind="stable")]
      ids[new] = len(self.items) + np.arange(len(new))
      pushed = self.pushed
      for k, s, p in zip(unique[new].tolist(), state[first[new]].tolist(),
                         push[first[new]].tolist()):
        index[k] = len(self.items)
        self.items.append((s, pushed[p]))
        self.states.append(s)
        self.pushes.append(p)
    return ids[inverse]

  def _cover_row_of(self) -> None:
    """Extends `row_of` with -1 (not expanded) over the configurations interned since."""
    if len(self.row_of) < len(self.items):
      self.row_of = np.concatenate(
          [self.row_of, np.full(len(self.items) - len(self.row_of), -1, np.int64)])

  def expand(self, wanted: np.ndarray) -> None:
    """Computes the successors of the configurations in `wanted` not expanded yet.

    Only configurations the walk actually reached are expanded: expanding every
    interned successor would explore all byte strings, not the vocabulary's.
    """
    self._cover_row_of()
    new = wanted[self.row_of.take(wanted) < 0]
    if not len(new):
      return
    new = _arrays.sorted_unique(new)
    # Closure elements of the new configurations, closure by closure.
    el_config, el_state, el_push, el_chunk = [], [], [], []
    chunk_index, chunks = self.chunk_index, self.chunks
    pushed_index, pushed_list = self.pushed_index, self.pushed
    items = self.items
    for c in new.tolist():
      for state, pushed, popped in self._closure(items[c]):
        chunk = chunk_index.setdefault(popped, len(chunk_index))
        if chunk == len(chunks):
          chunks.append(popped)
        push = pushed_index.setdefault(pushed, len(pushed_index))
        if push == len(pushed_list):
          pushed_list.append(pushed)
        el_config.append(c)
        el_state.append(state)
        el_push.append(push)
        el_chunk.append(chunk)
    el_state = np.array(el_state, np.int64)
    degree = self._arc_start[el_state + 1] - self._arc_start[el_state]
    element = np.repeat(np.arange(len(el_state)), degree)
    arc = (np.repeat(self._arc_start[el_state] - (np.cumsum(degree) - degree), degree)
           + np.arange(len(element)))
    config = np.array(el_config, np.int64)[element]
    target = self._intern_many(self._arc_target[arc], np.array(el_push, np.int64)[element])
    chunk = np.array(el_chunk, np.int64)[element]
    op = self._arc_op[arc]
    byte = self._arc_byte[arc].astype(np.int64)
    order = np.lexsort((op, chunk, target, byte, config))
    config, byte, target, chunk, op = (a[order] for a in (config, byte, target, chunk, op))
    distinct = np.ones(len(order), bool)
    distinct[1:] = ((config[1:] != config[:-1]) | (byte[1:] != byte[:-1])
                    | (target[1:] != target[:-1]) | (chunk[1:] != chunk[:-1])
                    | (op[1:] != op[:-1]))
    # The new configurations take the next rows, in id order, so the successor lists,
    # appended in (configuration, byte) order, stay sorted by (row, byte).
    self._cover_row_of()
    rows = self.num_rows + np.arange(len(new))
    self.row_of[new] = rows
    self.num_rows += len(new)
    flat = (self.row_of[config[distinct]] - rows[0]) * 256 + byte[distinct]
    counts = np.bincount(flat, minlength=len(new) * 256)
    self._row_start.extend(self.row_start[-1] + np.cumsum(counts))
    self._targets.extend(target[distinct])
    self._target_chunks.extend(chunk[distinct])
    self._target_ops.extend(op[distinct])
    self.row_start, self.targets = self._row_start.view(), self._targets.view()
    self.target_chunks, self.target_ops = self._target_chunks.view(), self._target_ops.view()

  def step(self, config: np.ndarray, byte: np.ndarray):
    """(which input, successor, popped chunk, operations id) for each (config, byte)
    input pair (the configurations expanded)."""
    flat = self.row_of.take(config) * 256 + byte
    which, slot = _ranges(self.row_start.take(flat), self.row_start.take(flat + 1))
    return (which, self.targets.take(slot), self.target_chunks.take(slot),
            self.target_ops.take(slot))


# A piece (chunk id, or operations id and byte position) is packed below a sequence id.
_PIECE_BITS = 40
_PIECE_MASK = (1 << _PIECE_BITS) - 1
_POSITION_BITS = 20  # Byte positions within a token, in a crossed operations piece.


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
    key = sequence[todo] * (1 << _PIECE_BITS) + piece[todo]
    unique, inverse = _arrays.sorted_unique(key, return_inverse=True)
    ids = np.empty(len(unique), np.int64)
    for k, value in enumerate(unique.tolist()):
      combined = combine(self.items[value >> _PIECE_BITS], value & _PIECE_MASK)
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

  def extend(self, sequence: np.ndarray, op: np.ndarray, position: np.ndarray) -> np.ndarray:
    """The ids of sequence + ((position, ops[op]),) where op > 0 (each path's own byte
    position: walks continued from mid-token start at several depths)."""
    if int(position.max(initial=0)) >> _POSITION_BITS:
      raise ValueError(f"A token of over {1 << _POSITION_BITS} bytes crosses a register"
                       " operation. Expected shorter tokens.")
    piece = np.where(op > 0, op << _POSITION_BITS | position, 0)
    position_mask = (1 << _POSITION_BITS) - 1
    return self._extend(sequence, piece, lambda prefix, p: prefix + (
        (p & position_mask, self.ops[p >> _POSITION_BITS]),))


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
          deadline: float, what: str, crossed_ops: _CrossedOps | None = None,
          num_edges: int = 0):
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
  return _walk_on(configs, pops, trie, root_nodes[col[which]], cfg,
                  origins[row[which]], chunk, op, max_edges=max_edges, deadline=deadline,
                  what=what, crossed_ops=crossed_ops, num_edges=num_edges)


def _continue_walks(configs: _Configurations, pops: _PopSequences, trie: VocabTrie,
                    stopped, **walk_options):
  """`_walk`'s token edges of the plain walks stopped at a special state mid-token
  ((node, state, origin) arrays, `_pda_plain.PlainStates.walk`): they go on from
  configuration (state, ()) with nothing popped, as the walk from their origin would."""
  node, state, origin = stopped
  cfg = configs._intern_many(state, np.zeros(len(state), np.int64))
  none = np.zeros(len(cfg), np.int64)
  return _walk_on(configs, pops, trie, node, cfg, origin, none, none, **walk_options)


def _walk_on(configs: _Configurations, pops: _PopSequences, trie: VocabTrie,
             node: np.ndarray, cfg: np.ndarray, origin: np.ndarray, chunk: np.ndarray,
             op: np.ndarray, *, max_edges: int, deadline: float, what: str,
             crossed_ops: _CrossedOps | None = None, num_edges: int = 0):
  """`_walk` from a frontier: each path at trie `node` in configuration `cfg`, having
  popped nothing yet, with `chunk` and `op` those of the byte that led to `node`."""
  popped = np.zeros(len(cfg), np.int64)
  crossed = np.zeros(len(cfg), np.int64) if crossed_ops is not None else None
  parts = []
  views = _views(trie)
  while True:
    popped = pops.extend(popped, chunk)
    if crossed_ops is not None and op.any():  # Read with the byte before `node`.
      crossed = crossed_ops.extend(crossed, op, trie.node_depth.take(node) - 1)
    keep = popped >= 0
    if not keep.all():
      pops.dropped += int((~keep).sum())
      node, cfg, origin, popped = node[keep], cfg[keep], origin[keep], popped[keep]
      if crossed is not None:
        crossed = crossed[keep]
    if not len(node):
      break
    # Emit with the frontier index as "state", then look the columns up.
    found = _emit(trie, views, node, np.arange(len(node)), origin)
    if found is not None:
      src, tok, at = found
      parts.append((src, tok, cfg.take(at), popped.take(at),
                    np.zeros(len(at), np.int64) if crossed is None else crossed.take(at)))
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
    which, cfg, chunk, op = configs.step(cfg.take(pair), trie.child_byte.take(slot))
    pair = pair.take(which)
    node = trie.child_node.take(slot.take(which))
    origin, popped = origin.take(pair), popped.take(pair)
    if crossed is not None:
      crossed = crossed.take(pair)
  if not parts:
    empty = np.zeros(0, np.int64)
    return empty, empty, empty, empty, empty
  return tuple(np.concatenate(column).astype(np.int64) for column in zip(*parts))


def _edge_groups(group_key: np.ndarray, num_states: int, num_pops: int, *,
                 mark_limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(distinct group keys ascending, each edge's index among them) for the edges' keys
  `state * num_pops + pop rank`, with every state's pop-free key (rank 0) added: it
  carries the state's terminal bits, possibly without edges.

  Marks a bool per possible key when there are few (`mark_limit`, by default four per
  edge plus 2**20), which needs no sort; sorts otherwise."""
  size = num_states * num_pops
  if mark_limit is None:
    mark_limit = 4 * len(group_key) + (1 << 20)
  if size <= mark_limit:
    present = np.zeros(size, bool)
    present[group_key] = True
    present[::num_pops] = True
    return np.flatnonzero(present), (np.cumsum(present) - 1).take(group_key)
  keys = _arrays.sorted_unique(
      np.concatenate([group_key, np.arange(num_states, dtype=np.int64) * num_pops]))
  return keys, np.searchsorted(keys, group_key)


def _distinct_order(key: np.ndarray) -> np.ndarray:
  """`np.argsort(key)` for distinct non-negative int64 keys: one stable sort (timsort,
  which merges the long ascending runs the walks emit) of each key with its index
  packed below it, when they fit in 63 bits (2.5x faster than `sorted_unique` on 2M
  edges); else a stable argsort."""
  index_bits = max(len(key) - 1, 1).bit_length()
  if not len(key) or int(key.max()).bit_length() + index_bits > 63:
    return np.argsort(key, kind="stable")
  packed = key << index_bits
  packed |= np.arange(len(key))
  packed.sort(kind="stable")
  packed &= (1 << index_bits) - 1
  return packed


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
  num_tokens = int(token.max()) + 1
  key = origin * num_tokens + token
  # Fast path: one sort of (origin, token, pop rank) packed in an int64 finds the
  # (origin, token) pairs with several paths; usually there are none.
  if (int(key.max()) + 1) * len(rank) < 1 << 62:
    packed = np.sort(key * len(rank) + rank[popped])
    same = packed[1:] // len(rank) == packed[:-1] // len(rank)
    if not same.any():
      return
    by_rank = np.empty(len(rank), np.int64)
    by_rank[rank] = np.arange(len(rank))
    a, b = by_rank[packed[:-1][same] % len(rank)], by_rank[packed[1:][same] % len(rank)]
    short = np.minimum(lengths[a], lengths[b])
    columns = np.arange(padded.shape[1])[None, :] < short[:, None]
    if not np.all((padded[a] == padded[b]) | ~columns, axis=1).any():
      return
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


def _token_paths(rtn: Rtn, configs: _Configurations, pops: _PopSequences, trie: VocabTrie,
                 plan: list, *, vocab_bytes, crossed_ops: _CrossedOps | None,
                 max_edges: int, deadline: float, what: str):
  """Every token edge of the walks in `plan` (`walk_plan`), as columns (origin, token,
  target state, pushed id, pop sequence id, crossed operations id), checked for
  determinism.

  Paths that meet no special state (`_pda_plain`) are walked as a regular language;
  the push-down walk takes the special origins and the plain walks stopped mid-token.
  Each of `plan`'s walks keeps its own edge budget, as one walk would.
  """
  plain = _pda_plain.PlainStates(rtn)
  plain_parts, parts = [], []
  for part_trie, origins, first_bytes in plan:
    special = plain.special.take(origins)
    edges, stopped = plain.walk(part_trie, origins[~special], first_bytes[~special],
                                max_edges=max_edges, deadline=deadline, what=what)
    plain_parts.append(edges)
    budget = dict(max_edges=max_edges, deadline=deadline, what=what, crossed_ops=crossed_ops)
    num_edges = len(edges[0])
    if special.any():
      parts.append(_walk(configs, pops, part_trie, origins[special], first_bytes[special],
                         num_edges=num_edges, **budget))
      num_edges += len(parts[-1][0])
    if len(stopped[0]):
      parts.append(_continue_walks(configs, pops, part_trie, stopped, num_edges=num_edges,
                                   **budget))
  if not parts:
    parts.append(tuple(np.zeros(0, np.int64) for _ in range(5)))
  origin, token, cfg, popped, crossed = (np.concatenate(column) for column in zip(*parts))
  _check_deterministic(rtn, configs, pops, origin, token, cfg, popped, vocab_bytes)
  plain_origin, plain_token, plain_state = (np.concatenate(column)
                                            for column in zip(*plain_parts))
  none = np.zeros(len(plain_origin), np.int64)
  return (np.concatenate([plain_origin, origin]), np.concatenate([plain_token, token]),
          np.concatenate([plain_state, np.array(configs.states, np.int64).take(cfg)]),
          np.concatenate([none, np.array(configs.pushes, np.int64).take(cfg)]),
          np.concatenate([none, popped]), np.concatenate([none, crossed]))


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
  origin, token, state, push, popped, crossed = _token_paths(
      rtn, configs, pops, trie, walk_plan(wide, q, trie), vocab_bytes=vocab_bytes,
      crossed_ops=crossed_ops, **budget)

  # Edge groups: one per (origin, pop sequence), ordered by state, then pops by length
  # and content; edges by group and token; push sequences by length and content.
  lengths = np.array([len(p) for p in pops.items], np.int64)
  pop_order = sorted(range(len(pops.items)), key=lambda i: (len(pops.items[i]), pops.items[i]))
  pop_rank = np.empty(len(pop_order), np.int64)
  pop_rank[pop_order] = np.arange(len(pop_order))  # the empty sequence first
  num_pops = len(pop_order)
  group_key = origin * num_pops + pop_rank[popped]
  group_keys, edge_group = _edge_groups(group_key, q, num_pops)
  num_tokens = int(token.max(initial=0)) + 1
  order = _distinct_order(edge_group * num_tokens + token)
  group_state = group_keys // num_pops
  group_seq = np.array(pop_order, np.int64)[group_keys % num_pops]
  width = int(lengths[group_seq].max(initial=0))
  group_pops = np.full((len(group_keys), width), NO_STATE, np.int32)
  for g in np.flatnonzero(lengths[group_seq]).tolist():
    seq = pops.items[int(group_seq[g])]
    group_pops[g, :len(seq)] = seq
  # Push rows: the empty sequence is row 0, the others by length, then content.
  pushed_ids = sorted(_arrays.sorted_unique(push[push > 0]).tolist(),
                      key=lambda i: (len(configs.pushed[i]), configs.pushed[i]))
  push_row = np.zeros(len(configs.pushed), np.int64)
  push_row[pushed_ids] = np.arange(1, len(pushed_ids) + 1)
  push_seqs = [()] + [configs.pushed[i] for i in pushed_ids]
  push_width = max((len(p) for p in push_seqs), default=0)
  push_symbols = np.full((len(push_seqs), push_width), NO_STATE, np.int32)
  push_lengths = np.zeros(len(push_seqs), np.int32)
  for u, pushed in enumerate(push_seqs):
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
      group_state=group_state.astype(np.int32), group_pops=group_pops,
      group_num_pops=lengths[group_seq].astype(np.int32),
      edge_group=edge_group[order].astype(np.int32), edge_token=token[order].astype(np.int32),
      edge_target=state.take(order).astype(np.int32),
      edge_push=push_row.take(push.take(order)).astype(np.int32),
      push_symbols=push_symbols,
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
