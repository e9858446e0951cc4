"""Distinct strings on the device: `uniqueItems` for arrays of string items.

Distinct strings are not a regular language, so an array of them is written with
register markers (`_json_array_schemas.unique_strings`): `uopen` before an item's
opening quote and `uclose` before its closing quote, both naming a block of register
words

  [h0, h1, n, s0_0, s0_1, ..., s(cap-1)_0, s(cap-1)_1]

h = (h0, h1) the hash of the item being written so far, n the items finished, s_j the
hash of item j. The hash of bytes x_1..x_k is, per word, sum (x_i + 1) B^(k - i) mod
p = 2^31 - 1 for the word's base B (`BASES`), so it composes over any split of the
bytes: hash(xy) = hash(x) * B^|y| + hash(y). A token therefore changes the hash by one
multiply-add per word whatever it crosses, with constants computed here:

* a token read in a state inside an item (`hashing_states`) that crosses no marker
  extends the hash by its own bytes: its row of `token_hash` (B^n, hash) per word;
* a token crossing markers gets a guard (`attach` in `_registers.py` calls `rewrite`):
  UCLOSE with the (multiplier, addend) that finish the item it closes (B^|head| and
  hash(head) for the bytes before the closing quote of the item the row is in; 0 and
  the hash of the whole item when the token also opened it), and UHASH with (0, hash
  of the bytes after the last opening quote) when it starts an item, or (B^n, hash)
  when it stays inside one. A token that finishes two items (`","",` in Gemma 3) gets
  a guard that never passes: one token of the vocabulary, and every text it spells
  has other tokenizations (documented narrowing).

UCLOSE passes only when the finished hash is not among the n stored, and stores it.
Equal items have equal bytes (item strings are canonical JSON, one spelling per value)
and so equal hashes: a repeated item is never accepted. Distinct items are refused only
when both words collide, see `docs/unique_items.md` for the bound.
"""

import numpy as np

from constrained_decoding.errors import CompileBudgetError
from constrained_decoding.tables import (GUARD_FAIL, GUARD_UCLOSE, GUARD_UHASH, HASH_PRIME,
                                         UNIQUE_CAP_RADIX)
from constrained_decoding.vocab import _joined

# The two bases of the hash words (fixed, so that tables of one vocabulary share their
# `token_hash`; any two distinct values in [2, p - 2] work).
BASES = (1_000_003, 1_234_567_891)
# The host-only kind of a `uopen` marker (`_registers._KIND`), rewritten away here.
UOPEN = 100


def hash_of(data: bytes) -> tuple[int, int, int, int]:
  """(B0^n, hash0, B1^n, hash1) of `data` (n = len(data))."""
  out = []
  for base in BASES:
    value = 0
    for byte in data:
      value = (value * base + byte + 1) % HASH_PRIME
    out += [pow(base, len(data), HASH_PRIME), value]
  return tuple(out)


_TOKEN_HASH: dict[int, tuple] = {}  # id(token_bytes) -> (token_bytes, token_hash).


def token_hash(token_bytes) -> np.ndarray:
  """int32 `[V, 4]`: `hash_of` each token's bytes (none: (1, 0, 1, 0)); kept for the last
  few vocabularies (the object too, so that its id stays its own): 0.5 s with Gemma 3,
  once per process instead of once per compile."""
  cached = _TOKEN_HASH.get(id(token_bytes))
  if cached is None or cached[0] is not token_bytes:
    if len(_TOKEN_HASH) >= 4:
      _TOKEN_HASH.pop(next(iter(_TOKEN_HASH)))
    hashes = _hash_tokens(token_bytes)
    hashes.setflags(write=False)  # Shared by every table set of the vocabulary.
    cached = _TOKEN_HASH[id(token_bytes)] = (token_bytes, hashes)
  return cached[1]


def _hash_tokens(token_bytes) -> np.ndarray:
  """`token_hash` computed: numpy lockstep over byte positions (products below 2^62,
  exact in uint64), at each position only over the tokens that long (sorted by length,
  a prefix of them): work in the vocabulary's total bytes, not V x its longest token
  (Gemma 3: 0.5 -> 0.05 s)."""
  data, starts, ends = _joined.joined(token_bytes)  # Shared with `_registers`.
  data, lengths = data.astype(np.uint64), ends - starts
  order = np.argsort(-lengths, kind="stable")  # Longest first.
  start = starts[order]
  # Tokens longer than each position: a prefix of `order`.
  longer = np.searchsorted(-lengths[order], -np.arange(int(lengths.max(initial=0))),
                           side="left")
  out = np.zeros((len(token_bytes), 4), np.int64)
  p = np.uint64(HASH_PRIME)
  for k, base in enumerate(BASES):
    value = np.zeros(len(token_bytes), np.uint64)
    power = np.ones(len(token_bytes), np.uint64)
    for position, n in enumerate(longer.tolist()):
      value[:n] = (value[:n] * np.uint64(base) + data[start[:n] + position] + np.uint64(1)) % p
      power[:n] = power[:n] * np.uint64(base) % p
    out[order, 2 * k], out[order, 2 * k + 1] = power, value
  return out.astype(np.int32)


