r"""Counted chains: `P X{n,m} S` over a wide character class, in tables that do not grow with m.

A bounded repetition `X{n,m}` is a chain of states q_0 -> q_1 -> ... -> q_m, one per
number of X read (plus, per position, the states inside one X: the middle of a
multi-byte character or of an escape). Wide-state terminals (`_wide.py`) only serve
states with a self-loop, so every state of such a chain used to get its own ~250k
token edges. Here:

* Counting terminal. A token made wholly of c characters of the chain's class K
  (`X`'s one `CharClass` alternative) moves q_i -> q_{i+c}, valid iff i + c <= m. It is
  one terminal edge whose target is relative (`tables.py`): state + stride * c, c read
  from a per-(vocabulary, K) token character-count table (`token_counts`). Near the end
  its entry carries a bound, "at most m - i characters" (`tables.AT_MOST - r`, checked
  against `token_counts` by `advance`: no bitmap).
* Inside an X. A state inside an escape (after `\` or `\u0`) reads tokens wholly in K
  that finish the escape after k bytes and go on in K (`nthe`): one counting terminal
  per (inner state, k), target q + stride * c + a constant bias, with the same
  "at most r characters" bounds; tokens that end inside the escape (`u00`) get one
  terminal per inner state they end in. A UTF-8 lead byte's state reads no token
  wholly in K (they start with a lead byte): its tokens are explicit edges.
* Explicit edges. Every other token the chain may read (one that leaves the chain,
  like `abc",`, or contains an escape or a partial character) is found by walking, in
  the byte DFA, a sub-trie of the tokens that are not wholly in K and whose first byte
  after their K prefix some chain state reads. Targets inside the chain are relative,
  targets after it absolute.
* Compression. Whether a token is allowed from q_i, and where it leads relative to
  q_i, depends only on (min(n - i, L), min(m - i, L)) with L above the longest token.
  So the byte DFA is built for a compressed chain (`X{n', m'}`, n', m' <= 2L; laid
  out in numpy from X's own DFA, `_chain_dfa.py`, not through OpenFst), composed
  as above (cached per shape: all large bounds share one), and position i of the real
  chain uses the edge group, mask row and terminal entries of its compressed position
  f(i). States are numbered position by position (stride = states per position), so
  relative targets are the same for all of them, and `state_terminal_rows` points
  every state at its compressed position's terminal entries.

Unbounded chains (`X{n,}`: `minLength` alone, `{n,}` in a pattern). Positions 0..n
count as above, without filters (r is unbounded), and position n reads X back to itself
(its escapes included; the inner states of positions n - 1 and n are one). A token read
near n may overshoot it by up to L characters, so n is followed by a *strip* of 2L
positions, each behaving as n (same group, mask row and accepting), that no token
leaves: from n and the lower half a counting terminal moves forward by the count, from
the upper half one with stride -1 moves back by it (`CountingTerminals.strip_down`). Two
terminal rows, no filter, no per-count bitmap: tables as small as for `X{n,n}`.
Explicit moves within position n (an escape read in the loop) are absolute.

Mask rows hold each state's counting entries, bounds applied (`CountingTerminals.fold`):
the device gathers one row per step whatever the number of entries. Near the end, a
state whose entries share one bound r stores its row without the bound, and the device
removes the row of tokens longer than r (`excluded_bits`, one per r below the longest
token, shared by every slot): with Gemma 3, 42 rows and 31 exclusion rows for a JSON
string instead of 138 rows. States with several bounds (a backslash: `n...` finishes
the escape after 1 byte, `u0041...` after 5) keep a row per remaining count; all
farther positions share one row, one edge group and one terminal row.

Exact: a token may still cross the chain's end (`abc",`), every tokenization is kept,
and positions f maps together behave alike for every token. Tables grow with the
longest token; m only adds states (9 bytes each: group, terminal row, accepting).

Chains inside larger constraints (a string property with `maxLength` inside an object)
reuse these pieces in `_embedded_chains.py`. Not yet: `maxItems` of non-trivial items.
A state of a JSON string chain has up to 9 terminal entries (escapes under way); `advance`
gathers one word of each entry's bitmap (and of its filter, or its count for a bound).

Public names:
  Chain, find_chain(node)        the supported shape, recognized in IR.
  compile_chain(chain, trie, vocab, ...)  -> (ConstraintTables, stats dict) or None.
  CountingTerminals              the counting terminals and bounds of chain states, and
                                 the folded mask rows (`_counting_terminals.py`; also
                                 used by `_embedded_chains.py`).
"""

import dataclasses
import hashlib
import os
import re

import numpy as np

from constrained_decoding import _cache
from constrained_decoding import _packing
from constrained_decoding import tables as _tables
from constrained_decoding.automata import _chain_dfa
from constrained_decoding.automata import _chain_edges
from constrained_decoding.automata import _compose
from constrained_decoding.automata._counting_terminals import CountingTerminals  # Public here too.
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _loops
from constrained_decoding.automata._byte_dfa import NO_STATE
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.errors import CompileBudgetError

