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
  not know about chains composes it as usual. Characters are code points (any, but
  surrogates); the front end then encodes the labels as JSON (`_json_values.encode_text`).
* Recognition (`find_slotted`). An `ir.Graph` whose arcs all go from layer j to
  layer j + 1 for some S, whose labels are each one character of a code point set
  (a `CharClass`, or the canonical JSON encoding of a set: its literal characters and
  the escapes of `"`, `\` and control characters, as `encode_text` writes them), with
  one slot function f (slot, code point) -> slot over the *atoms* (ranges of code
  points no label splits), whose arcs among the *present* cells (reachable and
  co-reachable in the full product of f with the graph's finals) are exactly the
  product's. The check is on the graph itself, so whatever produced it, the chain is
  exact.
* Byte layout (`chain_dfa`). A character is one or more bytes (UTF-8, an escape
  `\n` or `\u001f`): per slot a, a decoder DFA reads one character from a and ends in
  the slot it leads to; its inner states (inside a character) are columns S.. of the
  layer, after the S slot columns (stride = S + all inner states).
* Counting terminals (`_slotted_counting.add_slotted`). K is the set of characters written literally
  (the chain's class; escaped ones are not in K). A token wholly in K takes slot s to
  F_t(s) (f along its code points) and layer j to j + c, c its characters: one terminal
  per pair (s, F_t(s)), target q + stride * c + (F_t(s) - s) with `token_counts`' row of
  K, the existing device format. From an inner state x of slot a inside an escape
  (after `\`, `\u00`), a token wholly in K (`nthe`, `1fab`) finishes the escape after
  its first i characters into slot b and goes on in K from b to b': one terminal per
  (a, x, i, b'), target q + stride * (1 + c - i) + bias; tokens ending inside the escape
  (`00` after `\u`) one per (a, x, x'). In the full product the path from a present
  cell to a present cell only crosses present cells, so a token is allowed iff the cell
  it lands on is present (and live at token level): a filter of the counts that land on
  such cells, "at most r characters" when it is a prefix of the counts (a bound,
  `tables.AT_MOST - r`: no bitmap), else a bitmap of its own.

Every other token (one that leaves the chain, `abc",`, or holds an escape or part of a
character) is walked explicitly, as for the other chains
(`_embedded_chains.compile_tables`). Chains are laid out in full (`max + 1` layers of
stride states: 9 bytes each), so the byte automaton grows with `max`; what no longer
grows with it are the counted tokens' edges and mask rows.

Public names:
  length_product(text, min_length, max_length) -> ir.Graph or None.
  Slotted, find_slotted(graph)                 the recognized chain.
  chain_dfa(slotted)                           its byte DFA and cell layout.
