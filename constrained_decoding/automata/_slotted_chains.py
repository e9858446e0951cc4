r"""Counted chains with slots: a small pattern intersected with a length bound.

`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$` with `maxLength` 63 (a Kubernetes DNS label) is no
`X{n,m}`: the product with the length automaton has, per number of characters read j,
one state per state s of the pattern's own DFA P (its *slots*: here "last character
alphanumeric" and "last character '-'"). Composed state by state with a 262k-token
vocabulary each of those ~126 states gets ~33k token edges. Here:

* Lowering (`length_product`, called by the JSON Schema front end). L(P) with
  `min..max` characters is written as an `ir.Graph` numbered layer by layer: state
  j * S + s is "j characters read, P in slot s" (S slots, s = 0 the start), with only
  the states that are reachable and can still finish keeping arcs. Its language is
  that of the intersection; only the numbering is chosen, and any consumer that does
  not know about chains composes it as usual.
* Recognition (`find_slotted`). An `ir.Graph` whose arcs all go from layer j to
  layer j + 1 for some S, with one slot function f (slot, character) -> slot, whose
  arcs among the *present* cells (reachable and co-reachable in the full product of
  f with the graph's finals) are exactly the product's, over printable ASCII without
  `"` and `\` (one character = one byte = its JSON encoding). The check is on the
  graph itself, so whatever produced it, the chain is exact.
* Counting terminals (`add_slotted`). A token wholly in the chain's class K (every
  character some slot reads) takes slot s to F_t(s) (f along its characters) and
  layer j to j + c, c its characters. Tokens are grouped by (s, F_t(s)): one terminal
  per pair, target q + S * c + (F_t(s) - s) with `token_counts`' row of K, the
  existing device format. In the full product the path from a present cell to a
  present cell only crosses present cells, so a token is allowed from cell (j, s)
  iff F_t(s) is defined and (j + c, F_t(s)) is present (and live at token level): a
  filter of the counts that land on such cells, "at most r characters" when it is a
  prefix of the counts (shared with `_counting`), else a bitmap of its own.

Every other token (one that leaves the chain, `abc",`) is walked explicitly, as for
the other chains (`_embedded_chains.compile_tables`). Chains are laid out in full
(`max + 1` layers of S states: 9 bytes each), so the byte automaton grows with
`max`; what no longer grows with it are the token edges and mask rows.

Public names:
  length_product(text, min_length, max_length) -> ir.Graph or None.
  Slotted, find_slotted(graph)                 the recognized chain.
  chain_dfa(slotted)                           its byte DFA and cell layout.
  add_slotted(...)                             its counting entries.
"""

import dataclasses

import numpy as np

from constrained_decoding.automata import _loops
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.constraints import _intersect
from constrained_decoding.constraints import _ir as ir

# At most this many slots (states of the pattern's DFA).
MAX_SLOTS = 16
# At most this many cells (layers x slots) in a product written by `length_product`
# (past it, the intersection as before: its budget refuses large ones). Each cell is a
# state and, for liveness, a move per token length it may take.
MAX_CELLS = 20_000
# Fewer layers than this: plain composition (few states anyway); fewer characters in
# K: few tokens are wholly in it (as `_counting.MIN_COUNT`, `MIN_CLASS_SIZE`).
MIN_LAYERS = 8
MIN_CLASS_SIZE = 16

# One byte per character, its own JSON encoding: printable ASCII but `"` and `\`.
_SAFE = np.zeros(128, bool)
_SAFE[0x20:0x7F] = True
_SAFE[[0x22, 0x5C]] = False