# A repeat of fewer repetitions goes through plain composition (few states anyway) ...
MIN_COUNT = 8
# ... except over a wide class (JSON string characters, `.`, `[^"]`), where even two
# positions of plain composition cost ~250k token edges each: counted from 2 on.
MIN_COUNT_WIDE, WIDE_CLASS_SIZE = 2, 128
# ... and so does one whose class has fewer code points (few tokens are wholly in it).
MIN_CLASS_SIZE = 16


@dataclasses.dataclass(frozen=True)
class Chain:
  """`prefix body{min,max} suffix`, with `char_class` the body's `CharClass` alternative;
  `max` None for `body{min,}` (`minLength` alone: see "Unbounded chains")."""

  prefix: bytes
  body: ir.Node
  char_class: ir.CharClass
  min: int
  max: int | None
  suffix: bytes


def _lead_bytes(char_class: ir.CharClass) -> np.ndarray:
  """bool [256]: first UTF-8 bytes of the characters of the class (monotone in code point)."""
  out = np.zeros(256, bool)
  for lo, hi in char_class.ranges:
    out[chr(lo).encode()[0]:chr(hi).encode()[0] + 1] = True
  return out


def find_chain(node: ir.Node) -> Chain | None:
  """The counted chain `node` is, or None (then plain composition applies).

  Supported: `Concat` of `Bytes` around one `Repeat(X, n, m)`, m >= `MIN_COUNT` (or m
  unbounded and n >= `MIN_COUNT`; `MIN_COUNT_WIDE` for K of `WIDE_CLASS_SIZE` code
  points or more), where X
  is a `CharClass` K of at least `MIN_CLASS_SIZE` code points, or a `Union` of one such
  K with alternatives that never start with a character of K (JSON escapes); the suffix
  must not start with a character of K either, so a token wholly in K is X repeated
  once per character.
  """
  parts = node.parts if isinstance(node, ir.Concat) else (node,)
  repeats = [k for k, p in enumerate(parts) if isinstance(p, ir.Repeat)]
  if len(repeats) != 1:
    return None
  k = repeats[0]
  if not all(isinstance(p, ir.Bytes) for j, p in enumerate(parts) if j != k):
    return None
  repeat = parts[k]
  bound = repeat.min if repeat.max is None else repeat.max
  if bound < MIN_COUNT_WIDE:
    return None
  alternatives = repeat.node.alternatives if isinstance(repeat.node, ir.Union) else (repeat.node,)
  classes = [a for a in alternatives if isinstance(a, ir.CharClass)]
  size = sum(hi - lo + 1 for lo, hi in classes[0].ranges) if len(classes) == 1 else 0
  if size < MIN_CLASS_SIZE or (bound < MIN_COUNT and size < WIDE_CLASS_SIZE):
    return None
  lead = _lead_bytes(classes[0])
  for other in alternatives:  # Escapes: never starting with a character of K.
    if other is classes[0]:
      continue
    dfa = _small_dfa(other)
    if (dfa.num_states == 0 or len(dfa.token_arcs) or len(dfa.fragment_arcs)
        or (lead & (dfa.transitions[dfa.start] != NO_STATE)).any()):
      return None
  suffix = b"".join(p.data for p in parts[k + 1:])
  if suffix and lead[suffix[0]]:
    return None
  return Chain(prefix=b"".join(p.data for p in parts[:k]), body=repeat.node,
               char_class=classes[0], min=repeat.min, max=repeat.max, suffix=suffix)


_SMALL_DFA_CACHE: dict = {}
_SMALL_DFA_CACHE_SIZE = 64


def _small_dfa(node: ir.Node):
  """`_fsa.compile_byte_dfa(node)` of a chain's body or escape, kept for the process
  (a few per class, ~0.5 ms each): every new chain shape over one body asks again.
  Callers only read the arrays."""
  hit = _SMALL_DFA_CACHE.get(node)
  if hit is None:
    if len(_SMALL_DFA_CACHE) >= _SMALL_DFA_CACHE_SIZE:
      _SMALL_DFA_CACHE.pop(next(iter(_SMALL_DFA_CACHE)))
    hit = _SMALL_DFA_CACHE[node] = _fsa.compile_byte_dfa(node)
  return hit


_SLOTS_CACHE: dict = {}


def _body_slots(body: ir.Node) -> _chain_dfa.BodySlots | None:
  """`_chain_dfa.body_slots` of a chain's body, kept for the process like `_small_dfa`."""
  if body not in _SLOTS_CACHE:
    if len(_SLOTS_CACHE) >= _SMALL_DFA_CACHE_SIZE:
      _SLOTS_CACHE.pop(next(iter(_SLOTS_CACHE)))
    _SLOTS_CACHE[body] = _chain_dfa.body_slots(_small_dfa(body))
  return _SLOTS_CACHE[body]


