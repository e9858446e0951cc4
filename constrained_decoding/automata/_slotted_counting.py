"""Counting entries of slotted chains (`_slotted_chains.py`, "Counting terminals").

Split from `_slotted_chains.py` (which recognizes a slotted chain and lays out its
bytes): here the tokens wholly in the chain's class K are followed through the slot
function (per vocabulary and slot function, cached with K's `_counting._ClassCounts`),
and each chain copy gets its counting terminals, filters and liveness moves.

Public names:
  add_slotted(...)   a chain copy's counting entries.
"""

import dataclasses

import numpy as np

from constrained_decoding import tables as _tables
from constrained_decoding.automata import _loops
from constrained_decoding.automata._slotted_chains import _MAX_CHARACTER_BYTES, Slotted
from constrained_decoding.vocab import _joined


@dataclasses.dataclass(frozen=True, eq=False)
class _Tokens:
  """The tokens wholly in K of a vocabulary, in id order (per K: `_ClassCounts.inner`).

  Attributes:
    ids: int64 `[N]`.
    count: int64 `[N]`: characters (code points) of each.
    head: int64 `[N, 8]`: first bytes, zero padded.
    num_bytes: int64 `[N]`.
    code_points: int64: every token's code points, concatenated.
    offset: int64 `[N]`: where each token's code points start in `code_points`.
  """

  ids: np.ndarray
  count: np.ndarray
  head: np.ndarray
  num_bytes: np.ndarray
  code_points: np.ndarray
  offset: np.ndarray


_HEAD = 8


def _tokens(counts, vocab) -> _Tokens:
  hit = counts.inner.get("slotted tokens")
  if hit is not None:
    return hit
  ids = np.flatnonzero(counts.counts > 0)
  # Gathered from the vocabulary's joined bytes (a Python pass per token: ~17 ms of a
  # process's first compile with Gemma 3). Each token is whole UTF-8: so are they joined.
  data, starts, ends = _joined.joined(vocab.token_bytes)
  lo, num_bytes = starts[ids], ends[ids] - starts[ids]
  joined = data[np.repeat(lo - (np.cumsum(num_bytes) - num_bytes), num_bytes)
                + np.arange(int(num_bytes.sum()))]
  at = lo[:, None] + np.arange(_HEAD)
  head = np.where(at < (lo + num_bytes)[:, None], data[np.minimum(at, max(len(data) - 1, 0))],
                  0).astype(np.int64)
  text = joined.tobytes().decode("utf-8")
  count = counts.counts[ids].astype(np.int64)
  out = _Tokens(ids=ids, count=count, head=head, num_bytes=num_bytes.astype(np.int64),
                code_points=np.frombuffer(text.encode("utf-32-le"), np.uint32).astype(np.int64),
                offset=np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64))
  counts.inner["slotted tokens"] = out
  return out


def _key(slotted: Slotted) -> bytes:
  return (slotted.bounds.tobytes() + slotted.slot_next.tobytes()
          + bytes([slotted.escaped]))


def _suffix_slots(slotted: Slotted, counts, vocab, last: int) -> np.ndarray:
  """int8 [last + 1, S + 1, N]: [i, s, t] is the slot that token t's characters from
  the i-th on (all of them for i = 0) lead to from slot s; S for none (cached per
  slot function)."""
  key = ("slotted suffixes", _key(slotted), last)
  hit = counts.inner.get(key)
  if hit is not None:
    return hit
  tokens = _tokens(counts, vocab)
  s, n = slotted.num_slots, len(tokens.ids)
  f = np.full((s + 1, slotted.slot_next.shape[1]), s, np.int64)
  f[:s] = np.where(slotted.slot_next >= 0, slotted.slot_next, s)
  atom = np.searchsorted(slotted.bounds, tokens.code_points, "right") - 1
  order = np.argsort(-tokens.count, kind="stable")
  length, offset = tokens.count[order], tokens.offset[order]
  table = np.repeat(np.arange(s + 1, dtype=np.int64)[:, None], n, axis=1)
  out = np.empty((last + 1, s + 1, n), np.int8)
  out[:] = table  # Past a token's end: the identity.
  for p in range(int(length.max(initial=0)) - 1, -1, -1):
    # Tokens longer than p (a prefix: sorted by length, longest first) read atom p.
    m = int(np.searchsorted(-length, -p, "left"))
    table[:, :m] = np.take_along_axis(table[:, :m], f[:, atom[offset[:m] + p]], axis=0)
    if p <= last:
      out[p][:, order] = table
  counts.inner[key] = out
  return out


