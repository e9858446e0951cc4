"""Lockstep walks of the vocabulary trie and a byte DFA: the token edges they find.

Each frontier pair (trie node, DFA state, origin) stands for the bytes from the root to
the node read from `origin` into `state`; a walk steps every pair to each child byte the
DFA allows and emits an edge (origin, token, state) for every token a node spells. Wide
frontiers step in numpy (about 20 calls per level whatever their size), narrow ones (the
deep tails of long tokens) in plain Python. Composition (`_compose.py`), fragments
(`_splice.py`), counted chains and the pushdown compiler build on these walks.
"""

import functools
import time
import weakref

import numpy as np

from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._detokenizer import VocabTrie
from constrained_decoding.errors import CompileBudgetError

# A frontier of at most this many (node, state) pairs is stepped in plain Python: a
# numpy step costs ~25 us whatever its size, and the deep levels of a walk (the tails of
# long tokens) hold only a few pairs each.
_PY_FRONTIER = 24


# A frontier of at least this many pairs has its tokens emitted at once (`_emit`'s ~10
# numpy calls are nothing next to it); smaller ones are emitted together at the end.
_EMIT_AT_ONCE = 4096

# `_TrieViews.node_token` of a node spelling several tokens (ids with the same bytes).
_SEVERAL_TOKENS = -2

# A `stop_at` state no walk reaches.
_NEVER = 2**31 - 1