def compressed_dfa(chain: Chain, n2: int, m2: int):
  """(dfa, cell, stride, inner, body): the byte DFA of `prefix body{n2,m2} suffix`
  (`body{n2,}` for an unbounded chain), numbered as `_chain_dfa.build` numbers it, and
  `_chain_layout`'s cell layout; None when it is not a clean chain.

  Built in numpy (`_chain_dfa.py`, ~1 ms); through OpenFst (~11-60 ms) only when that
  does not apply, then renumbered the same way (`_chain_dfa.canonical`), so the tables
  never depend on OpenFst's numbering."""
  unbounded = chain.max is None
  slots = _body_slots(chain.body)
  if slots is not None:
    built = _chain_dfa.build(chain.prefix, slots, chain.suffix, n2, m2, unbounded)
    if built is not None:
      return built + (slots.stride, slots.inner, slots.body)
  node = ir.concat(ir.Bytes(chain.prefix), ir.repeat(chain.body, n2, None if unbounded else m2),
                   ir.Bytes(chain.suffix))
  dfa = _fsa.compile_byte_dfa(node)
  if dfa.num_states == 0 or len(dfa.token_arcs) or len(dfa.fragment_arcs):
    return None
  layout = _chain_layout(dfa, chain, m2, loops=unbounded)
  if layout is None:
    return None
  cell, stride, inner, body = layout
  dfa, cell = _chain_dfa.canonical(dfa, cell, chain.prefix, chain.suffix, n2)
  return dfa, cell, stride, inner, body


@dataclasses.dataclass(frozen=True, eq=False)
class _ClassCounts:
  """Per (vocabulary, K): characters of each token wholly in K, and for the others the
  first byte after their longest K prefix (-1 for tokens wholly in K or without bytes)."""

  counts: np.ndarray     # int8 [V]
  next_byte: np.ndarray  # int16 [V]
  first_bytes: np.ndarray  # uint8 [V, FIRST_BYTES]: each token's first bytes, 0 padded
  lengths: np.ndarray    # uint8 [V]: each token's length in bytes, at most 255
  bitmaps: dict          # remaining count r -> uint32 [W] of tokens with 1 <= c <= r
  subtries: dict         # readable bytes -> trie of the tokens chain states walk
  inner: dict            # (body, inner states) -> tokens read inside an X (`_inner_tokens`)
  path: str | None = None  # The counts' file in the disk cache, if any


_CLASS_CACHE: dict = {}
_CLASS_CACHE_SIZE = 16


# Bumped (in `_cache.FORMATS`) when the cached class counts change meaning.
_COUNTS_FORMAT = _cache.FORMATS["class-counts"].version
COUNTS_SUFFIX = _cache.FORMATS["class-counts"].suffix  # Also of -subtrie-, -inner- files.
# Leading bytes of each token kept with the counts (escapes read inside an X are
# shorter: `_counting_terminals._inner_tokens`).
FIRST_BYTES = 8
_COUNT_FIELDS = {"counts": np.int8, "next_byte": np.int16, "first_bytes": np.uint8,
                 "lengths": np.uint8}


def _class_counts(vocab, char_class: ir.CharClass, cache_dir: str | None = None
                  ) -> _ClassCounts:
  """The counts of `char_class` for `vocab`: kept in memory (a few per process) and, with
  a `cache_dir`, on disk (one scan of the vocabulary, 0.3-0.5 s with Gemma 3, per class
  and vocabulary ever)."""
  key = (vocab.fingerprint, char_class.ranges)
  hit = _CLASS_CACHE.get(key)
  if hit is not None:
    return hit
  path = _counts_path(cache_dir, vocab, char_class)
  arrays = _load_counts(path, vocab.vocab_size)
  if arrays is None:
    arrays = dict(zip(("counts", "next_byte"), _count_tokens(vocab, char_class)))
    arrays["first_bytes"], arrays["lengths"] = _first_bytes(vocab)
    if path is not None:
      _detokenizer.write_cache_file(cache_dir, path, arrays)
  out = _ClassCounts(**arrays, bitmaps={}, subtries={}, inner={}, path=path)
  if len(_CLASS_CACHE) >= _CLASS_CACHE_SIZE:
    _CLASS_CACHE.pop(next(iter(_CLASS_CACHE)))
  _CLASS_CACHE[key] = out
  return out


def _count_tokens(vocab, char_class: ir.CharClass) -> tuple[np.ndarray, np.ndarray]:
  """(counts int8 [V], next_byte int16 [V]) of `_ClassCounts`, by scanning every token."""
  pattern = re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in char_class.ranges)
                       + "]*")
  counts = np.zeros(vocab.vocab_size, np.int8)
  next_byte = np.full(vocab.vocab_size, -1, np.int16)
  for t, data in enumerate(vocab.token_bytes):
    if not data:
      continue
    # Undecodable bytes become lone surrogates (U+DC80..), never in K.
    text = data.decode("utf-8", "surrogateescape")
    end = pattern.match(text).end()
    if end == len(text) and end < 128:
      counts[t] = end
    elif end == len(text):  # Too many characters to count in int8: walked explicitly.
      next_byte[t] = 256
    else:
      ch = ord(text[end])
      next_byte[t] = ch - 0xDC00 if 0xDC80 <= ch <= 0xDCFF else text[end].encode()[0]
  return counts, next_byte