def _inner_walks(slotted: Slotted, counts, vocab, a: int) -> dict:
  """Tokens wholly in K read from each inner state x of slot `a`'s decoder (1-based):
  {"finish": {(x, i, b'): token indices (into `_tokens`)}, "inside": {(x, x'): ...}}:
  finishing the character under way after their first i characters (into slot b),
  then led by the rest to slot b', or ending inside it at x'."""
  key = ("slotted inner", _key(slotted), a)
  hit = counts.inner.get(key)
  if hit is not None:
    return hit
  decoder = slotted.decoders[a]
  n = decoder.num_inner
  tokens = _tokens(counts, vocab)
  head = tokens.head
  starts = head < 0x80
  starts |= head >= 0xC0  # Bytes starting a character.
  out = {"finish": {}, "inside": {}}
  suffixes = None
  for x in range(1, n + 1):
    take = np.flatnonzero(decoder.next[x, head[:, 0]] >= 0)
    if not len(take):
      continue
    if suffixes is None:
      suffixes = _suffix_slots(slotted, counts, vocab, _MAX_CHARACTER_BYTES)
    h, length = head[take], tokens.num_bytes[take]
    state = np.full(len(take), x, np.int64)
    done = np.zeros(len(take), np.int64)  # k once the character is finished, else 0
    slot = np.full(len(take), -1, np.int64)
    for p in range(_MAX_CHARACTER_BYTES):
      going = (state > 0) & (done == 0) & (p < length)
      nxt = decoder.next[np.maximum(state, 0), h[:, p]]
      finished = going & (nxt > n)
      done[finished] = p + 1
      slot[finished] = nxt[finished] - n - 1
      state = np.where(going & ~finished, nxt, state)
      state[going & (nxt < 0)] = -1
    rows = np.arange(len(take))
    k = np.minimum(done, _HEAD - 1)
    # The rest starts a character: the first k bytes are i whole ones.
    whole = (done > 0) & ((done == length) | starts[rows, k])
    i = np.cumsum(starts, axis=1)[rows, np.maximum(k - 1, 0)]
    i = np.where(whole, i, 0)
    after = np.where(whole, suffixes[np.minimum(i, _MAX_CHARACTER_BYTES),
                                     np.maximum(slot, 0), take], slotted.num_slots)
    ok = whole & (after < slotted.num_slots)
    for (ii, b2) in set(zip(i[ok].tolist(), after[ok].tolist())):
      out["finish"][(x, ii, b2)] = take[ok & (i == ii) & (after == b2)]
    ends = (done == 0) & (state > 0) & (length <= _MAX_CHARACTER_BYTES)
    for x2 in np.unique(state[ends]).tolist():
      out["inside"][(x, x2)] = take[ends & (state == x2)]
  counts.inner[key] = out
  return out