def _slot_dfa(text: ir.Node) -> tuple[np.ndarray, np.ndarray] | None:
  """(f int64 [S, 128], accepting bool [S]): the minimal DFA of L(text) without a
  sink, slot 0 the start; None past `MAX_SLOTS` or outside the safe characters."""
  try:
    arcs, finals, start = _intersect._nfa(text)  # pylint: disable=protected-access
  except ValueError:
    return None
  sets = [frozenset((start,))]
  index = {sets[0]: 0}
  rows = []
  k = 0
  while k < len(sets):
    out = [(t, r) for q in sets[k] for t, r in arcs[q]]
    row = np.full(128, -1, np.int64)
    for lo, hi in _intersect._cells([r for _, r in out]):  # pylint: disable=protected-access
      target = frozenset(t for t, r in out
                         if _intersect._covers(r, (lo, hi)))  # pylint: disable=protected-access
      if not target:
        continue
      if hi >= 128 or not _SAFE[lo:hi + 1].all():
        return None
      j = index.get(target)
      if j is None:
        if len(sets) >= 4 * MAX_SLOTS:
          return None
        j = index[target] = len(sets)
        sets.append(target)
      row[lo:hi + 1] = j
    rows.append(row)
    k += 1
  f = np.stack(rows)
  accepting = np.array([bool(s & finals) for s in sets])
  # Moore minimization (no sink: -1 stays -1, a class of its own).
  block = accepting.astype(np.int64)
  while True:
    target_block = np.where(f >= 0, block[np.maximum(f, 0)], -1)
    keys = np.concatenate([block[:, None], target_block], axis=1)
    _, new = np.unique(keys, axis=0, return_inverse=True)
    new = new.reshape(-1)
    if len(np.unique(new)) == len(np.unique(block)):
      break
    block = new
  # Renumber blocks in order of first state (so the start's block is 0).
  order = {}
  for b in block.tolist():
    order.setdefault(b, len(order))
  block = np.array([order[b] for b in block.tolist()], np.int64)
  s = len(order)
  if s > MAX_SLOTS:
    return None
  f_min = np.full((s, 128), -1, np.int64)
  acc_min = np.zeros(s, bool)
  for q in range(len(sets)):
    f_min[block[q]] = np.where(f[q] >= 0, block[np.maximum(f[q], 0)], -1)
    acc_min[block[q]] = accepting[q]
  return f_min, acc_min


def _present(f: np.ndarray, final_cells: np.ndarray) -> np.ndarray:
  """bool [L + 1, S]: the cells of the full product of `f` with layers 0..L reachable
  from (0, 0) and co-reachable to `final_cells` (bool [L + 1, S])."""
  layers, s = final_cells.shape
  defined = f >= 0
  reach = np.zeros((layers, s), bool)
  reach[0, 0] = True
  for j in range(layers - 1):
    reach[j + 1, np.unique(f[reach[j]][defined[reach[j]]])] = True
  co = final_cells.copy()
  safe = np.maximum(f, 0)
  for j in range(layers - 2, -1, -1):
    co[j] |= (defined & co[j + 1][safe]).any(axis=1)
  return reach & co


def _class_of(f: np.ndarray) -> ir.CharClass:
  chars = np.flatnonzero((f >= 0).any(axis=0))
  return ir.char_class((int(c), int(c)) for c in chars)


def length_product(text: ir.Node, min_length: int, max_length: int) -> ir.Graph | None:
  """L(text) restricted to `min_length..max_length` characters, as a layered `ir.Graph`
  (see the module doc), or None when `text` does not suit a slotted chain (then the
  caller intersects as usual): characters outside printable ASCII (or a quote or a
  backslash), more than `MAX_SLOTS` slots, fewer than `MIN_LAYERS` layers or more than
  `MAX_CELLS` cells, or a class of fewer than `MIN_CLASS_SIZE` characters."""
  if max_length < MIN_LAYERS:
    return None
  dfa = _slot_dfa(text)
  if dfa is None:
    return None
  f, accepting = dfa
  s = len(accepting)
  if (max_length + 1) * s > MAX_CELLS or int((f >= 0).any(axis=0).sum()) < MIN_CLASS_SIZE:
    return None
  final_cells = np.zeros((max_length + 1, s), bool)
  final_cells[min_length:] = accepting
  present = _present(f, final_cells)
  if not present[0, 0]:
    return None
  labels = {}
  for a in range(s):
    for b in np.unique(f[a][f[a] >= 0]).tolist():
      chars = np.flatnonzero(f[a] == b)
      labels[a, b] = ir.char_class((int(c), int(c)) for c in chars)
  arcs = []
  for j in range(max_length):
    for a in np.flatnonzero(present[j]).tolist():
      for b in np.unique(f[a][f[a] >= 0]).tolist():
        if present[j + 1, b]:
          arcs.append((j * s + a, labels[a, b], (j + 1) * s + b))
    if len(arcs) > 4 * MAX_CELLS:
      return None
  finals = tuple(int(k) for k in np.flatnonzero((present & final_cells).reshape(-1)))
  return ir.Graph(num_states=(max_length + 1) * s, arcs=tuple(arcs), finals=finals)


@dataclasses.dataclass(frozen=True, eq=False)
class Slotted:
  """A recognized slotted chain.

  Attributes:
    num_slots: S.
    length: L, the last layer.
    slot_next: int64 `[S, 128]`: f (slot, character) -> slot, -1 for none.
    accepting: bool `[L + 1, S]`: the present cells where the text may end.
    present: bool `[L + 1, S]`: reachable and co-reachable cells.
    char_class: K, the characters some slot reads.
  """

  num_slots: int
  length: int
  slot_next: np.ndarray
  accepting: np.ndarray
  present: np.ndarray
  char_class: ir.CharClass