def _first_bytes(vocab) -> tuple[np.ndarray, np.ndarray]:
  """(uint8 [V, FIRST_BYTES] leading bytes, 0 padded; uint8 [V] lengths, at most 255)."""
  data = [b or b"" for b in vocab.token_bytes]
  data += [b""] * (vocab.vocab_size - len(data))
  lengths = np.fromiter(map(len, data), np.int64, len(data))
  flat = np.frombuffer(b"".join(data) + bytes(FIRST_BYTES), np.uint8)
  index = (np.cumsum(lengths) - lengths)[:, None] + np.arange(FIRST_BYTES)
  first = np.where(np.arange(FIRST_BYTES) < lengths[:, None], flat[index], 0).astype(np.uint8)
  return first, np.minimum(lengths, 255).astype(np.uint8)


def _counts_path(cache_dir: str | None, vocab, char_class: ir.CharClass) -> str | None:
  if cache_dir is None:
    return None
  digest = hashlib.sha256(repr(char_class.ranges).encode()).hexdigest()[:16]
  return os.path.join(cache_dir,
                      f"class-counts-v{_COUNTS_FORMAT}-{vocab.fingerprint}-{digest}{COUNTS_SUFFIX}")


def _load_counts(path: str | None, vocab_size: int) -> dict | None:
  """The cached arrays (`_COUNT_FIELDS`), or None when absent or not what this version
  writes."""
  arrays = _detokenizer.read_cache_file(path, _COUNT_FIELDS)
  if arrays is None:
    return None  # Missing or damaged: counted again (and rewritten).
  for name, dtype in _COUNT_FIELDS.items():
    a = arrays[name]
    if a.shape[:1] != (vocab_size,) or a.dtype != dtype:
      return None
  if arrays["first_bytes"].shape != (vocab_size, FIRST_BYTES):
    return None
  return arrays


def _compressed(n: int, m: int, span: int) -> tuple[int, int, np.ndarray]:
  """(n', m', f): compressed bounds and the compressed position f[i] of each i <= m.

  Positions within `span` of 0, n and m keep their distance to them; runs farther from
  all three collapse into one position. f[i] = i for i <= span.
  """
  i = np.arange(m + 1, dtype=np.int64)
  n2 = n if n <= 2 * span else 2 * span
  d = m - n
  d2 = d if d <= 2 * span else 2 * span
  if n <= 2 * span:
    head = i
  else:
    head = np.where(i <= span, i, np.where(i <= n - span, span, n2 - (n - i)))
  x = i - n
  if d <= 2 * span:
    tail = n2 + x
  else:
    tail = np.where(x <= span, n2 + x, np.where(x <= d - span, n2 + span, n2 + d2 - (m - i)))
  return n2, n2 + d2, np.where(i <= n, head, tail)


def _chain_layout(dfa, chain: Chain, length: int, loops: bool = False):
  """(position state [length + 1], slot of each inner X state, stride), or None if the
  byte DFA is not a clean chain (then plain composition applies). With `loops`, the last
  position reads X back to itself (`X{n,}`), escapes included."""
  q = dfa.start
  for b in chain.prefix:
    q = int(dfa.transitions[q, b])
    if q == NO_STATE:
      return None
  body = _small_dfa(chain.body)
  finals = np.flatnonzero(body.accepting)
  if (body.transitions[finals] != NO_STATE).any() or body.accepting[body.start]:
    return None  # X must be prefix-free and non-empty.
  inner = _chain_dfa.inner_states(body)  # Topological: moves forward have offsets >= 0.
  if inner is None:
    return None
  slot = {x: k + 1 for k, x in enumerate(inner)}
  stride = len(inner) + 1
  # The moves of X: (slot before, byte, slot after or `stride` for a finished X).
  moves = [(0 if x == body.start else slot[x], b,
            stride if body.accepting[x2] else slot[x2])
           for x in [body.start] + inner
           for b in np.flatnonzero(body.transitions[x] != NO_STATE).tolist()
           for x2 in [int(body.transitions[x, b])]]
  trans = dfa.transitions
  cell = np.full((length + 1, stride), NO_STATE, np.int64)
  cell[0, 0] = q
  # Boundaries by one path through X (a first byte, then any move on), vectorized
  # afterwards: each inner slot from one move into it, then every move checked.
  path, here = [], 0
  while here != stride:
    here_moves = [mv for mv in moves if mv[0] == here]
    if not here_moves:
      return None
    path.append(here_moves[0][1])
    here = here_moves[0][2]
  for j in range(length):
    s = int(cell[j, 0])
    for b in path:
      s = int(trans[s, b]) if s != NO_STATE else NO_STATE
    if s == NO_STATE:
      return None
    cell[j + 1, 0] = s
  # The positions that read X, and the position each one's finished X leads to.
  rows = cell if loops else cell[:length]
  heads = np.concatenate([cell[1:, :1], cell[length:, :1]]) if loops else cell[1:, :1]
  for k in range(1, stride):  # Topological order: the source slot is already known.
    before, b, _ = next(mv for mv in moves if mv[2] == k)
    rows[:, k] = np.where(rows[:, before] >= 0, trans[np.maximum(rows[:, before], 0), b],
                          NO_STATE)
  before, byte, after = (np.array(column, np.int64) for column in zip(*moves))
  if (rows < 0).any():
    return None
  got = trans[rows[:, before], byte[None, :]]  # [positions, moves]
  want = np.concatenate([rows, heads], axis=1)[:, after]
  if not np.array_equal(got, want):
    return None
  if not loops:  # The last position reads no more X, except a suffix's first byte.
    suffix_byte = chain.suffix[0] if chain.suffix else -1
    last_reads = byte[(before == 0) & (byte != suffix_byte)]
    if (trans[cell[length, 0], last_reads] != NO_STATE).any():
      return None
  distinct = cell.copy()
  if loops:  # The inner states of the last two positions lead alike (to the last): one.
    distinct[length, 1:][cell[length, 1:] == cell[length - 1, 1:]] = NO_STATE
  flat = distinct[distinct != NO_STATE]
  if len(np.unique(flat)) != len(flat) or (rows == NO_STATE).any():
    return None
  return cell, stride, inner, body