def hashing_states(contracted) -> dict[int, int]:
  """byte state -> first word of its block, for the states inside a string item: those
  reached from a `uopen` arc without crossing a `uclose` arc.

  Raises:
    CompileBudgetError: A state is inside the items of two blocks, or an arc inside an
      item carries another register operation.
  """
  dfa = contracted.dfa
  tagged = contracted.arc_ops
  out: dict[int, int] = {}
  frontier = []
  for (state, byte), ops in tagged.items():
    for kind, word, _ in ops:
      if kind == UOPEN:
        frontier.append((int(dfa.transitions[state, byte]), word))
  while frontier:
    state, block = frontier.pop()
    if out.get(state, block) != block:
      raise CompileBudgetError(
          "A string item of an array with uniqueItems shares automaton states with"
          " another one: the arrays cannot be checked apart.")
    if state in out:
      continue
    out[state] = block
    for byte in np.flatnonzero(dfa.transitions[state] >= 0).tolist():
      ops = tagged.get((state, byte), ())
      if any(kind == GUARD_UCLOSE for kind, _, _ in ops):
        continue
      if ops:
        raise CompileBudgetError(
            "A register operation inside a string item of an array with uniqueItems.")
      frontier.append((int(dfa.transitions[state, byte]), block))
  return out


def item_borders(contracted, num_states: int) -> np.ndarray:
  """bool `[Q]`: the states right before a string item's opening quote and right after
  its closing quote. The wide-state search skips them (`_wide.WideStates.find`): the
  cycle `","` from an item back into the next one must not be taken for part of the
  string body's loop, nor the opening quote for a loop's entry, since tokens that open
  or close an item must be explicit edges, which carry guards, never terminal bitmaps."""
  out = np.zeros(num_states, bool)
  if contracted is not None:
    for (state, byte), ops in contracted.arc_ops.items():
      kinds = {kind for kind, _, _ in ops}
      if GUARD_UCLOSE in kinds:
        out[int(contracted.dfa.transitions[state, byte])] = True
      if UOPEN in kinds:
        out[state] = True
  return out


class HashRows:
  """The rows of `hash_consts` named by UCLOSE and UHASH operations (deduplicated)."""

  def __init__(self):
    self.rows: dict[tuple[int, ...], int] = {}

  def row(self, consts: tuple[int, ...]) -> int:
    return self.rows.setdefault(tuple(int(c) for c in consts), len(self.rows))

  def array(self) -> np.ndarray:
    out = np.zeros((max(len(self.rows), 1), 4), np.int32)
    for consts, row in self.rows.items():
      out[row] = consts
    return out


def rewrite(hits, data: bytes, block: int | None, rows: HashRows) -> tuple:
  """The guard operations of one token edge: `hits` ((byte position, raw ops), ...) are
  the operations its bytes cross in order, `data` its bytes, `block` the block of its
  source state when that is inside an item (else None). Raw `uopen`/`uclose` become
  UCLOSE/UHASH with hash rows (module doc); other operations are kept."""
  out = []
  start = 0 if block is not None else None  # Where the current item's bytes begin.
  continued = block is not None  # Whether they continue the row's running hash.
  current, closes = block, 0
  for position, ops in hits:
    for op in ops:
      kind, word, operand = op
      if kind == UOPEN:
        current, start, continued = word, position + 1, False
      elif kind == GUARD_UCLOSE:
        closes += 1
        m0, a0, m1, a1 = hash_of(data[start:position])
        if not continued:
          m0 = m1 = 0
        out.append((GUARD_UCLOSE, word, rows.row((m0, a0, m1, a1)) * UNIQUE_CAP_RADIX
                    + operand))
        current, start = None, None
      else:
        out.append(op)
  if closes > 1:
    return ((GUARD_FAIL, 0, 0),)
  if start is not None:
    m0, a0, m1, a1 = hash_of(data[start:])
    if not continued:
      m0 = m1 = 0
    out.append((GUARD_UHASH, current, rows.row((m0, a0, m1, a1))))
  return tuple(out)
