"""Wide states: one terminal bitmap instead of ~255k token edges (Sec. 2.5.1, DESIGN.md).

A *wide* state q loops on a large class of bytes (JSON string bodies, free text). Its
*loop* L(q) is the set of states on short cycles through q (q itself plus, e.g., the
intermediate states of multi-byte UTF-8 characters and of escapes). A token whose byte path from q
stays inside L(q) and ends at q keeps the automaton in q; all such tokens form one
bitmap, a terminal edge q --bitmap--> q. Every other token that q allows (tokens that
leave the loop, like `",`, or end inside a multi-byte character) is found by walking a
small sub-trie holding only the tokens outside the bitmap. Both depend only on the
vocabulary and the shape of L(q), not on the rest of the constraint, so they are cached
per (vocabulary, loop shape) in memory and on disk: the JSON string body of every
schema shares one entry. Exact: no tokenization is lost, a token may still cross out of
the wide region (`hello",`), and explicit edges take precedence over the terminal.

Each terminal also keeps, built on first use, its sub-trie walked in the loop automaton
alone (`_loops.LoopExits`: the tokens that end inside the loop and the nodes where tokens
leave it), so that composition reads a wide state's explicit edges from arrays and only
walks past the exits. `find` counts bytes per state on the DFA's byte classes
(`ByteDfa.byte_classes`), not on 256 columns. The loop data and the pure functions on it
are `_loops.py`'s; this module decides which states are wide (and asks `_near_loop.py`
about the states that nearly are) and is the per-vocabulary store.

Public names:
  WideStates(trie, ...)        finds wide states of a byte DFA, with the cache; also
                               caches the bitmaps of the token classes (TEXT_TOKEN, ...)
                               and other per-vocabulary arrays (`load_arrays`).
  prune_cache(dir, max_bytes)  the disk cache's pruning (`_cache.prune_cache`, every kind).
"""

import collections
import dataclasses
import functools
import hashlib
import os
import time

import numpy as np

from constrained_decoding import _cache
from constrained_decoding.automata import _array_file
from constrained_decoding.automata import _near_loop
from constrained_decoding.automata import _token_classes
from constrained_decoding.automata import _loops
from constrained_decoding.automata._loops import (  # token_bits, _subtrie: also _wide.X.
    InsideCover, LoopExits, LoopTerminal, WideEdge,
    _subtrie, build_loop_terminal, canonical_loop, inside_cover, loop_digest, member_mask,
    popcount, state_predecessors, token_bits, with_subtrie)
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._detokenizer import VocabTrie, write_cache_file
from constrained_decoding.errors import CompileBudgetError

# Bumped (in `_cache.FORMATS`) when the cached layout changes (files of other versions
# are deleted on write). 8: `_array_file` files instead of .npz (8x faster to read), with
# the terminals' exits.
WIDE_FORMAT_VERSION = _cache.FORMATS["wide"].version
# The cache files' suffix (older versions wrote .npz; `prune_cache` deletes both).
_SUFFIX = _cache.FORMATS["wide"].suffix
# The on-disk cache is pruned, least recently used first, past this size.
DEFAULT_MAX_CACHE_BYTES = _cache.DEFAULT_MAX_CACHE_BYTES
prune_cache = _cache.prune_cache
# Bitmaps kept by `_FirstByteBits.restrict` (32 KiB each for a 262k vocabulary).
_RESTRICT_CACHE_SIZE = 256
# Bytes of terminals (bitmaps, sub-tries, exits) a `WideStates` keeps in memory, least
# recently used dropped first (they are read back from disk in ~0.1 ms when asked again):
# the 44 corpus schemas with Gemma 3 use ~360 MB of them (sub-tries counted twice, for
# their exits).
MAX_MEMORY_BYTES = 512 << 20
_SUBTRIE_FIELDS = ("child_start", "child_byte", "child_node", "node_depth", "token_start",
                   "token_ids")
# The `LoopExits` fields stored with a terminal (as "exits_" + name; its `full_node` is
# the terminal's): walking the sub-trie in the loop costs ~1-9 ms per terminal.
_EXITS_FIELDS = tuple(f.name for f in dataclasses.fields(LoopExits) if f.name != "full_node")