@dataclasses.dataclass(frozen=True, eq=False)
class _Compressed:
  """The compressed chain composed with a vocabulary: everything but the expansion to
  the real chain length, which only renumbers states (cached per shape: every bound
  past 2L saturates, so `maxLength` 1,000 and 10,000 share one).

  Per compressed byte-DFA state: its group (-1 if dead), counting terminal entries, and
  whether it accepts; `cell[j, k]` is the state at position j, slot k of the chain.
  """

  cell: np.ndarray           # int64 [m' + 1, stride]
  stride: int
  others: np.ndarray         # compressed states outside the chain, in token-DFA order
  start: int                 # token-DFA id of the start if outside the chain, else -1
  group_of: np.ndarray       # int64 [Q]
  entry_rows: np.ndarray     # int64 [U, R, 2]: distinct counting entry lists (id, filter)
  entry_row_of: np.ndarray   # int64 [Q]: each state's row of `entry_rows`
  accepting: np.ndarray      # bool [Q]
  mask_bits: np.ndarray      # uint32 [M_pad, W]
  group_mask: np.ndarray     # int32 [G_pad]
  excluded_bits: np.ndarray  # uint32 [X_pad, W] ([0, 0]: none; then group_excluded is [0])
  edge_start: np.ndarray     # int32 [G_pad + 1]
  edge_tokens: np.ndarray    # int32 [E_pad]
  edge_targets: np.ndarray   # int32 [E_pad]; absolute ones index the `others` first
  terminal_bits: np.ndarray  # uint32 [T_pad, W]
  terminal_counts: np.ndarray  # int32 [T_pad, 3]
  token_counts: np.ndarray   # int8 [1, V]
  stats: dict
  down: np.ndarray | None = None  # int64 [R, 2]: the upper strip's entries (unbounded)
  group_excluded: np.ndarray = dataclasses.field(  # int32 [G_pad] or [0]
      default_factory=lambda: np.zeros(0, np.int32))


_COMPRESSED_CACHE: dict = {}
_COMPRESSED_CACHE_SIZE = 16