def may_be_slotted(graph: ir.Graph) -> bool:
  """False for graphs `find_slotted` refuses on sight (too few states, a label that is
  not a character class): O(arcs), no hashing of labels."""
  return (graph.num_states > MIN_LAYERS and bool(graph.arcs)
          and all(isinstance(label, ir.CharClass) for _, label, _ in graph.arcs))


def find_slotted(graph: ir.Graph) -> Slotted | None:
  """The slotted chain `graph` is (see the module doc), or None."""
  n = graph.num_states
  arcs = graph.arcs
  if not arcs or not all(isinstance(label, ir.CharClass) and label.ranges
                         for _, label, _ in arcs):
    return None
  for _, label, _ in arcs:
    for lo, hi in label.ranges:
      if hi >= 128 or not _SAFE[lo:hi + 1].all():
        return None
  src = np.array([a for a, _, _ in arcs], np.int64)
  dst = np.array([b for _, _, b in arcs], np.int64)
  for s in range(1, MAX_SLOTS + 1):
    if n % s or n // s - 1 < MIN_LAYERS:
      continue
    if not np.array_equal(dst // s, src // s + 1):
      continue
    found = _verify(graph, s, src, dst)
    if found is not None:
      return found
  return None


def _verify(graph: ir.Graph, s: int, src: np.ndarray, dst: np.ndarray) -> Slotted | None:
  layers = graph.num_states // s
  f = np.full((s, 128), -1, np.int64)
  chars_of = []
  for (a, label, b) in graph.arcs:
    chars = np.concatenate([np.arange(lo, hi + 1) for lo, hi in label.ranges])
    chars_of.append(chars)
    old = f[a % s, chars]
    if ((old >= 0) & (old != b % s)).any():
      return None  # Not one slot function (or not deterministic).
    f[a % s, chars] = b % s
  if int((f >= 0).any(axis=0).sum()) < MIN_CLASS_SIZE:
    return None
  final_cells = np.zeros(layers * s, bool)
  final_cells[list(graph.finals)] = True
  final_cells = final_cells.reshape(layers, s)
  present = _present(f, final_cells)
  if not present[0, 0]:
    return None
  # The graph's arcs among present cells must be exactly the product's.
  flat = present.reshape(-1)
  got = np.zeros((layers, s, 128), bool)
  for a, b, chars in zip(src.tolist(), dst.tolist(), chars_of):
    if flat[a] and flat[b]:
      got[a // s, a % s, chars] = True
  want = np.zeros((layers, s, 128), bool)
  safe = np.maximum(f, 0)
  # Layer j, slot a, character c: (j + 1, f(a, c)) is present.
  want[:-1] = present[:-1, :, None] & (f >= 0)[None] & present[1:][:, safe]
  if not np.array_equal(got, want):
    return None
  return Slotted(num_slots=s, length=layers - 1, slot_next=f,
                 accepting=present & final_cells, present=present, char_class=_class_of(f))


def chain_dfa(slotted: Slotted) -> tuple[ByteDfa, np.ndarray]:
  """(byte DFA of the chain, cell int64 `[L + 1, S]`: its state at each layer and slot,
  -1 where none). States are the present cells, layer by layer; (0, 0) is the start."""
  present, s = slotted.present, slotted.num_slots
  layers = slotted.length + 1
  cell = np.full((layers, s), -1, np.int64)
  cell[present] = np.arange(int(present.sum()))
  q = int(present.sum())
  trans = np.full((q, 256), NO_STATE, np.int32)
  f = slotted.slot_next
  safe = np.maximum(f, 0)
  js, slots = np.nonzero(present[:-1])
  trans[cell[js, slots], :128] = np.where(f[slots] >= 0, cell[js[:, None] + 1, safe[slots]], -1)
  accepting = np.zeros(q, bool)
  accepting[cell[slotted.accepting]] = True
  return ByteDfa(transitions=trans, accepting=accepting, start=int(cell[0, 0])), cell


def _final_slots(slotted: Slotted, counts, vocab) -> np.ndarray:
  """int64 [S, N]: the slot each token wholly in K (`counts.counts > 0`, in id order)
  ends in from each slot, -1 for none (cached per slot function)."""
  key = ("slotted", slotted.slot_next.tobytes())
  hit = counts.inner.get(key)
  if hit is not None:
    return hit
  wholly = np.flatnonzero(counts.counts > 0)
  data = [vocab.token_bytes[t] for t in wholly.tolist()]
  width = max((len(d) for d in data), default=0)
  table = np.frombuffer(b"".join(d.ljust(width, b"\0") for d in data),
                        np.uint8).reshape(-1, width).astype(np.int64) if width else (
                            np.zeros((len(data), 0), np.int64))
  length = np.array([len(d) for d in data], np.int64)
  s = slotted.num_slots
  # Slot s reads row s; row S is "no slot" and stays there.
  f = np.full((s + 1, 256), s, np.int64)
  f[:s, :128] = np.where(slotted.slot_next >= 0, slotted.slot_next, s)
  state = np.repeat(np.arange(s, dtype=np.int64)[:, None], len(data), axis=1)
  for p in range(width):
    going = p < length
    state[:, going] = f[state[:, going], table[going, p][None, :]]
  out = np.where(state < s, state, -1)
  counts.inner[key] = out
  return out


def add_slotted(counting, slotted: Slotted, cell: np.ndarray, counts, vocab,
                usable: np.ndarray, entries_of: dict | None, moves: list) -> None:
  """Adds to `counting` the terminals of the chain (one per (slot, slot after) pair),
  to `entries_of` (state -> [(terminal, filter)], when not None) the entries of the
  `usable` cells (bool `[L + 1, S]`: present, and live for the tokens), and to `moves`
  (sources, targets) arrays: a move per cell and count a token may take (for liveness).

  `cell` is `[L + 1, S]` in the composed DFA's numbering; `counts` the
  `_counting._ClassCounts` of K.
  """
  from constrained_decoding.automata import _counting  # pylint: disable=g-import-not-at-top

  klass, w, s = slotted.char_class, counting.num_words, slotted.num_slots
  if klass not in counting.class_rows:
    counting.class_rows[klass] = len(counting.class_counts)
    counting.class_counts.append(counts.counts)
  row = counting.class_rows[klass]
  wholly = np.flatnonzero(counts.counts > 0)
  token_count = counts.counts[wholly].astype(np.int64)
  final = _final_slots(slotted, counts, vocab)
  max_count = int(counts.counts.max(initial=0))
  fkey = slotted.slot_next.tobytes()
  terminals = {}  # (slot, slot after) -> (terminal, sorted distinct counts)
  for a in range(s):
    for b in range(s):
      tokens = wholly[final[a] == b]
      if not len(tokens):
        continue
      t = counting._get(("slotted", klass, fkey, s, a, b),  # pylint: disable=protected-access
                        lambda tokens=tokens: _loops.token_bits(tokens, w), (row, s, b - a))
      terminals[a, b] = (t, np.unique(token_count[final[a] == b]))

  def filter_of(allowed: np.ndarray, every: np.ndarray) -> int:
    if len(allowed) == len(every):
      return -1
    r = int(allowed.max())
    if np.array_equal(allowed, every[every <= r]):
      if r >= max_count:
        return -1
      return counting._get(("filter", klass, r),  # pylint: disable=protected-access
                           lambda: _counting._bitmap(counts, r, w),  # pylint: disable=protected-access
                           (-1, -1, -1))
    key = ("count set", klass, allowed.tobytes())
    return counting._get(key, lambda: _loops.token_bits(  # pylint: disable=protected-access
        np.flatnonzero(np.isin(counts.counts, allowed)), w), (-1, -1, -1))

  # Per terminal (a, b), vectorized over layers: which of its counts land on usable
  # cells, one filter per distinct pattern of them.
  layers = slotted.length + 1
  listed: dict[int, list] = {}
  for (a, b), (t, every) in terminals.items():
    rows = np.flatnonzero(usable[:, a])
    if not len(rows):
      continue
    to = rows[:, None] + every[None, :]  # [rows, counts]: the layer each count lands on
    lands = (to < layers) & usable[np.minimum(to, layers - 1), b]
    patterns, which = np.unique(lands, axis=0, return_inverse=True)
    which = which.reshape(-1)
    filters = [filter_of(every[p], every) if p.any() else None for p in patterns]
    sources, targets = cell[rows, a], cell[np.minimum(to, layers - 1), b]
    for k in np.flatnonzero(lands.any(axis=1)).tolist():
      listed.setdefault(int(sources[k]), []).append((t, filters[which[k]]))
    ks, cs = np.nonzero(lands)
    moves.append((sources[ks], targets[ks, cs]))
  if entries_of is not None:
    entries_of.update(listed)