(Its counting entries: `_slotted_counting.add_slotted`.)
"""

import dataclasses
import functools
import itertools
import json

import numpy as np

from constrained_decoding.automata import _fsa
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.constraints import _intersect
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_values as jv

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
# At most this many atoms (code point ranges no label splits; `\p{L}` has ~1,300), cells
# times atoms (the recognition's arrays), and inner states of one slot's character
# decoder (UTF-8 and escapes of `.`: ~20; of `\p{L}`: ~280).
MAX_ATOMS = 4096
MAX_CELL_ATOMS = 8_000_000
MAX_INNER = 512
# At most this many states in a chain's byte layout (slots and inner states of every
# layer; 1 KiB each in the byte DFA): `CompileOptions.max_states`' default. Past it,
# plain composition and its budgets.
MAX_CHAIN_STATES = 100_000
# Bytes of a character's encoding at most (`\u001f`: 6); tokens are walked this far
# from a state inside a character.
_MAX_CHARACTER_BYTES = 6
_SURROGATES = ((ir.SURROGATES[0], ir.SURROGATES[1]),)
# Code points a JSON string escapes (controls, `"`, `\\`): atoms never straddle them.
_SPECIAL = ((0, 0x1F), (0x22, 0x22), (0x5C, 0x5C))


def _atoms_of(range_lists) -> np.ndarray:
  """int64 [A + 1]: the bounds of the atoms (`_intersect._cells`) of `range_lists`."""
  cells = _intersect._cells(list(range_lists) + [_SURROGATES, _SPECIAL])  # pylint: disable=protected-access
  return np.array([lo for lo, _ in cells] + [ir.MAX_CODE_POINT + 1], np.int64)


def _atom_mask(bounds: np.ndarray, ranges) -> np.ndarray:
  """bool [A]: the atoms inside `ranges` (which no atom straddles)."""
  out = np.zeros(len(bounds) - 1, bool)
  for lo, hi in ranges:
    out[np.searchsorted(bounds, lo, "right") - 1:np.searchsorted(bounds, hi, "right")] = True
  return out


def _ranges_of(bounds: np.ndarray, mask: np.ndarray) -> tuple:
  return ir.normalize_ranges([(int(bounds[k]), int(bounds[k + 1]) - 1)
                              for k in np.flatnonzero(mask).tolist()])


def _slot_dfa(text: ir.Node) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
  """(atom bounds int64 [A + 1], f int64 [S, A], accepting bool [S]): the minimal DFA of
  L(text) over code points (surrogates read nothing) without a sink, slot 0 the start;
  None past `MAX_SLOTS` or `MAX_ATOMS`."""
  try:
    arcs, finals, start = _intersect._nfa(text)  # pylint: disable=protected-access
  except ValueError:
    return None
  bounds = _atoms_of(r for out in arcs for _, r in out if r is not None)
  if len(bounds) - 1 > MAX_ATOMS:
    return None
  num_atoms = len(bounds) - 1
  surrogate = _atom_mask(bounds, _SURROGATES)
  sets = [frozenset((start,))]
  index = {sets[0]: 0}
  rows = []
  k = 0
  while k < len(sets):
    out = [(t, _atom_mask(bounds, r)) for q in sets[k] for t, r in arcs[q] if r is not None]
    row = np.full(num_atoms, -1, np.int64)
    if out:
      targets, masks = zip(*out)
      masks = np.stack(masks) & ~surrogate[None, :]
      for pattern in np.unique(masks, axis=1).T:
        if not pattern.any():
          continue
        target = frozenset(t for t, m in zip(targets, pattern.tolist()) if m)
        j = index.get(target)
        if j is None:
          if len(sets) >= 4 * MAX_SLOTS:
            return None
          j = index[target] = len(sets)
          sets.append(target)
        row[(masks == pattern[:, None]).all(axis=0)] = j
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
  f_min = np.full((s, num_atoms), -1, np.int64)
  acc_min = np.zeros(s, bool)
  for q in range(len(sets)):
    f_min[block[q]] = np.where(f[q] >= 0, block[np.maximum(f[q], 0)], -1)
    acc_min[block[q]] = accepting[q]
  return bounds, f_min, acc_min


def _present(f: np.ndarray, final_cells: np.ndarray) -> np.ndarray:
  """bool [L + 1, S]: the cells of the full product of `f` with layers 0..L reachable
  from (0, 0) and co-reachable to `final_cells` (bool [L + 1, S])."""
  layers, s = final_cells.shape
  succ = np.zeros((s, s), bool)  # succ[a, b]: some atom takes slot a to slot b.
  a, c = np.nonzero(f >= 0)
  succ[a, f[a, c]] = True
  reach = np.zeros((layers, s), bool)
  reach[0, 0] = True
  for j in range(layers - 1):
    reach[j + 1] = succ[reach[j]].any(axis=0)
  co = final_cells.copy()
  for j in range(layers - 2, -1, -1):
    co[j] |= (succ & co[j + 1]).any(axis=1)
  return reach & co


def _class_size(bounds: np.ndarray, mask: np.ndarray) -> int:
  return int((bounds[1:] - bounds[:-1])[mask].sum())


def length_product(text: ir.Node, min_length: int, max_length: int) -> ir.Graph | None:
  """L(text) restricted to `min_length..max_length` characters, as a layered `ir.Graph`
  over code points (see the module doc), or None when `text` does not suit a slotted
  chain (then the caller intersects as usual): more than `MAX_SLOTS` slots, fewer than
  `MIN_LAYERS` layers or more than `MAX_CELLS` cells, or fewer than `MIN_CLASS_SIZE`
  characters read."""
  if max_length < MIN_LAYERS:
    return None
  dfa = _slot_dfa(text)
  if dfa is None:
    return None
  bounds, f, accepting = dfa
  s = len(accepting)
  if ((max_length + 1) * s > MAX_CELLS or (max_length + 1) * s * f.shape[1] > MAX_CELL_ATOMS
      or _class_size(bounds, (f >= 0).any(axis=0)) < MIN_CLASS_SIZE):
    return None
  final_cells = np.zeros((max_length + 1, s), bool)
  final_cells[min_length:] = accepting
  present = _present(f, final_cells)
  if not present[0, 0]:
    return None
  labels = {}
  for a in range(s):
    for b in np.unique(f[a][f[a] >= 0]).tolist():
      labels[a, b] = ir.char_class(_ranges_of(bounds, f[a] == b))
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
class Decoder:
  """One slot's reading of one character, byte by byte.

  Attributes:
    next: int64 `[1 + n, 256]`: from the slot (row 0) or inner state k (row k, 1..n),
      the inner state a byte leads to (1..n), `n + 1 + b` for a character finished into
      slot b, or -1.
    num_inner: n.
  """

  next: np.ndarray
  num_inner: int


@dataclasses.dataclass(frozen=True, eq=False)
class Slotted:
  r"""A recognized slotted chain.

  Attributes:
    num_slots: S.
    length: L, the last layer.
    bounds: int64 `[A + 1]`: the atoms' code point bounds (atom k is
      `bounds[k]..bounds[k + 1] - 1`).
    slot_next: int64 `[S, A]`: f (slot, atom) -> slot, -1 for none.
    accepting: bool `[L + 1, S]`: the present cells where the text may end.
    present: bool `[L + 1, S]`: reachable and co-reachable cells.
    char_class: K, the characters some slot reads written literally (in a JSON
      encoding, the escaped ones are not in K).
    escaped: Whether the labels are JSON encodings (`"`, `\` and controls escaped);
      False: every character is its UTF-8 bytes.
    decoders: Each slot's `Decoder`.
  """

  num_slots: int
  length: int
  bounds: np.ndarray
  slot_next: np.ndarray
  accepting: np.ndarray
  present: np.ndarray
  char_class: ir.CharClass
  escaped: bool
  decoders: tuple

  @property
  def stride(self) -> int:
    """States per layer: the slots, then each slot's inner states."""
    return self.num_slots + sum(d.num_inner for d in self.decoders)

  def inner_column(self, slot: int) -> int:
    """Column of inner state 1 of `slot`'s decoder (inner state k: this + k - 1)."""
    return self.num_slots + sum(d.num_inner for d in self.decoders[:slot])


def may_be_slotted(graph: ir.Graph) -> bool:
  """False for graphs `find_slotted` refuses on sight (too few or too many states, a
  label that is neither a character class nor a union, arcs that do not go from one
  layer to the next for any number of slots): O(arcs), no hashing of labels."""
  if (graph.num_states <= MIN_LAYERS or graph.num_states > MAX_CELLS or not graph.arcs
      or len(graph.arcs) > 4 * MAX_CELLS * MAX_SLOTS
      or not all(isinstance(label, (ir.CharClass, ir.Union)) for _, label, _ in graph.arcs)):
    return False
  return bool(_layerings(graph))


def _layerings(graph: ir.Graph) -> list[tuple[int, np.ndarray, np.ndarray]]:
  """(S, sources, targets) for each number of slots S whose layers the arcs respect."""
  src = np.array([a for a, _, _ in graph.arcs], np.int64)
  dst = np.array([b for _, _, b in graph.arcs], np.int64)
  n = graph.num_states
  return [(s, src, dst) for s in range(1, MAX_SLOTS + 1)
          if n % s == 0 and n // s - 1 >= MIN_LAYERS
          and np.array_equal(dst // s, src // s + 1)]


def _strings(node: ir.Node, limit: int = 64) -> list[bytes] | None:
  """The finite language of `node` (bytes, ASCII classes, concatenations, unions) as a
  list, or None when it is something else or larger than `limit`."""
  match node:
    case ir.Bytes(data):
      return [data]
    case ir.CharClass(ranges) if ranges and ranges[-1][1] < 0x80:
      out = [bytes([c]) for lo, hi in ranges for c in range(lo, hi + 1)]
      return out if len(out) <= limit else None
    case ir.Concat(parts):
      out = [b""]
      for part in parts:
        tails = _strings(part, limit)
        if tails is None or len(out) * len(tails) > limit:
          return None
        out = [a + b for a, b in itertools.product(out, tails)]
      return out
    case ir.Union(alternatives):
      out = []
      for alternative in alternatives:
        more = _strings(alternative, limit)
        if more is None or len(out) + len(more) > limit:
          return None
        out += more
      return out
  return None


def _decode_label(label: ir.Node) -> tuple[tuple, tuple, bool] | None:
  """(literal ranges, escaped code points, has escapes) of one character label: a
  `CharClass`, or a union of classes (literal) and JSON escapes of single code points
  (`\n`, `\u001f`); None for anything else."""
  if isinstance(label, ir.CharClass):
    return label.ranges, (), False
  if not isinstance(label, ir.Union):
    return None
  literal, escaped = [], []
  for alternative in label.alternatives:
    if isinstance(alternative, ir.CharClass):
      literal += alternative.ranges
      continue
    strings = _strings(alternative)
    if strings is None:
      return None
    for data in strings:
      try:
        text = json.loads(b'"' + data + b'"')
      except ValueError:
        return None
      if not data.startswith(b"\\") or len(text) != 1:
        return None
      escaped.append(ord(text))
  return ir.normalize_ranges(literal), tuple(sorted(set(escaped))), True


def _encode(ranges: tuple, escaped: bool) -> ir.Node:
  """One character of `ranges`: its JSON encoding when `escaped`, else its UTF-8 bytes."""
  return jv._canonical_class(ranges) if escaped else ir.CharClass(ranges)  # pylint: disable=protected-access


def find_slotted(graph: ir.Graph) -> Slotted | None:
  """The slotted chain `graph` is (see the module doc), or None."""
  arcs = graph.arcs
  if not may_be_slotted(graph):
    return None
  decoded = {}
  for _, label, _ in arcs:
    if label not in decoded:
      decoded[label] = _decode_label(label)
      if decoded[label] is None:
        return None
  escaped = any(has for _, _, has in decoded.values())
  sets = {}
  for label, (literal, codes, _) in decoded.items():
    ranges = ir.normalize_ranges(list(literal) + [(c, c) for c in codes])
    if not ranges or _intersect._common_ranges(ranges, _SURROGATES):  # pylint: disable=protected-access
      return None
    if escaped and label != _encode(ranges, True):
      return None  # Not the canonical encoding (`encode_text`'s) of its characters.
    sets[label] = ranges
  bounds = _atoms_of(sets.values())
  if len(bounds) - 1 > MAX_ATOMS or graph.num_states * (len(bounds) - 1) > MAX_CELL_ATOMS:
    return None
  masks = {label: _atom_mask(bounds, ranges) for label, ranges in sets.items()}
  for s, src, dst in _layerings(graph):
    found = _verify(graph, s, src, dst, bounds, masks, escaped)
    if found is not None:
      return found
  return None


def _literal(bounds: np.ndarray, escaped: bool) -> np.ndarray:
  """bool [A]: the atoms written literally (all but the escaped ones, when `escaped`)."""
  if escaped:
    return ~_atom_mask(bounds, _SPECIAL)
  return np.ones(len(bounds) - 1, bool)


def _verify(graph: ir.Graph, s: int, src: np.ndarray, dst: np.ndarray, bounds: np.ndarray,
            masks: dict, escaped: bool) -> Slotted | None:
  layers = graph.num_states // s
  num_atoms = len(bounds) - 1
  f = np.full((s, num_atoms), -1, np.int64)
  pairs = _arc_atoms(graph.arcs, src, dst, masks, num_atoms)
  for a, b, atoms in pairs():
    # f(a mod S, atom) = b mod S for each; two values for one key: not one slot
    # function (or not deterministic).
    both = np.unique(((a % s) * num_atoms + atoms) * s + b % s)
    key, value = both // s, both % s
    old = f.reshape(-1)[key]
    if (key[1:] == key[:-1]).any() or ((old >= 0) & (old != value)).any():
      return None
    f.reshape(-1)[key] = value
  read = (f >= 0).any(axis=0)
  literal = _literal(bounds, escaped)
  if _class_size(bounds, read & literal) < MIN_CLASS_SIZE:
    return None
  final_cells = np.zeros(layers * s, bool)
  final_cells[list(graph.finals)] = True
  final_cells = final_cells.reshape(layers, s)
  present = _present(f, final_cells)
  if not present[0, 0]:
    return None
  # The graph's arcs among present cells must be exactly the product's.
  flat = present.reshape(-1)
  got = np.zeros(layers * s * num_atoms, bool)
  for a, b, atoms in pairs():
    keep = flat[a] & flat[b]
    got[a[keep] * num_atoms + atoms[keep]] = True
  got = got.reshape(layers, s, num_atoms)
  want = np.zeros((layers, s, num_atoms), bool)
  safe = np.maximum(f, 0)
  # Layer j, slot a, atom c: (j + 1, f(a, c)) is present.
  want[:-1] = present[:-1, :, None] & (f >= 0)[None] & present[1:][:, safe]
  if not np.array_equal(got, want):
    return None
  decoders = []
  for a in range(s):
    decoder = _decoder(bounds, f[a], escaped)
    if decoder is None:
      return None
    decoders.append(decoder)
  sizes = 1 + np.array([d.num_inner for d in decoders], np.int64)
  if int((present * sizes[None, :]).sum()) > MAX_CHAIN_STATES:
    return None
  return Slotted(num_slots=s, length=layers - 1, bounds=bounds, slot_next=f,
                 accepting=present & final_cells, present=present,
                 char_class=ir.CharClass(_ranges_of(bounds, read & literal)),
                 escaped=escaped, decoders=tuple(decoders))


def _arc_atoms(arcs: tuple, src: np.ndarray, dst: np.ndarray, masks: dict, num_atoms: int):
  """A function yielding (source, target, atom) int64 arrays: one entry per arc and atom of
  its label, in chunks of at most ~1M entries (numpy instead of a loop per arc)."""
  index: dict = {}
  label_of = np.fromiter((index.setdefault(label, len(index)) for _, label, _ in arcs),
                         np.int64, len(arcs))
  atoms = [np.flatnonzero(masks[label]) for label in index]
  sizes = np.array([len(x) for x in atoms], np.int64)
  starts, flat = np.cumsum(sizes) - sizes, np.concatenate(atoms + [np.zeros(0, np.int64)])
  step = max(1, (1 << 20) // max(num_atoms, 1))

  def chunks():
    for lo in range(0, len(arcs), step):
      arc = np.arange(lo, min(lo + step, len(arcs)))
      n = sizes[label_of[arc]]
      at = np.repeat(arc, n)
      offset = np.arange(len(at)) - np.repeat(np.cumsum(n) - n, n)
      yield src[at], dst[at], flat[starts[label_of[at]] + offset]
  return chunks


def _decoder(bounds: np.ndarray, row: np.ndarray, escaped: bool) -> Decoder | None:
  """The `Decoder` of a slot whose slot function is `row` (int64 [A]): the product of
  the byte DFAs of its targets' encoded classes (disjoint, prefix-free: one finishes)."""
  targets = np.unique(row[row >= 0]).tolist()
  dfas = [_class_dfa(_ranges_of(bounds, row == b), escaped) for b in targets]
  if not dfas:
    return Decoder(next=np.full((1, 256), -1, np.int64), num_inner=0)
  start = tuple(d.start for d in dfas)
  index = {start: 0}
  order = [start]
  rows = []
  k = 0
  while k < len(order):
    here = order[k]
    nxt = np.stack([d.transitions[q] if q >= 0 else np.full(256, NO_STATE, np.int32)
                    for d, q in zip(dfas, here)])  # [targets, 256]
    out = np.full(256, -1, np.int64)
    for byte in np.flatnonzero((nxt != NO_STATE).any(axis=0)).tolist():
      tup = tuple(int(q) for q in nxt[:, byte])
      done = [(t, d, q) for t, d, q in zip(targets, dfas, tup) if q >= 0 and d.accepting[q]]
      if done:
        if (len(done) > 1 or sum(q >= 0 for q in tup) > 1
            or (done[0][1].transitions[done[0][2]] != NO_STATE).any()):
          return None  # Not prefix-free, or two targets read one character.
        out[byte] = -2 - done[0][0]  # Renumbered below.
        continue
      j = index.get(tup)
      if j is None:
        if len(order) > MAX_INNER:
          return None
        j = index[tup] = len(order)
        order.append(tup)
      out[byte] = j
    rows.append(out)
    k += 1
  table = np.stack(rows)
  n = len(order) - 1
  if n and _longest_inner_path(table, n) >= _MAX_CHARACTER_BYTES:
    return None
  table = np.where(table <= -2, n + 1 + (-2 - table), table)
  return Decoder(next=table, num_inner=n)


@functools.lru_cache(maxsize=256)
def _class_dfa(ranges: tuple, escaped: bool) -> ByteDfa:
  """The byte DFA of one character of `ranges` (`_encode`), cached: every layer and
  every chain over the same class shares it."""
  return _fsa.compile_byte_dfa(_encode(ranges, escaped))


def _longest_inner_path(table: np.ndarray, n: int) -> int:
  """Bytes on the longest path through inner states (n of them, acyclic or not)."""
  frontier = {0}
  for step in range(n + 2):
    nxt = set()
    for q in frontier:
      nxt.update(x for x in table[q].tolist() if 1 <= x <= n)
    if not nxt:
      return step
    frontier = nxt
  return n + 2  # A cycle.


def chain_dfa(slotted: Slotted) -> tuple[ByteDfa, np.ndarray]:
  """(byte DFA of the chain, cell int64 `[L + 1, stride]`: its state at each layer and
  column, -1 where none). Columns 0..S-1 are the slots, then each slot's inner states
  (present where a present cell of the next layer can still be reached). States are
  the present cells, layer by layer; (0, 0) is the start."""
  s, stride = slotted.num_slots, slotted.stride
  layers = slotted.length + 1
  present = np.zeros((layers, stride), bool)
  present[:, :s] = slotted.present
  for a, decoder in enumerate(slotted.decoders):
    n = decoder.num_inner
    if not n:
      continue
    reach = _finishes(decoder, s)  # [1 + n, S]
    col = slotted.inner_column(a)
    nxt = np.zeros((layers, s), bool)
    nxt[:-1] = slotted.present[1:]
    present[:, col:col + n] = (slotted.present[:, a, None]
                               & (reach[None, 1:, :] & nxt[:, None, :]).any(axis=2))
  cell = np.full((layers, stride), -1, np.int64)
  cell[present] = np.arange(int(present.sum()))
  q = int(present.sum())
  trans = np.full((q, 256), NO_STATE, np.int32)
  for a, decoder in enumerate(slotted.decoders):
    n = decoder.num_inner
    col = slotted.inner_column(a)
    for k in range(1 + n):
      column = a if k == 0 else col + k - 1
      js = np.flatnonzero(present[:, column])
      if not len(js):
        continue
      row = decoder.next[k]
      inner = (row >= 1) & (row <= n)
      done = row > n
      target = np.full((len(js), 256), -1, np.int64)
      target[:, inner] = cell[js[:, None], col + row[inner][None, :] - 1]
      ok = js + 1 < layers
      target[np.ix_(ok, done)] = cell[js[ok, None] + 1, (row[done] - n - 1)[None, :]]
      trans[cell[js, column]] = np.where(target >= 0, target, NO_STATE)
  accepting = np.zeros(q, bool)
  accepting[cell[:, :s][slotted.accepting]] = True
  return ByteDfa(transitions=trans, accepting=accepting, start=int(cell[0, 0])), cell


def _finishes(decoder: Decoder, s: int) -> np.ndarray:
  """bool [1 + n, S]: the slots a character under way may still finish into."""
  n = decoder.num_inner
  out = np.zeros((1 + n, s), bool)
  for k in range(1 + n):
    row = decoder.next[k]
    out[k, (row[row > n] - n - 1)] = True
  for _ in range(n + 1):  # Propagate back along inner moves (acyclic, depth <= 6).
    for k in range(1 + n):
      row = decoder.next[k]
      inner = row[(row >= 1) & (row <= n)]
      if len(inner):
        out[k] |= out[inner].any(axis=0)
  return out