def compile_chain(chain: Chain, trie, vocab, *, min_bucket: int, max_edges: int,
                  max_table_bytes: int, deadline: float, what: str,
                  cache_dir: str | None = None):
  """Tables for `chain` with relative targets, or None when its byte DFA is not a clean
  chain. Returns (tables, stats) where stats holds the sizes `CompileInfo` reports.

  Raises:
    CompileBudgetError: The real chain's states alone would exceed `max_table_bytes`
      (checked before they are allocated).
  """
  span = int(trie.node_depth.max(initial=0)) + 2  # Above the longest token, in bytes.
  unbounded = chain.max is None
  last = chain.min if unbounded else chain.max  # The last position of the chain proper.
  n2, m2, f = _compressed(chain.min, last, span)
  key = (vocab.fingerprint, chain.prefix, chain.body, chain.suffix, n2, m2, unbounded,
         min_bucket)
  if key in _COMPRESSED_CACHE:
    part = _COMPRESSED_CACHE[key]
  else:
    part = _compose_compressed(chain, n2, m2, span, trie, vocab, min_bucket=min_bucket,
                               max_edges=max_edges, deadline=deadline, what=what,
                               cache_dir=cache_dir)
    if len(_COMPRESSED_CACHE) >= _COMPRESSED_CACHE_SIZE:
      _COMPRESSED_CACHE.pop(next(iter(_COMPRESSED_CACHE)))
    _COMPRESSED_CACHE[key] = part
  if part is None:
    return None
  # Token-DFA numbering: the other states first, then position i, slot k of the real
  # chain at base + i * stride + k, which behaves as compressed position f[i]; an
  # unbounded chain's strip of 2 * span positions after its last one behaves as it.
  stride, base = part.stride, len(part.others)
  strip = 2 * span if unbounded else 0
  num_states = base + (last + 1 + strip) * stride
  # Per state: group (4 bytes), terminal row (4) and accepting (1).
  state_bytes = 9 * _tables.bucket_size(num_states, min_bucket)
  if state_bytes > max_table_bytes:
    raise CompileBudgetError(
        f"{what} needs {num_states} states ({state_bytes / 2**20:.1f} MiB for them alone)."
        f" Expected at most CompileOptions.max_table_bytes={max_table_bytes}. Lower the "
        f"repetition bound {last} or raise the budget.")
  cells = part.cell[f]
  if unbounded:  # The strip: slot 0 of the last position, over and over.
    strip_cells = np.full((strip, stride), -1, np.int64)
    strip_cells[:, 0] = part.cell[m2, 0]
    cells = np.concatenate([cells, strip_cells])
  compressed_of = np.concatenate([part.others, cells.reshape(-1)])
  # Per-state arrays with one more entry, what a state of no compressed one (-1) gets:
  # indexed by `compressed_of` directly (~200k states for maxLength 10,000).
  s_pad = _tables.bucket_size(num_states, min_bucket)
  state_groups = np.full((s_pad, 1), _tables.NO_STATE, np.int32)
  state_groups[:num_states, 0] = np.append(part.group_of, -1)[compressed_of]
  accepting = np.zeros(s_pad, bool)
  accepting[:num_states] = np.append(part.accepting, False)[compressed_of]
  # Terminal entries depend on the compressed state only: one row per distinct list
  # (plus an empty last row for padding and dead states), shared through
  # `state_terminal_rows`.
  q = len(part.entry_rows)
  state_terminals = np.full((_tables.bucket_size(q + 1 + unbounded, min_bucket),)
                            + part.entry_rows.shape[1:], _tables.NO_STATE, np.int32)
  state_terminals[:q] = part.entry_rows
  state_terminal_rows = np.full(s_pad, q, np.int32)
  state_terminal_rows[:num_states] = np.append(part.entry_row_of, q)[compressed_of]
  edge_targets = part.edge_targets
  if unbounded:
    # The upper half of the strip moves back (its row q + 1), the lower half and the
    # last position forward: from either, a token stays on the strip.
    state_terminals[q + 1, :len(part.down)] = part.down
    upper = base + (last + 1 + span + np.arange(span)) * stride
    state_terminal_rows[upper] = q + 1
    # Absolute targets at the last position (loops: a move back to its own slots) are
    # compressed ids: made real.
    edge_targets = np.where(edge_targets >= base + m2 * stride,
                            edge_targets + (last - m2) * stride, edge_targets).astype(np.int32)
  start = part.start if part.start >= 0 else base
  tables = _tables.ConstraintTables(
      start=np.array([start], np.int32), accepting=accepting, mask_bits=part.mask_bits,
      state_groups=state_groups, group_mask=part.group_mask,
      group_pops=np.full((len(part.group_mask), 0), _tables.NO_STATE, np.int32),
      group_num_pops=np.zeros(len(part.group_mask), np.int32), edge_start=part.edge_start,
      edge_tokens=part.edge_tokens, edge_targets=edge_targets,
      edge_pushes=np.zeros(len(part.edge_tokens), np.int32),
      push_symbols=np.zeros((1, 0), np.int32), push_lengths=np.zeros(1, np.int32),
      eos_bits=_tables.bitmask(np.asarray(vocab.eos_ids, np.int64), vocab.vocab_size),
      terminal_bits=part.terminal_bits, state_terminals=state_terminals,
      state_terminal_rows=state_terminal_rows,
      terminal_counts=part.terminal_counts,
      token_counts=part.token_counts, vocab_size=vocab.vocab_size, stack_depth=0,
      vocab_fingerprint=vocab.fingerprint, group_excluded=part.group_excluded,
      excluded_bits=part.excluded_bits)
  return tables, dict(part.stats, token_states=num_states)


