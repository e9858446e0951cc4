"""Counting terminals: the terminal entries of counted chains' states, and their rows.

Split from `_counting.py` (which recognizes and lays out chains): here a chain's states
get their counting entries (a terminal whose target is the state plus stride times the
token's characters, and a bound "at most r characters" near the end, `tables.AT_MOST -
r`), and `CountingTerminals.fold` ORs each state's entries into its mask row, stored
near the end as the row without the bound minus the row of longer tokens
(`tables.py`, `group_excluded`).

Public names:
  CountingTerminals   the terminals, bitmaps and class rows of one compile.
  Folded              what `CountingTerminals.fold` returns.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import os
import typing

import numpy as np

from constrained_decoding import _cache
from constrained_decoding import tables as _tables
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _loops
from constrained_decoding.constraints import _ir as ir

if typing.TYPE_CHECKING:
  from constrained_decoding.automata._counting import Chain, _ClassCounts  # pylint: disable=g-bad-import-order


def _bitmap(counts: _ClassCounts, r: int, num_words: int) -> np.ndarray:
  """uint32 [W]: the tokens of 1..r characters of the class (read only: shared). All r
  are made on first use (a compile asks for most of them): the tokens of exactly c
  characters per c in one scatter, then ORed up along c (row by row: numpy's
  accumulate along axis 0 is ~20x slower)."""
  if not counts.bitmaps:
    tokens = np.flatnonzero(counts.counts > 0)
    c = counts.counts[tokens].astype(np.int64)
    top = int(c.max(initial=0))
    rows = np.zeros((top + 1, num_words), np.uint32)
    np.bitwise_or.at(rows.reshape(-1), c * num_words + (tokens >> 5),
                     np.uint32(1) << (tokens & 31).astype(np.uint32))
    for k in range(1, top + 1):
      rows[k] |= rows[k - 1]
    for k in range(128):  # Past the longest token: its row.
      counts.bitmaps[k] = rows[min(k, top)]
  return counts.bitmaps[min(max(r, 0), 127)]


@dataclasses.dataclass(frozen=True)
class Folded:
  """`CountingTerminals.fold`'s mask rows (uint32 [M_pad, W]), row of each group (int32
  [G]), exclusion rows (uint32 [X_pad, W], [0, 0] when none is used) and exclusion row
  of each group (int32 [G], [0] when none is used)."""

  mask_bits: np.ndarray
  group_mask: np.ndarray
  excluded_bits: np.ndarray
  group_excluded: np.ndarray


class _Rows:
  """Distinct uint32 [W] rows, numbered in order of first appearance.

  Rows are looked up by `fingerprint` (a 1 KiB XOR fold: hashing a whole row of a large
  vocabulary, 32 KiB, cost ~8 us of `fold`'s ~20 us a group) and compared in full on a
  hit, so rows whose folds collide stay distinct."""

  def __init__(self):
    self._index: dict[bytes, list[int]] = {}
    self._rows: list[np.ndarray] = []

  def __len__(self) -> int:
    return len(self._rows)

  def add(self, bits: np.ndarray, key: bytes | None = None) -> int:
    """The number of `bits` (`key`, when given, is `fingerprint(bits)`: a caller that
    adds one row to two `_Rows` passes it)."""
    same = self._index.setdefault(fingerprint(bits) if key is None else key, [])
    for k in same:
      if np.array_equal(self._rows[k], bits):
        return k
    same.append(len(self._rows))
    self._rows.append(bits)
    return len(self._rows) - 1

  def copy(self) -> "_Rows":
    """Another `_Rows` with the same rows and numbering (the arrays shared)."""
    out = _Rows()
    out._index = {key: list(same) for key, same in self._index.items()}  # pylint: disable=protected-access
    out._rows = list(self._rows)  # pylint: disable=protected-access
    return out

  def padded(self, bucket, num_words: int) -> np.ndarray:
    """uint32 [bucket(len), W]: the rows, then empty ones."""
    out = np.zeros((bucket(len(self._rows)), num_words), np.uint32)
    for k, row in enumerate(self._rows):  # Row by row: a list assigned at once is copied twice.
      out[k] = row
    return out


def fingerprint(bits: np.ndarray) -> bytes:
  """A short key of uint32 row `bits`: its words XORed in columns of 256 (a lookup key
  only: equal rows have equal keys, unequal ones may too)."""
  whole = len(bits) - len(bits) % 256
  return (np.bitwise_xor.reduce(bits[:whole].reshape(-1, 256), axis=0).tobytes()
          + bits[whole:].tobytes())


def _fingerprints(rows: np.ndarray) -> list[bytes]:
  """`fingerprint` of each row of uint32 `rows` [N, W], in one pass."""
  whole = rows.shape[1] - rows.shape[1] % 256
  folded = np.bitwise_xor.reduce(rows[:, :whole].reshape(len(rows), -1, 256), axis=1)
  return [a.tobytes() + b.tobytes() for a, b in zip(folded, rows[:, whole:])]


class CountingTerminals:
  """The counting terminals and bitmap filters of one compile, as parallel lists
  (bitmap, (class row of `token_counts`, stride, bias); filters -1), and the classes'
  count rows. Chains that agree (class, body, stride) share terminals. "At most r
  characters" is a bound, `tables.AT_MOST - r` in an entry's filter field: no bitmap."""

  def __init__(self, num_words: int):
    self.num_words = num_words
    self.bitmaps: list[np.ndarray] = []
    self.counts: list[tuple[int, int, int]] = []
    self.class_rows: dict = {}  # char class -> row of token_counts
    self.class_counts: list[np.ndarray] = []
    self._ids: dict = {}
    self._sources: dict = {}  # class row -> its `_ClassCounts` (bound bitmaps cached)
    self._bodies: dict = {}  # chain body -> a small id for the keys of `_ids`
    self._over: dict = {}  # (class row, r) -> `_over_bits`; (.., "not") -> its complement

  def class_row(self, klass: ir.CharClass, counts: _ClassCounts) -> int:
    """The row of `token_counts` of class `klass` (added on first use)."""
    if klass not in self.class_rows:
      self.class_rows[klass] = len(self.class_counts)
      self.class_counts.append(counts.counts)
      self._sources[self.class_rows[klass]] = counts
    return self.class_rows[klass]

  def _get(self, key, bits_of, count) -> int:
    k = self._ids.get(key)
    if k is None:
      k = self._ids[key] = len(self.bitmaps)
      self.bitmaps.append(bits_of())
      self.counts.append(count)
    return k

  def add_chain(self, chain: Chain, cell: np.ndarray, m2: int, stride: int, inner: list,
                body, counts: _ClassCounts, vocab, entries_of: dict, moves: list) -> bool:
    """Adds the counting entries of the chain states in `cell` (`[m2 + 1, stride]`
    byte-DFA states, -1 for none) to `entries_of` (state -> [(terminal, filter)]) and
    their moves to `moves` (for liveness: one (sources, targets) pair of int64 arrays);
    False if the chain's escapes cannot be counted (`_inner_tokens`).

    From a boundary, c characters of K lead c positions on; from an inner state x,
    tokens finishing X after k bytes lead to position + 1 + c - k, those ending inside
    X to the inner state x' they end in.
    """
    klass, w = chain.char_class, self.num_words
    row = self.class_row(klass, counts)
    pieces = _inner_tokens(counts, body, chain.body, inner, vocab)
    if pieces is None:
      return False
    max_count = int(counts.counts.max(initial=0))
    slot_of_x = {x: k + 1 for k, x in enumerate(inner)}
    # The class row and a body id stand for the class and body in the keys (IR nodes
    # hash their whole tree on every lookup).
    body_id = self._bodies.setdefault(chain.body, len(self._bodies))
    every = self._get(("every", row, stride), lambda: _bitmap(counts, max_count, w),
                      (row, stride, 0))
    # The pieces' bitmaps belong to the vocabulary: kept with the pieces (made on first
    # use, read only), not remade by every compile (~30 us each, a few dozen per body).
    bits_of = pieces.setdefault("bits", {})

    def piece_bits(piece: tuple, tokens: np.ndarray) -> np.ndarray:
      bits = bits_of.get(piece)
      if bits is None:
        bits = bits_of[piece] = _loops.token_bits(tokens, w)
        bits.setflags(write=False)
      return bits

    finish, inside = {}, {}  # slot -> [(terminal, k)], [(terminal, slot after)]
    for (x, k), tokens in pieces["finish"].items():
      t = self._get(("finish", row, body_id, stride, x, k),
                    lambda x=x, k=k, tokens=tokens: piece_bits(("finish", w, x, k), tokens),
                    (row, stride, stride * (1 - k) - slot_of_x[x]))
      finish.setdefault(slot_of_x[x], []).append((t, k))
    for (x, x2), tokens in pieces["inside"].items():
      t = self._get(("inside", row, body_id, stride, x, x2),
                    lambda x=x, x2=x2, tokens=tokens: piece_bits(("inside", w, x, x2), tokens),
                    (row, 0, slot_of_x[x2] - slot_of_x[x]))
      inside.setdefault(slot_of_x[x], []).append((t, slot_of_x[x2]))

    def at_most(r: int) -> int:
      return -1 if r >= max_count else _tables.AT_MOST - r

    # An unbounded chain's positions read X without limit (r = inf): a token past its
    # last position m2 lands on the strip after it (see "Unbounded chains").
    unbounded = chain.max is None

    def entries_at(k_slot: int, r: int) -> list:
      entries = []
      if k_slot == 0 and r >= 1 and max_count:
        entries.append((every, -1 if unbounded else at_most(r)))
      if k_slot and r >= 1:
        entries += [(terminal, -1 if unbounded else at_most(r - 1 + k))
                    for terminal, k in finish.get(k_slot, ())]
        entries += [(terminal, -1) for terminal, _ in inside.get(k_slot, ())]
      return entries

    # The entries depend on the slot and on r up to max_count + 1 (past it no bound is
    # left): built once per pair, one list shared by the states that have them.
    js, ks = np.nonzero(cell >= 0)
    states = cell[js, ks]
    rs = (np.full(len(js), max_count + 1) if unbounded
          else np.minimum(m2 - js, max_count + 1))
    pairs, pair_of = np.unique(ks * (max_count + 2) + rs, return_inverse=True)
    shared = [entries_at(*divmod(pair, max_count + 2)) for pair in pairs.tolist()]
    pair_of = pair_of.reshape(-1)
    has = np.array([bool(entries) for entries in shared], bool)[pair_of]
    entries_of.update(zip(states[has].tolist(), map(shared.__getitem__,
                                                    pair_of[has].tolist())))
    # Moves (for liveness only): each entry finishing X to the next position, each one
    # ending inside X to the slot it ends in.
    js, ks, states = js[has], ks[has], states[has]
    finishing = np.array([1] + [len(finish.get(k, ())) for k in range(1, stride)], np.int64)
    src = [states.repeat(finishing[ks])]
    dst = [cell[np.minimum(js + 1, m2), 0].repeat(finishing[ks])]
    for k_slot, listed in inside.items():
      at = ks == k_slot
      for _, k2 in listed:
        src.append(states[at])
        dst.append(cell[js[at], k2])
    moves.append((np.concatenate(src).astype(np.int64), np.concatenate(dst).astype(np.int64)))
    return True

  def strip_down(self, chain: Chain, stride: int, counts: _ClassCounts) -> tuple[int, int]:
    """The entry of an unbounded chain's upper strip positions: every token wholly in K
    moves back by its count (stride -stride), so no position runs off the strip."""
    klass = chain.char_class
    max_count = int(counts.counts.max(initial=0))
    return (self._get(("down", self.class_rows[klass], stride),
                      lambda: _bitmap(counts, max_count, self.num_words),
                      (self.class_rows[klass], -stride, 0)), -1)

  def union(self, entries) -> np.ndarray:
    """uint32 [W]: the tokens of counting `entries` ((terminal, filter) pairs of this
    object's ids, filter -1 for none, or a bound), each filter applied."""
    bits = np.zeros(self.num_words, np.uint32)
    for terminal, filt in entries:
      if filt >= 0:
        bits |= self.bitmaps[terminal] & self.bitmaps[filt]
      elif filt <= _tables.AT_MOST:
        bits |= self.bitmaps[terminal] & self._bound_bits(self.counts[terminal][0],
                                                          _tables.AT_MOST - filt)
      else:
        bits |= self.bitmaps[terminal]
    return bits

  def _bound_bits(self, row: int, r: int) -> np.ndarray:
    """uint32 [W]: the tokens of 1..r characters of class row `row` (cached with the
    class's counts, for every compile)."""
    return _bitmap(self._sources[row], r, self.num_words)

  def fold(self, mask_bits: np.ndarray, row_of_group: np.ndarray,
           entries_of_group: collections.abc.Sequence,
           min_bucket: int, *, entry_ids: np.ndarray | None = None) -> "Folded":
    """Mask rows with each group's counting entries ORed in, deduplicated again.

    `row_of_group[k]` is group k's row of `mask_bits` (its explicit tokens and ordinary
    terminals), `entries_of_group[k]` its state's counting entries (a tuple of
    (terminal, filter) pairs, empty for none). The exact allowed set of a group whose
    bounded entries all have one bound r is stored as the row without the bound minus
    the exclusion row "more than r characters" (`tables.py`), when that is equal to it:
    rows near the chain's end are then shared across r. Other groups get one row per
    distinct set (a row per remaining count below the longest token, per slot). When
    exclusion rows would not make the padded rows fewer (short chains), every group
    keeps its exact row and the device gathers no exclusion row.

    `entry_ids` (int64 [G], optional) are equal exactly where the groups' entries are:
    then the groups are deduplicated in numpy, and `entries_of_group` is read only at
    the first group of each distinct (row, entries).
    """
    row_of_group = np.asarray(row_of_group)
    first_groups, inverse = None, None
    if entry_ids is not None and len(row_of_group):
      key = row_of_group.astype(np.int64) * (int(entry_ids.max()) + 1) + entry_ids
      _, first_groups, inverse = np.unique(key, return_index=True, return_inverse=True)
      # In order of first appearance, as the loop below numbers rows.
      by_first = np.argsort(first_groups)
      rank = np.empty(len(by_first), np.int64)
      rank[by_first] = np.arange(len(by_first))
      first_groups, inverse = first_groups[by_first], rank[inverse.reshape(-1)]
    # `split_rows` stays None while it would equal `exact_rows` (the same rows added in
    # the same order: every group so far has no exclusion), and is copied from it at the
    # first group that has one; without exclusions (most schemas) each row is added once.
    exact_rows, split_rows = _Rows(), None
    excluded: dict[tuple[int, int], int] = {}  # (class row, r) -> row of excluded_bits
    row_of: dict[tuple, tuple[int, int, int]] = {}
    plain: dict[int, tuple[int, int, int]] = {}  # The same for a row without entries.
    hits = []  # (exact row, split row, exclusion) of each visited group
    parts: dict[tuple, tuple] = {}  # `_split`'s pieces shared across r
    visited = (range(len(row_of_group)) if first_groups is None
               else first_groups.tolist())
    rows = row_of_group.tolist()
    # Rows without entries are kept as they are: their keys in one pass.
    row_keys = _fingerprints(mask_bits[:max(rows, default=-1) + 1])
    loose_rows: dict[int, int] = {}  # id of a `parts` loose row -> its split row
    for k in visited:
      row, entries = rows[k], entries_of_group[k]
      if not entries:
        hit = plain.get(row)
        if hit is None:
          exact, exact_key = mask_bits[row], row_keys[row]
          e = exact_rows.add(exact, exact_key)
          hit = plain[row] = (e, e if split_rows is None else split_rows.add(exact, exact_key),
                              0)
        hits.append(hit)
        continue
      key = (row, entries)
      hit = row_of.get(key)
      if hit is None:
        exact, loose, exclusion = self._split(mask_bits, row, entries, parts)
        exact_key = fingerprint(exact)
        if exclusion is None:
          e = exact_rows.add(exact, exact_key)
          hit = (e, e if split_rows is None else split_rows.add(exact, exact_key), 0)
        else:  # One loose row (kept alive by `parts`) serves every r of its key.
          if split_rows is None:
            split_rows = exact_rows.copy()
          x = excluded.setdefault(exclusion, len(excluded) + 1)
          split = loose_rows.get(id(loose))
          if split is None:
            split = loose_rows[id(loose)] = split_rows.add(*loose)
          hit = (exact_rows.add(exact, exact_key), split, x)
        row_of[key] = hit
      hits.append(hit)
    groups = np.array(hits, np.int32).reshape(-1, 3)
    if first_groups is not None:
      groups = groups[inverse]
    w = mask_bits.shape[1]
    bucket = lambda n: _tables.bucket_size(n, min_bucket)  # pylint: disable=unnecessary-lambda-assignment
    if not excluded or bucket(len(exact_rows)) <= bucket(len(split_rows)) + bucket(
        len(excluded) + 1):
      return Folded(exact_rows.padded(bucket, w), groups[:, 0], np.zeros((0, 0), np.uint32),
                    np.zeros(0, np.int32))
    excluded_bits = np.zeros((bucket(len(excluded) + 1), w), np.uint32)
    for (class_row, r), x in excluded.items():
      excluded_bits[x] = self._over_bits(class_row, r)
    return Folded(split_rows.padded(bucket, w), groups[:, 1], excluded_bits, groups[:, 2])

  def _split(self, mask_bits: np.ndarray, row: int, entries, parts: dict
             ) -> tuple[np.ndarray, tuple[np.ndarray, bytes] | None, tuple | None]:
    """(exact, (row, its `fingerprint`), (class row, r)): the allowed set of a group with
    mask row `row` and counting `entries`, and the row that equals it less the tokens of
    more than r characters of the class; (exact, None, None) when no single bound r makes
    that exact.

    Groups near a chain's end differ only in r: the tokens of their entries without the
    bound (`parts`, keyed by row and entries less bounds) are ORed once for all r, and
    exact = those without a bound | (those with one & 1..r characters), as & distributes
    over |. The bounded tokens all have 1.. characters of the class (checked once per
    key), so `loose & ~over(r)` equals exact iff no unbounded token has more than r
    characters: r at least `free_max`, found once per key by bisection.
    """
    explicit = mask_bits[row]
    if not entries:
      return explicit, None, None
    bounds = {(self.counts[t][0], _tables.AT_MOST - f) for t, f in entries if f <= _tables.AT_MOST}
    if len(bounds) != 1:
      return explicit | self.union(entries), None, None
    (class_row, r), = bounds
    unbounded = tuple(e for e in entries if e[1] > _tables.AT_MOST)
    bounded = tuple(t for t, f in entries if f <= _tables.AT_MOST)
    key = (row, unbounded, bounded)
    hit = parts.get(key)
    if hit is None:
      free = explicit | self.union(unbounded) if unbounded else explicit
      capped = self.union(tuple((t, -1) for t in bounded))
      loose = free | capped
      counted = not (capped & ~self._bound_bits(class_row, np.iinfo(np.int8).max)).any()
      hit = parts[key] = (free, capped, (loose, fingerprint(loose)),
                          self._free_max(free, class_row) if counted else None)
    free, capped, loose, free_max = hit
    exact = free | (capped & self._bound_bits(class_row, r))
    if free_max is None:  # Not expected (bounded tokens are counted): check the rows.
      if not np.array_equal(loose[0] & self._not_over_bits(class_row, r), exact):
        return exact, None, None
    elif r < free_max:
      return exact, None, None
    return exact, loose, (class_row, r)

  def _free_max(self, free: np.ndarray, row: int) -> int:
    """The least r such that no token of `free` has more than r characters of class
    row `row` (`free & _over_bits(row, r)` empty; monotone in r, so bisected)."""
    lo, hi = 0, int(np.iinfo(np.int8).max)  # _over_bits(row, 127) is empty.
    while lo < hi:
      mid = (lo + hi) // 2
      if (free & self._over_bits(row, mid)).any():
        lo = mid + 1
      else:
        hi = mid
    return lo

  def _not_over_bits(self, row: int, r: int) -> np.ndarray:
    """uint32 [W]: `~_over_bits(row, r)` (cached per compile, like it)."""
    bits = self._over.get((row, r, "not"))
    if bits is None:
      bits = self._over[(row, r, "not")] = ~self._over_bits(row, r)
    return bits

  def _over_bits(self, row: int, r: int) -> np.ndarray:
    """uint32 [W]: the tokens of more than r characters of class row `row` (cached per
    compile: `fold` asks once per group shape)."""
    bits = self._over.get((row, r))
    if bits is None:
      bits = self._over[(row, r)] = (self._bound_bits(row, np.iinfo(np.int8).max)
                                     & ~self._bound_bits(row, r))
    return bits


def _inner_tokens(counts: _ClassCounts, body, body_node: ir.Node, inner: list,
                  vocab) -> dict | None:
  """Tokens wholly in K read from each inner state x of X (an escape under way):
  {"finish": {(x, k): ids finishing X after k bytes}, "inside": {(x, x'): ids ending
  inside X at x'}}; None if a finishing prefix is not ASCII (then a character of K
  would not be one byte, and the count of what follows would be off)."""
  key = (body_node, tuple(inner))
  hit = counts.inner.get(key)
  if hit is not None:
    return hit
  # On disk next to the class counts (~20 ms of a process's first compile).
  suffix = _cache.FORMATS["class-counts"].suffix  # The counts' file's ending.
  path = None if counts.path is None else counts.path[:-len(suffix)] + "-inner-" + (
      hashlib.sha256(repr(key).encode()).hexdigest()[:16] + suffix)
  hit = _load_inner(path)
  if hit is None:
    hit = _walk_inner_tokens(counts, body, inner)
    if hit is not None and path is not None:
      _save_inner(path, hit)
  if hit is not None:
    counts.inner[key] = hit
  return hit


def _save_inner(path: str, pieces: dict) -> None:
  """Writes `_inner_tokens`' pieces: each (kind, a, b) key in order, then its tokens."""
  keys = [(kind == "inside", a, b) for kind in ("finish", "inside") for a, b in pieces[kind]]
  arrays = {"keys": np.array(keys, np.int64).reshape(-1, 3)}
  for j, (inside, a, b) in enumerate(keys):
    arrays[f"t{j}"] = np.asarray(pieces["inside" if inside else "finish"][(a, b)], np.int64)
  _detokenizer.write_cache_file(os.path.dirname(path), path, arrays)


def _load_inner(path: str | None) -> dict | None:
  """`_save_inner`'s pieces, or None when absent or damaged."""
  arrays = _detokenizer.read_cache_file(path)
  if arrays is None or "keys" not in arrays:
    return None  # Missing or damaged: walked again.
  out = {"finish": {}, "inside": {}}
  for j, (inside, a, b) in enumerate(arrays["keys"].tolist()):
    tokens = arrays.get(f"t{j}")
    if tokens is None:
      return None
    out["inside" if inside else "finish"][(a, b)] = tokens
  return out


def _walk_inner_tokens(counts: _ClassCounts, body, inner: list) -> dict | None:
  """`_inner_tokens`, computed."""
  trans = body.transitions
  depth = counts.first_bytes.shape[1]
  if "prefix" not in counts.inner:
    # The tokens wholly in K by first byte (`starts[b]:starts[b + 1]` start with b),
    # their first bytes (zero padded), lengths and whether a byte >= 0x80 occurs among
    # the first p + 1 bytes.
    wholly = np.flatnonzero(counts.counts > 0)
    wholly = wholly[np.argsort(counts.first_bytes[wholly, 0], kind="stable")]
    first = counts.first_bytes[wholly]
    starts = np.searchsorted(first[:, 0], np.arange(257))
    non_ascii = np.logical_or.accumulate(first >= 0x80, axis=1)
    counts.inner["prefix"] = (wholly, first, counts.lengths[wholly], non_ascii, starts)
  all_wholly, all_first, all_length, all_non_ascii, starts = counts.inner["prefix"]
  out = {"finish": {}, "inside": {}}
  for x in inner:
    # Only tokens whose first byte x reads (none, after a UTF-8 lead byte).
    reads = np.flatnonzero(trans[x] >= 0)
    take = np.concatenate([np.arange(starts[b], starts[b + 1]) for b in reads.tolist()]
                          + [np.zeros(0, np.int64)])
    first, length, non_ascii, wholly = (all_first[take], all_length[take],
                                        all_non_ascii[take], all_wholly[take])
    state = np.full(len(wholly), x, np.int64)
    done = np.zeros(len(wholly), np.int64)  # k once X is finished, else 0
    going = np.flatnonzero(length > 0)  # Not finished, not dead, bytes left.
    for p in range(depth):
      going = going[length[going] > p]
      nxt = trans[state[going], first[going, p]]
      finished = (nxt >= 0) & body.accepting[np.maximum(nxt, 0)]
      if (finished & non_ascii[going, p]).any():
        return None
      done[going[finished]] = p + 1
      state[going] = nxt
      going = going[(nxt >= 0) & ~finished]
    for k in np.unique(done[done > 0]).tolist():
      out["finish"][(x, k)] = wholly[done == k]
    ends = (done == 0) & (state >= 0) & (length <= depth)
    for x2 in np.unique(state[ends]).tolist():
      if not body.accepting[x2]:
        out["inside"][(x, x2)] = wholly[ends & (state == x2)]
  return out