class _TrieViews:
  """Per-trie arrays for the walks: packed arrays for numpy steps (fewer gathers per
  level), memoryviews for Python steps; each built on first use (a terminal's sub-trie
  read from disk often only needs `_emit`'s).

  Indexing a memoryview gives a Python int (~40 ns), far cheaper than a numpy scalar.
  """

  def __init__(self, trie: VocabTrie):
    self._trie = weakref.ref(trie)  # `_VIEWS` values must not keep their keys alive.
    self.token_count = np.diff(trie.token_start).astype(np.int32)
    self._arange = np.arange(1024, dtype=np.int32)
    # The token a node spells, -1 for none, `_SEVERAL_TOKENS` for more than one.
    self.node_token = np.full(trie.num_nodes, -1, np.int32)
    one = np.flatnonzero(self.token_count == 1)
    self.node_token[one] = trie.token_ids[trie.token_start[one]]
    self.node_token[self.token_count > 1] = _SEVERAL_TOKENS
    # One more than the largest token id (bounds sort keys made of token ids).
    self.token_span = int(trie.token_ids.max()) + 1 if len(trie.token_ids) else 1

  # One past the last child slot, and the number of children, of each node; int64,
  # which `np.repeat` takes as counts without a conversion.
  @functools.cached_property
  def child_end(self) -> np.ndarray:
    return self._trie().child_start[1:].astype(np.int64)

  @functools.cached_property
  def child_count(self) -> np.ndarray:
    return np.diff(self._trie().child_start).astype(np.int64)

  @functools.cached_property
  def slot_code(self) -> np.ndarray:
    """Child node << 8 | edge byte per slot: one gather gives both."""
    trie = self._trie()
    code_type = np.int32 if trie.num_nodes < 1 << 23 else np.int64
    return (trie.child_node.astype(code_type) << 8) | trie.child_byte

  def _memoryview(self, name: str, dtype) -> memoryview:
    return memoryview(np.ascontiguousarray(getattr(self._trie(), name), dtype))

  @functools.cached_property
  def child_start(self) -> memoryview:
    return self._memoryview("child_start", np.int32)

  @functools.cached_property
  def child_byte(self) -> memoryview:
    return self._memoryview("child_byte", np.uint8)

  @functools.cached_property
  def child_node(self) -> memoryview:
    return self._memoryview("child_node", np.int32)

  @functools.cached_property
  def token_start(self) -> memoryview:
    return self._memoryview("token_start", np.int32)

  @functools.cached_property
  def token_ids(self) -> memoryview:
    return self._memoryview("token_ids", np.int32)

  @functools.cached_property
  def root_bytes(self) -> np.ndarray:
    """The root's child bytes (ascending), int64."""
    trie = self._trie()
    return trie.child_byte[trie.child_start[0]:trie.child_start[1]].astype(np.int64)

  @functools.cached_property
  def root_is_every_byte(self) -> bool:
    """Whether the root's child bytes are all 256, in order (`root_bytes` = arange)."""
    return len(self.root_bytes) == 256 and bool((self.root_bytes == np.arange(256)).all())

  @functools.cached_property
  def root_nodes(self) -> np.ndarray:
    """The root's child nodes, int32, aligned with `root_bytes`."""
    trie = self._trie()
    return trie.child_node[trie.child_start[0]:trie.child_start[1]].astype(np.int32)

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
  token = views.node_token.take(node)
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
  Python-level wrappers of their `np.` functions (~0.4 us each). Gathers by int32
  indices are `take`s: indexing with them goes through numpy's casting iterator, 1.5-4x
  slower (numpy 2.4).
  """
  count = views.child_count.take(node)
  ends = np.add.accumulate(count)
  # Slot of output position p of pair i: child_end[i] - ends[i] + p.
  slot = views.child_end.take(node)
  slot -= ends
  slot = slot.repeat(count)
  slot += views.arange(int(ends[-1]))
  code = views.slot_code.take(slot)
  nxt = row.repeat(count)
  nxt += code & 255
  nxt = flat.take(nxt)
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
      # The grown frontier was not checked against `stop_at` yet: back to the top.
      continue
    if len(node) >= _EMIT_AT_ONCE:  # Large: emitted now, not copied into a concatenation.
      edges = _emit(trie, views, node, row >> 8, origin)
      if edges is not None:
        parts.append(edges)
        num_edges += len(edges[0])
    else:
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


def _root_frontier(dfa: ByteDfa, trie: VocabTrie, origins: np.ndarray,
                   first_bytes: np.ndarray | None = None):
  """The frontier after one byte from each origin: (node, state, origin) int32 arrays.

  `first_bytes` (bool `[len(origins), 256]`) limits each origin to tokens whose first
  byte it allows.
  """
  # Level 1 straight from the DFA table: (q, b) with a transition and a root child b.
  # The rows and columns are gathered in the cheaper order (a terminal's sub-trie has a
  # few root bytes; the full trie all 256, in order: no column gather at all).
  views = _views(trie)
  origins = np.asarray(origins)
  table, columns = dfa.transitions, views.root_bytes
  width = len(columns)
  every_byte = views.root_is_every_byte
  if every_byte:
    next_state = table.take(origins, axis=0)
  elif len(origins) * table.shape[1] <= table.shape[0] * width:
    next_state = table.take(origins, axis=0).take(columns, axis=1)
  else:
    next_state = table.take(columns, axis=1).take(origins, axis=0)
  if first_bytes is not None:
    allowed = first_bytes if every_byte else first_bytes.take(columns, axis=1)
    next_state = np.where(allowed, next_state, NO_STATE)
  # Row-major flat positions (as `nonzero` orders them): 1-D gathers, not 2-D indexing.
  at = (next_state != NO_STATE).reshape(-1).nonzero()[0]
  row, column = np.divmod(at, width)
  return (views.root_nodes.take(column), next_state.reshape(-1).take(at),
          origins.take(row).astype(np.int32, copy=False))


def _walk(dfa: ByteDfa, trie: VocabTrie, origins: np.ndarray, *, max_edges: int,
          deadline: float, what: str, first_bytes: np.ndarray | None = None):
  """All token edges (q, t, q') of the byte DFA composed with the trie, for q in origins,
  as a list of (source, token, target) arrays.

  `first_bytes` (bool `[len(origins), 256]`) limits each origin to tokens whose first
  byte it allows.
  """
  return _walk_frontier(dfa.transitions, trie, *_root_frontier(dfa, trie, origins, first_bytes),
                        max_edges=max_edges, deadline=deadline, what=what)



def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(which, index): every index in lo[k]..hi[k]-1 for each k, and its k."""
  counts = hi - lo
  return np.repeat(np.arange(len(lo)), counts), _spans(lo, counts)


def _spans(lo: np.ndarray, counts: np.ndarray) -> np.ndarray:
  """Every index in lo[k]..lo[k]+counts[k]-1, k ascending (`_ranges` without `which`)."""
  ends = counts.cumsum()
  index = (lo - (ends - counts)).repeat(counts)
  index += np.arange(len(index))
  return index



def _concatenate_columns(parts: list) -> tuple[np.ndarray, ...]:
  """Column-wise concatenation of (a, b, c, ...) array tuples, as int32 arrays."""
  return tuple(np.concatenate(column, dtype=np.int32) for column in zip(*parts))