def _compose_compressed(chain: Chain, n2: int, m2: int, span: int, trie, vocab, *,
                        min_bucket: int, max_edges: int, deadline: float,
                        what: str, cache_dir: str | None) -> _Compressed | None:
  """The compressed chain `prefix body{n2,m2} suffix` composed with the vocabulary."""
  w = _tables.num_words(vocab.vocab_size)
  unbounded = chain.max is None
  layout = compressed_dfa(chain, n2, m2)
  if layout is None:
    return None
  dfa, cell, stride, inner, body = layout
  q = dfa.num_states
  # Compressed DFA state -> (position, slot) for chain states, -1 for the others.
  position = np.full(q, -1, np.int64)
  slot = np.full(q, -1, np.int64)
  js, ks = np.nonzero(cell != NO_STATE)
  position[cell[js, ks]], slot[cell[js, ks]] = js, ks
  in_chain = position >= 0
  others = np.flatnonzero(~in_chain)
  counts = _class_counts(vocab, chain.char_class, cache_dir)
  # Explicit edges: the other states walk the full trie (prefix and suffix: few tokens
  # start there), chain states the sub-trie of tokens not wholly in K whose first byte
  # after their K prefix some chain state reads.
  parts = []
  budget = dict(max_edges=max_edges, deadline=deadline, what=what)
  if len(others):
    parts += _compose._walk(dfa, trie, others, **budget)
  chain_states = np.flatnonzero(in_chain)
  readable = (dfa.transitions[chain_states] != NO_STATE).any(axis=0)
  subtrie = _chain_subtrie(counts, readable, trie)
  if len(subtrie.token_ids):
    parts += _chain_edges.walk_chain(dfa, subtrie, cell, stride, n2, m2, span, budget)
  src, tok, dst = (_compose._concatenate_columns(parts) if parts
                   else (np.zeros(0, np.int64),) * 3)
  src, tok, dst = (np.asarray(a, np.int64) for a in (src, tok, dst))
  # Counting terminals (tokens wholly in K), per chain state.
  counting = CountingTerminals(w)
  entries_of: dict[int, list] = {}
  moves: list[tuple[np.ndarray, np.ndarray]] = []  # Terminal moves, for liveness.
  if not counting.add_chain(chain, cell, m2, stride, inner, body, counts, vocab, entries_of,
                            moves):
    return None
  down = counting.strip_down(chain, stride, counts) if unbounded else None
  bitmaps, counts_of_terminals = counting.bitmaps, counting.counts
  live = _chain_edges.live_states(q, np.concatenate([src] + [a for a, _ in moves]),
                      np.concatenate([dst] + [b for _, b in moves]), dfa.start, dfa.accepting)
  if not live[dfa.start]:
    return None  # Let plain composition report the empty constraint.
  keep = live[src] & live[dst]
  src, tok, dst = src[keep], tok[keep], dst[keep]
  base = len(others)
  new_other = np.full(q, -1, np.int64)
  new_other[others] = np.arange(len(others))
  # Moves within an unbounded chain's last position (an escape read in its loop) go
  # back to slot 0: absolute, as that position is one real position.
  # (Per edge: gathers of a few per-state arrays, ~100k edges for maxLength 10,000.)
  at_last = in_chain & (position == m2) if unbounded else np.zeros(q, bool)
  linear = position * stride + slot  # A chain state's offset from position 0, slot 0.
  src_in, dst_in = in_chain[src], in_chain[dst]
  relative = src_in & dst_in
  if unbounded:
    relative &= ~(at_last[src] & at_last[dst])
  dst_linear = linear[dst]
  offset = dst_linear - linear[src]
  absolute = np.where(dst_in, base + dst_linear, new_other[dst])
  if (dst_in & ~src_in & (position[dst] > span)).any():
    return None  # Entries past the identity region: not expected (tokens are shorter).
  if (relative & (offset < 0)).any():
    return None  # Not expected: slots are in topological order.
  target = np.where(relative, _tables.RELATIVE - offset, absolute)
  # Groups: one per live compressed state (dead ones get none).
  group_of = np.full(q, -1, np.int64)
  live_states = np.flatnonzero(live)
  group_of[live_states] = np.arange(len(live_states))
  g = len(live_states)
  e_group, e_tok, e_target = _chain_edges.sorted_edges(group_of[src], tok, target, g, vocab.vocab_size)
  width = max((len(v) for v in entries_of.values()), default=1)
  entries = _chain_edges.entry_table(entries_of, live, width)
  # Far from the chain's ends the lists repeat (relative targets): stored once each.
  entry_rows, entry_row_of = _chain_edges.unique_rows(entries.reshape(q, -1))
  entry_rows = entry_rows.reshape(-1, width, 2)
  # Masks: the explicit tokens of each group, deduplicated, then each group's counting
  # entries ORed in (`CountingTerminals.fold`).
  e_start = np.searchsorted(e_group, np.arange(g + 1))
  rows: dict[bytes, int] = {}
  row_of_group = np.zeros(g, np.int64)
  first_group = []
  tok_bytes = e_tok.astype(np.int32).tobytes()
  bounds = e_start.tolist()
  for k in range(g):
    row = rows.setdefault(tok_bytes[4 * bounds[k]:4 * bounds[k + 1]], len(rows))
    if row == len(first_group):
      first_group.append(k)
    row_of_group[k] = row
  t_pad = _tables.bucket_size(len(bitmaps), 1)
  terminal_bits = np.zeros((t_pad, w), np.uint32)
  terminal_bits[:len(bitmaps)] = np.stack(bitmaps)
  terminal_counts = np.full((t_pad, 3), -1, np.int32)
  terminal_counts[:len(counts_of_terminals)] = counts_of_terminals
  mask_bits = np.zeros((_tables.bucket_size(len(rows), min_bucket), w), np.uint32)
  for row, k in enumerate(first_group):
    toks = e_tok[bounds[k]:bounds[k + 1]]
    if len(toks):
      np.bitwise_or.at(mask_bits[row], toks >> 5, np.uint32(1) << (toks & 31).astype(np.uint32))
  # Each live state's entries as `entry_rows` holds them (one tuple per distinct list).
  # (Entries fill a row from its start, then -1.)
  lengths = np.count_nonzero(entry_rows[:, :, 0] >= 0, axis=1).tolist()
  listed = [tuple(map(tuple, row[:n])) for row, n in zip(entry_rows.tolist(), lengths)]
  ids = entry_row_of[live_states]
  folded = counting.fold(mask_bits, row_of_group, [listed[u] for u in ids.tolist()],
                         min_bucket, entry_ids=ids)
  mask_bits, row_of_group = folded.mask_bits, folded.group_mask
  g_pad = _tables.bucket_size(g, min_bucket)
  e = len(e_tok)
  e_pad = _tables.bucket_size(e, min_bucket)
  edge_start = np.full(g_pad + 1, e, np.int32)
  edge_start[:g + 1] = e_start
  group_mask = np.zeros(g_pad, np.int32)
  group_mask[:g] = row_of_group
  edges = dict(group_mask=group_mask, edge_start=edge_start,
               edge_tokens=_packing._padded(e_tok, e_pad, _tables.PAD_TOKEN),
               edge_targets=_packing._padded(e_target, e_pad, _tables.NO_STATE))
  if len(folded.group_excluded):
    edges["group_excluded"] = _packing._padded(folded.group_excluded, g_pad, 0)
  # Positions far from the chain's ends (and from its start, when n = 0) have the same
  # edges (targets relative) and rows: one group for all of them.
  shared = _packing.share_groups(edges["edge_start"], edges["edge_tokens"],
                                 edges["edge_targets"], group_mask, g, min_bucket,
                                 group_excluded=edges.get("group_excluded"))
  if shared is not None:
    merged, fields = shared
    group_of = np.where(group_of >= 0, merged[np.maximum(group_of, 0)], -1)
    edges = {name: fields[name] for name in edges}
  return _Compressed(
      cell=np.where(cell >= 0, cell, -1), stride=stride, others=others,
      start=int(new_other[dfa.start]) if not in_chain[dfa.start] else -1,
      group_of=group_of, entry_rows=entry_rows, entry_row_of=entry_row_of,
      accepting=dfa.accepting & live,
      mask_bits=mask_bits, excluded_bits=folded.excluded_bits, **edges,
      terminal_bits=terminal_bits, terminal_counts=terminal_counts,
      token_counts=counts.counts[None, :],
      stats=dict(byte_states=q, token_edges=int(edges["edge_start"][-1]),
                 num_terminals=len(bitmaps),
                 num_masks=int(row_of_group.max(initial=0)) + 1),
      down=np.array([down], np.int64) if unbounded else None)