class _FirstByteBits:
  """For each byte b, the bitmap of the tokens whose first byte is b."""

  def __init__(self, trie: VocabTrie, num_words: int):
    ids = trie.token_ids.astype(np.int64)
    first = trie.token_first_byte[ids].astype(np.int64)
    self.rows = np.zeros((256, num_words), np.uint32)
    np.bitwise_or.at(self.rows, (first, ids >> 5), np.uint32(1) << (ids & 31).astype(np.uint32))
    # Tokens per first byte: the rows partition the tokens with bytes, so a union's
    # popcount is a sum of these (no 32 KiB row to unpack per query).
    self.counts = np.bincount(first, minlength=256)
    self.all = np.bitwise_or.reduce(self.rows, axis=0)
    self._restricted: dict[tuple[str, bytes], np.ndarray] = {}

  def union(self, byte_mask: np.ndarray) -> np.ndarray:
    """uint32 `[W]`: tokens whose first byte is in bool `byte_mask` [256]."""
    if byte_mask.sum() > 128:  # Rows are disjoint: remove the complement from all.
      return self.all ^ self.union(~byte_mask)
    return np.bitwise_or.reduce(self.rows[byte_mask], axis=0, initial=np.uint32(0))

  def restrict(self, terminal: "LoopTerminal", byte_mask: np.ndarray) -> np.ndarray:
    """uint32 `[W]`: `terminal.bits` limited to tokens whose first byte is in `byte_mask`.

    Memoized per (terminal, first bytes), a bounded per-vocabulary cache: entry states
    of every constraint ask for the same few (string body, opening bytes) pairs.
    """
    key = (terminal.key, np.packbits(byte_mask).tobytes())
    bits = self._restricted.get(key)
    if bits is None:
      bits = terminal.bits & self.union(byte_mask)
      bits.setflags(write=False)
      if len(self._restricted) >= _RESTRICT_CACHE_SIZE:
        self._restricted.pop(next(iter(self._restricted)))
      self._restricted[key] = bits
    return bits


class _BoundedMemo:
  """A dict of terminals, least recently used first, dropped past `max_bytes` in all."""

  def __init__(self, max_bytes: int):
    self.max_bytes = max_bytes
    self.nbytes = 0
    self._items: collections.OrderedDict = collections.OrderedDict()  # key -> (value, size)

  def get(self, key):
    hit = self._items.get(key)
    if hit is None:
      return None
    self._items.move_to_end(key)
    return hit[0]

  def put(self, key, terminal: LoopTerminal) -> None:
    size = _terminal_nbytes(terminal)
    old = self._items.pop(key, None)
    if old is not None:
      self.nbytes -= old[1]
    self._items[key] = (terminal, size)
    self.nbytes += size
    while self.nbytes > self.max_bytes and len(self._items) > 1:
      _, (_, dropped) = self._items.popitem(last=False)
      self.nbytes -= dropped

  def __len__(self) -> int:
    return len(self._items)


def _terminal_nbytes(terminal: LoopTerminal) -> int:
  """Memory of a terminal's arrays, its exits (built or to be built) counted as its
  sub-trie's size again."""
  size = terminal.bits.nbytes
  if terminal.subtrie is not None:
    size += 2 * sum(getattr(terminal.subtrie, f).nbytes for f in _SUBTRIE_FIELDS)
    size += terminal.full_node.nbytes
  return size