def add_slotted(counting, slotted: Slotted, cell: np.ndarray, counts, vocab,
                usable: np.ndarray, entries_of: dict | None, moves: list) -> None:
  """Adds to `counting` the terminals of the chain (one per (slot, slot after) pair,
  and per way of finishing an escape under way), to `entries_of` (state ->
  [(terminal, filter)], when not None) the entries of the `usable` cells (bool
  `[L + 1, stride]`: present, and live for the tokens), and to `moves` (sources,
  targets) arrays: a move per cell and count a token may take (for liveness).

  `cell` is `[L + 1, stride]` in the composed DFA's numbering; `counts` the
  `_counting._ClassCounts` of K.
  """
  klass, w, s, stride = slotted.char_class, counting.num_words, slotted.num_slots, slotted.stride
  row = counting.class_row(klass, counts)
  tokens = _tokens(counts, vocab)
  max_count = int(counts.counts.max(initial=0))
  fkey = _key(slotted)
  layers = slotted.length + 1

  def filter_of(allowed: np.ndarray, every: np.ndarray) -> int:
    if len(allowed) == len(every):
      return -1
    r = int(allowed.max())
    if np.array_equal(allowed, every[every <= r]):
      return -1 if r >= max_count else _tables.AT_MOST - r  # A bound: no bitmap.
    key = ("count set", klass, allowed.tobytes())
    return counting._get(key, lambda: _loops.token_bits(  # pylint: disable=protected-access
        np.flatnonzero(np.isin(counts.counts, allowed)), w), (-1, -1, -1))

  listed: dict[int, list] = {}

  def piece(key, members) -> tuple[np.ndarray, np.ndarray]:
    """(distinct counts, ascending; bitmap) of the tokens `members()` (indices into
    `tokens`) of terminal `key`: kept with K's counts, as the pieces they come from
    (per vocabulary and slot function; each compile asks twice)."""
    hit = counts.inner.get(("slotted piece",) + key)
    if hit is None:
      chosen = members()  # (np.unique sorts ~33k counts: 10x slower than bincount.)
      hit = counts.inner[("slotted piece",) + key] = (
          np.flatnonzero(np.bincount(tokens.count[chosen])),
          _loops.token_bits(tokens.ids[chosen], w))
    return hit

  def place(key, members, source: int, target: int, delta: int | None) -> None:
    """One terminal of the tokens `members()` from column `source` to column `target`,
    `delta` + c layers on (None: the same layer, c apart)."""
    if delta is None:
      bias, step = target - source, 0
    else:
      bias, step = stride * delta + target - source, stride
    every, bits = piece(key, members)
    t = counting._get(key, lambda: bits, (row, step, bias))  # pylint: disable=protected-access
    rows = np.flatnonzero(usable[:, source])
    if not len(rows):
      return
    if delta is None:
      lands = usable[rows, target][:, None]
      to = rows[:, None]
      filters = [-1]
      which = np.zeros(len(rows), np.int64)
    else:
      to = rows[:, None] + delta + every[None, :]  # [rows, counts]: the layer each lands on
      lands = (to < layers) & usable[np.minimum(to, layers - 1), target]
      patterns, which = _unique_bool_rows(lands)
      filters = [filter_of(every[p], every) if p.any() else None for p in patterns]
    sources, targets = cell[rows, source], cell[np.minimum(to, layers - 1), target]
    for k in np.flatnonzero(lands.any(axis=1)).tolist():
      listed.setdefault(int(sources[k]), []).append((t, filters[which[k]]))
    ks, cs = np.nonzero(lands)
    moves.append((sources[ks], targets[ks, cs]))

  pairs = counts.inner.get(("slotted pairs", fkey))
  if pairs is None:  # The (slot, slot after) pairs some token takes.
    final = _suffix_slots(slotted, counts, vocab, 0)[0]
    pairs = counts.inner[("slotted pairs", fkey)] = [
        (a, b) for a in range(s) for b in np.unique(final[a][final[a] < s]).tolist()]
  for a, b in pairs:
    place(("slotted", klass, fkey, a, b),
          lambda a=a, b=b: np.flatnonzero(_suffix_slots(slotted, counts, vocab, 0)[0][a] == b),
          a, b, 0)
  for a, decoder in enumerate(slotted.decoders):
    if not decoder.num_inner:
      continue
    col = slotted.inner_column(a) - 1  # + x: inner state x's column
    walks = _inner_walks(slotted, counts, vocab, a)
    for (x, i, b2), members in walks["finish"].items():
      place(("slotted finish", klass, fkey, a, x, i, b2), lambda m=members: m, col + x, b2,
            1 - i)
    for (x, x2), members in walks["inside"].items():
      place(("slotted inside", klass, fkey, a, x, x2), lambda m=members: m, col + x, col + x2,
            None)
  if entries_of is not None:
    entries_of.update(listed)


def _unique_bool_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """`np.unique(rows, axis=0, return_inverse=True)` of bool `rows` [N, C] (distinct rows
  in lexicographic order, and the index of each row's), through one int64 code per
  row when C < 63 (first column the most significant bit: the same order)."""
  width = rows.shape[1]
  if width >= 63:
    patterns, which = np.unique(rows, axis=0, return_inverse=True)
    return patterns, which.reshape(-1)
  shifts = np.arange(width - 1, -1, -1, dtype=np.int64)
  codes, which = np.unique((rows.astype(np.int64) << shifts).sum(axis=1), return_inverse=True)
  return (codes[:, None] >> shifts) & 1 == 1, which.reshape(-1)