def _chain_subtrie(counts: _ClassCounts, readable: np.ndarray, trie, shorter_than: int = 1):
  """The trie of the tokens not wholly in K whose first byte after their K prefix is
  `readable` (bool [256]) from some chain state, and of the tokens wholly in K of fewer
  than `shorter_than` characters (cached per readable set and bound)."""
  key = readable.tobytes() + (b"" if shorter_than <= 1 else b"<%d" % shorter_than)
  hit = counts.subtries.get(key)
  if hit is not None:
    return hit
  # On disk next to the counts (a first compile would spend ~40 ms on it and on the
  # trie's parent links it needs).
  path = None if counts.path is None else counts.path[:-len(COUNTS_SUFFIX)] + (
      f"-subtrie-{hashlib.sha256(key).hexdigest()[:16]}{COUNTS_SUFFIX}")
  hit = _load_trie(path, trie.fingerprint + ":counted")
  if hit is None:
    nb = counts.next_byte
    wanted = (nb == 256) | ((nb >= 0) & (nb < 256) & readable[np.clip(nb, 0, 255)])
    wanted |= (counts.counts > 0) & (counts.counts < shorter_than)
    special = np.zeros(int(trie.token_ids.max(initial=0)) + 1, bool)
    special[:] = wanted[:len(special)]
    hit = _loops._subtrie(trie, special, trie.fingerprint + ":counted")[0]
    if path is not None:
      _detokenizer.write_cache_file(os.path.dirname(path), path, {
          name: getattr(hit, name) for name in _TRIE_FIELDS})
  counts.subtries[key] = hit
  return hit


_TRIE_FIELDS = ("child_start", "child_byte", "child_node", "node_depth", "token_start",
                "token_ids")


def _load_trie(path: str | None, fingerprint: str):
  """The `VocabTrie` saved at `path`, or None when absent or damaged."""
  a = _detokenizer.read_cache_file(path, _TRIE_FIELDS)
  if a is None:
    return None  # Missing or damaged: built again.
  if not (len(a["child_start"]) == len(a["node_depth"]) + 1 == len(a["token_start"])
          and a["child_start"][-1] == len(a["child_node"]) == len(a["child_byte"])
          and a["token_start"][-1] == len(a["token_ids"])):
    return None  # Not a trie: built again.
  return _detokenizer.VocabTrie(**a, fingerprint=fingerprint)