class WideStates:
  """Finds the wide states of byte DFAs for one vocabulary, caching their terminals.

  It is the per-vocabulary cache of every terminal bitmap: loop terminals here, and the
  token classes of `(?P<TEXT_TOKEN>)` and `(?P<PARAGRAPH_TOKEN>)` (`token_class_bits`).
  """

  def __init__(self, trie: VocabTrie, num_words: int, cache_dir: str | None,
               max_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES):
    self.trie = trie
    self.num_words = num_words
    self.cache_dir = cache_dir
    self.max_cache_bytes = max_cache_bytes
    # Key -> terminal with sub-trie, and (digest, entry, after first byte) -> terminal:
    # one memory budget, split 15:1 (sub-tries are the large ones; the shape memo
    # holds bitmaps alone, 32 KiB each for a 262k vocabulary).
    self._subtrie_memo = _BoundedMemo(MAX_MEMORY_BYTES * 15 // 16)
    self._cover_memo: dict[str, InsideCover | None] = {}  # Terminal key -> its cover.
    self._entry_memo: dict[tuple, tuple[np.ndarray, int]] = {}
    self._class_memo: dict[str, np.ndarray] = {}
    self._many_memo: dict[bytes, np.ndarray] = {}  # Loop digest -> `may_hold_many`.
    self._shape_memo = _BoundedMemo(MAX_MEMORY_BYTES // 16)

  def token_class_bits(self, name: str) -> np.ndarray:
    """uint32 `[W]`: the tokens of the token class `name` (memory and disk cached)."""
    bits = self._class_memo.get(name)
    if bits is not None:
      return bits
    data = self.load_arrays(f"class-{name}")
    bits = None if data is None else data.get("bits")
    if bits is None or bits.shape != (self.num_words,):
      bits = _token_classes.class_bits(self.trie, name, self.num_words)
      self.save_arrays(f"class-{name}", bits=bits)
    self._class_memo[name] = bits
    return bits

  def find(self, dfa: ByteDfa, skip: np.ndarray | None = None, *,
           deadline: float = float("inf"), what: str = "The constraint"
           ) -> dict[int, "WideEdge"]:
    """State -> its terminal edge, for the wide states of `dfa` and their neighbours.

    Raises `CompileBudgetError` past `deadline` (a `time.perf_counter()` value).

    States where `skip` (bool `[Q]`) is set get no edge and anchor no loop (the copies
    of a spliced fragment, whose edges come from the fragment).

    * A wide state q (one looping on many bytes directly) gets a terminal back to itself.
    * Other states of its loop, such as the state after a backslash in a JSON string
      (`\\.` returns to q), get a terminal to q when enough tokens take that path.
    * A state p outside the loop whose bytes mostly lead to one loop state r (the
      opening of a string, a key that must differ from declared keys) gets an *entry*
      terminal: tokens whose first byte goes p -> r and whose rest goes r -> q.
    """
    states = np.arange(dfa.num_states)
    trans = dfa.transitions
    table, _, size = dfa.byte_classes  # [Q, C]: counts of bytes per state read this.
    self_loops = (table == states[:, None]) @ size
    if skip is None:
      skip = np.zeros(dfa.num_states, bool)
    anchors = np.nonzero((self_loops >= _loops.MIN_SELF_LOOP_BYTES) & ~skip)[0].tolist()
    wide: dict[int, WideEdge] = {}
    loops = []
    predecessors = state_predecessors(table) if anchors else None
    for q in anchors:
      members, loop = canonical_loop(dfa, q, skip, predecessors)
      digest = loop_digest(loop)
      terminal = self.terminal(loop, 0, digest=digest)
      if terminal.num_tokens >= _loops.MIN_TERMINAL_TOKENS:
        terminal = self.with_subtrie(terminal)
        phi = np.asarray(members, np.int32)
        wide[q] = WideEdge(((terminal, None),), terminal.bits, q, (phi,),
                           self.full_cover(terminal))
        loops.append((q, members, loop, digest))
    for q, members, loop, digest in loops:
      phi = np.asarray(members, np.int32)
      for entry, p in enumerate(members[1:], start=1):
        if p not in wide and not skip[p] and self.may_hold_many(loop, entry, digest):
          terminal = self.terminal(loop, entry, digest=digest)
          if terminal.num_tokens >= _loops.MIN_TERMINAL_TOKENS:
            # Most tokens cannot start here (after a backslash): a sub-trie of only
            # those that can is small.
            terminal = self.with_subtrie(terminal, trans[p] != NO_STATE)
            wide[p] = WideEdge(((terminal, None),), terminal.bits, q, (phi,),
                               self.full_cover(terminal))
    # States that move like a loop state but for a few bytes (`_near_loop.py`).
    wide.update(_near_loop.near_loop_edges(self, dfa, loops, wide, skip, predecessors))
    for q, members, loop, digest in loops:
      if time.perf_counter() > deadline:
        raise CompileBudgetError(
            f"{what} exceeded its compile time budget while finding wide states. Raise "
            "CompileOptions.max_seconds or simplify the constraint.")
      is_member = member_mask(dfa.num_states, members)
      position = {r: i for i, r in enumerate(members)}
      # Bytes into the loop, for the states with an arc into it (only they can qualify).
      candidates = predecessors.union(members)
      candidates = candidates[~skip[candidates] & ~is_member[candidates]]
      # (Row and int32 gathers by `take`: indexing by int32 arrays goes through numpy
      # 2.4's casting iterator, ~2x slower.)
      into_loop = is_member.take(table.take(candidates, axis=0)) @ size
      for p in candidates[into_loop >= _loops.MIN_SELF_LOOP_BYTES].tolist():
        if p in wide:
          continue
        row = trans[p]
        parts = []
        for entry in sorted(position[r] for r in set(row[is_member.take(row)].tolist())):
          first_bytes = row == members[entry]
          tail = self.terminal(loop, entry, after_first_byte=True, digest=digest)
          parts.append((tail, first_bytes))
        bits, count = self._entry_bits(parts)
        if count >= _loops.MIN_TERMINAL_TOKENS:
          phi = np.asarray(members, np.int32)
          # Sub-tries of only the tokens that start with a part's bytes: a narrow loop
          # entered on a few bytes (hex digits, say) leaves most tokens outside it.
          parts = tuple((self.with_subtrie(tail, first), first) for tail, first in parts)
          wide[p] = WideEdge(parts, bits, q, (phi,) * len(parts))
    self._add_pre_entries(dfa, wide, loops, skip, predecessors, deadline=deadline, what=what)
    return wide

  def _entry_bits(self, parts: list) -> tuple[np.ndarray, int]:
    """(bitmap, popcount) of an entry edge: the union of its parts' restricted bitmaps.

    Memoized per parts (bounded, per vocabulary), so that equal entry edges of one or
    many constraints share one array (`compose` then packs it once).
    """
    key = tuple((tail.key, np.packbits(first).tobytes()) for tail, first in parts)
    hit = self._entry_memo.get(key)
    if hit is None:
      restrict = self.first_byte_bits.restrict
      # Tokens are partitioned by first byte, so the parts' bitmaps are disjoint.
      bits = np.bitwise_or.reduce([restrict(tail, first) for tail, first in parts])
      bits.setflags(write=False)
      hit = (bits, popcount(bits))
      if len(self._entry_memo) >= _RESTRICT_CACHE_SIZE:
        self._entry_memo.pop(next(iter(self._entry_memo)))
      self._entry_memo[key] = hit
    return hit

  def _add_pre_entries(self, dfa: ByteDfa, wide: dict, loops: list, skip: np.ndarray,
                       predecessors: _loops.Predecessors | None, *, deadline: float,
                       what: str) -> None:
    """Terminals for states just before a wide region (after `Answer:`, before ` text`).

    A state p outside every loop whose bytes lead into the loop of anchor q, directly or
    through entry states (the first character of free text), gets a terminal to q when
    enough tokens take that way (` world` after `Answer:`: most tokens start with a
    space). Its automaton is the canonical loop plus p and those entry states, and its
    sub-trie holds p's other tokens of those first bytes, so the terminal is cached per
    local shape like the others, and p's remaining tokens keep explicit edges (those of
    other first bytes found in the full trie). Only tried when the tokens whose
    first byte leads that way are many, so this costs one cached trie walk per shape.
    """
    trans = dfa.transitions
    table, first, size = dfa.byte_classes
    # Tokens per class of first bytes, as float: a BLAS product per loop below.
    counts = np.add.reduceat(self.first_byte_bits.counts, first).astype(np.float64)
    index = np.full(dfa.num_states, NO_STATE, np.int32)
    # The states with an edge to each anchor, in `wide`'s order (the edges added below
    # go to the anchor of their own iteration: grouping once up front is the same).
    by_target: dict[int, list[int]] = {}
    for s, edge in wide.items():
      by_target.setdefault(edge.target, []).append(s)
    for q, members, loop, _ in loops:
      if time.perf_counter() > deadline:
        raise CompileBudgetError(
            f"{what} exceeded its compile time budget while finding wide states. Raise "
            "CompileOptions.max_seconds or simplify the constraint.")
      size = len(members)
      index[members] = np.arange(size, dtype=np.int32)
      entries = [s for s in by_target.get(q, ()) if index[s] < 0]
      way_in = member_mask(dfa.num_states, members + entries)
      # Only states with an arc that way can qualify: tokens whose first byte leads
      # that way, per such state (one product over them, not over every state).
      candidates = predecessors.union(members + entries)
      candidates = candidates[~skip[candidates] & (index[candidates] < 0)]
      tokens_in = way_in.take(table.take(candidates, axis=0)).astype(np.float64) @ counts
      for p in candidates[tokens_in >= _loops.MIN_TERMINAL_TOKENS].tolist():
        if p in wide:
          continue
        row = trans[p]
        way_bytes = way_in.take(row)  # (`take`s: see `find`.)
        outside = [p] + sorted(set(row[way_bytes].tolist()) - set(members))
        index[outside] = size + np.arange(len(outside), dtype=np.int32)
        rows = trans.take(outside, axis=0)
        shape = np.concatenate([loop, np.where(rows >= 0, index.take(np.maximum(rows, 0)),
                                               NO_STATE)]).astype(np.int32)
        index[outside] = NO_STATE
        # Tokens of p's other first bytes (not `way_bytes`) are walked in the full trie (a
        # partial edge): keeping them in this sub-trie would make it nearly the whole trie.
        terminal = self.terminal(shape, size)
        if terminal.num_tokens >= _loops.MIN_TERMINAL_TOKENS:
          terminal = self.with_subtrie(terminal, way_bytes)
          phi = np.asarray(members + outside, np.int32)
          wide[p] = WideEdge(((terminal, way_bytes),), terminal.bits, q, (phi,))
      index[members] = NO_STATE

  def may_hold_many(self, loop: np.ndarray, entry: int, digest: bytes) -> bool:
    """Whether the terminal of `loop` (`loop_digest` `digest`) at `entry` could hold
    `MIN_TERMINAL_TOKENS` tokens: at most the tokens whose first byte the loop reads there
    (inside a multi-byte character, only byte-fallback tokens), so most loop states
    need no trie walk."""
    many = self._many_memo.get(digest)
    if many is None:
      many = (loop != NO_STATE) @ self.first_byte_bits.counts >= _loops.MIN_TERMINAL_TOKENS
      if len(self._many_memo) >= 16 * _RESTRICT_CACHE_SIZE:  # Bounded (tiny arrays).
        self._many_memo.pop(next(iter(self._many_memo)))
      self._many_memo[digest] = many
    return bool(many[entry])

  @functools.cached_property
  def first_byte_bits(self) -> "_FirstByteBits":
    """Token bitmaps by first byte (8 MB for a 262k vocabulary; built on first use)."""
    return _FirstByteBits(self.trie, self.num_words)

  def terminal(self, loop: np.ndarray, entry: int, *, after_first_byte: bool = False,
               digest: bytes | None = None) -> LoopTerminal:
    """The cached terminal of `loop` entered at `entry` (see `build_loop_terminal`),
    without its sub-trie (`with_subtrie`): most candidates are rejected on their
    bitmap alone.

    `digest` is `loop_digest(loop)`, passed by callers that ask about one loop often.
    """
    if digest is None:
      digest = loop_digest(loop)
    shape = (digest, entry, after_first_byte)
    terminal = self._shape_memo.get(shape)
    if terminal is None:
      key = hashlib.sha1(digest + entry.to_bytes(4, "little") + bytes([after_first_byte])
                         ).hexdigest()[:20]
      terminal = self._load(key, loop=loop, entry=entry, after_first_byte=after_first_byte)
      if terminal is None:
        terminal = build_loop_terminal(loop, entry, self.trie, self.num_words, key,
                                       after_first_byte=after_first_byte)
        self._save(terminal)
      elif terminal.subtrie is not None:
        # Its file holds the sub-trie too (`with_subtrie` saved it): that goes to the
        # sub-trie memo (not read twice), and this memo keeps the bitmap alone, as when
        # built. Kept whole, sub-tries filled this memo's budget and terminals were read
        # from disk again and again (350 reads per pass over the schema corpus).
        if self._subtrie_memo.get(key) is None:
          self._subtrie_memo.put(key, terminal)
        terminal = dataclasses.replace(terminal, subtrie=None, full_node=None)
      self._shape_memo.put(shape, terminal)
    return terminal

  def with_subtrie(self, terminal: LoopTerminal, first_bytes: np.ndarray | None = None
                   ) -> LoopTerminal:
    """`terminal` with its sub-trie, limited to tokens starting with `first_bytes` (bool
    `[256]`, None for all) when given: a new terminal (its own key) with the same
    bitmap, built once, then cached in memory and on disk."""
    if terminal.subtrie is not None:
      return terminal
    key = terminal.key
    if first_bytes is not None and not first_bytes.all():
      key = hashlib.sha1(key.encode() + np.packbits(first_bytes).tobytes()).hexdigest()[:20]
    else:
      first_bytes = None
    known = self._subtrie_memo.get(key)
    if known is not None:
      return known
    loop_info = dict(loop=terminal.loop, entry=terminal.entry,
                     after_first_byte=terminal.after_first_byte, first_bytes=first_bytes)
    known = self._load(key, **loop_info)
    if known is None or known.subtrie is None:
      known = with_subtrie(dataclasses.replace(terminal, key=key, first_bytes=first_bytes),
                           self.trie)
      self._save(known)
    self._subtrie_memo.put(key, known)
    return known

  def full_cover(self, terminal: LoopTerminal) -> InsideCover | None:
    """`inside_cover(terminal)`, memoized per terminal key (one object per terminal, so
    that equal bitmaps are packed once)."""
    key = terminal.key
    if key not in self._cover_memo:
      if len(self._cover_memo) >= _RESTRICT_CACHE_SIZE:
        self._cover_memo.pop(next(iter(self._cover_memo)))
      self._cover_memo[key] = inside_cover(terminal)
    return self._cover_memo[key]

  def load_arrays(self, key: str) -> dict | None:
    """The arrays `save_arrays` stored under `key`, or None (other per-vocabulary results
    share this cache, its versioning and pruning: spliced fragments)."""
    path = self._path(key)
    if path is None or not os.path.exists(path):
      return None
    try:
      arrays = _array_file.read(path)
    except (OSError, ValueError):
      return None
    _cache.touch(path)  # Recently used: pruned last.
    return arrays

  def save_arrays(self, key: str, **arrays) -> None:
    """Stores `arrays` under `key` (best effort, like the terminals)."""
    path = self._path(key)
    if path is not None:
      self._write(path, **arrays)

  def _path(self, key: str) -> str | None:
    if self.cache_dir is None:
      return None
    return os.path.join(self.cache_dir, f"wide-v{WIDE_FORMAT_VERSION}-"
                        f"{self.trie.fingerprint[:24]}-{self.num_words}-{key}{_SUFFIX}")

  def _load(self, key: str, **loop_info) -> LoopTerminal | None:
    data = self.load_arrays(key)
    if data is None:
      return None
    try:
      sub, full_node = None, None
      if "full_node" in data:
        sub = VocabTrie(**{f: data[f] for f in _SUBTRIE_FIELDS},
                        fingerprint=f"{self.trie.fingerprint}/{key}")
        full_node = data["full_node"]
      terminal = LoopTerminal(key=key, bits=data["bits"], num_tokens=int(data["num_tokens"]),
                              subtrie=sub, full_node=full_node, **loop_info)
      if sub is not None and terminal.loop is not None and "exits_node_end" in data:
        # `exits` is a cached property: fill it as its first use would.
        terminal.__dict__["exits"] = LoopExits(
            full_node=full_node, **{f: data["exits_" + f] for f in _EXITS_FIELDS})
      return terminal
    except (KeyError, ValueError, TypeError):
      return None

  def _save(self, terminal: LoopTerminal) -> None:
    path = self._path(terminal.key)
    if path is None:
      return
    arrays = {}
    if terminal.subtrie is not None:
      arrays = {name: getattr(terminal.subtrie, name) for name in _SUBTRIE_FIELDS}
      arrays["full_node"] = terminal.full_node
      exits = terminal.exits  # Built now (composition would, on first use).
      if exits is not None:
        arrays.update({"exits_" + f: getattr(exits, f) for f in _EXITS_FIELDS})
    self._write(path, bits=terminal.bits, num_tokens=terminal.num_tokens, **arrays)

  def _write(self, path: str, **arrays) -> None:
    """Writes `arrays` to `path` (best effort: see `write_cache_file`; which prunes the
    cache now and then, `_cache.after_write`)."""
    write_cache_file(self.cache_dir, path, arrays, _array_file.write,
                     max_bytes=self.max_cache_bytes)

