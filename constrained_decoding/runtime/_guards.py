"""Register guards on the device (`tables.py`, "Register tables" and "Distinct strings").

An explicit edge with a guard is taken only if its guard passes on the row's register
words, and then applies the guard's operations (`tables.apply_guard` is the host's
definition). Two callers, two shapes of work:

  `advance` evaluates one guard per row, the chosen edge's, and needs its writes:
  `run_guards` on `[B]` guard ids.
  `allowed_bits` needs only whether each of a row's Gm guarded edges passes:
  `guarded_passes`. Register tables have few distinct guards (Gd, tens) against Gm
  (~190 with Gemma 3) candidates per row, all but a handful sharing a guard, so where
  Gd <= Gm every guard is evaluated once per row and each candidate reads its bit
  (`_packed_passes`), instead of gathering and evaluating Gm guards per row. With
  distinct strings (hash operations, Gd in the hundreds) candidates are evaluated one by
  one, as `run_guards` does.

On CPU at batch 64 (config_package_json, Gemma 3) the evaluation per candidate was
most of `allowed_bits`' own work (benchmarks/register_objects_step.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, UInt32

from constrained_decoding.tables import GUARD_ATLEAST as _ATLEAST
from constrained_decoding.tables import GUARD_CLEAR as _CLEAR
from constrained_decoding.tables import GUARD_COUNT as _COUNT
from constrained_decoding.tables import GUARD_FAIL as _FAIL
from constrained_decoding.tables import GUARD_LIVE as _LIVE
from constrained_decoding.tables import GUARD_NEED as _NEED
from constrained_decoding.tables import GUARD_SET as _SET
from constrained_decoding.tables import GUARD_UCLOSE as _UCLOSE
from constrained_decoding.tables import GUARD_UHASH as _UHASH
from constrained_decoding.tables import HASH_PRIME, HASH_STORED, UNIQUE_CAP_RADIX
from constrained_decoding.tables import ConstraintTables

# Guard results per word of `_packed_passes`: sums of distinct powers of two below 2^16
# are exact in float32, and 0/1 times 2^k exact in any input precision of a matmul.
_PACK = 16


def _steps(kind: Array, word: Array, operand: Array, current: Array,
           num_words: int) -> tuple[Array, list]:
  """The register operations (all but the hash ones) of guards, elementwise.

  `kind`, `word` (clamped into range), `operand` and `current` (the words' values before
  the guard) broadcast to `[..., O]`. Returns (passes `[...]`, per operation i the
  (word, value after it) pair, word `num_words` for no write). An operation sees the
  earlier ones' writes to its word: O^2 small compares, O being the longest guard.
  """
  shape = jnp.broadcast_shapes(kind.shape, current.shape)[:-1]
  ok = jnp.ones(shape, bool)
  has_live = jnp.zeros(shape, bool)
  some_live = jnp.zeros(shape, bool)
  writes = []
  for i in range(kind.shape[-1]):  # Static and small.
    value = current[..., i]
    for j in range(i):  # Earlier operations on the same word come first.
      same = word[..., j] == word[..., i]
      value = jnp.where(same & (kind[..., j] == _CLEAR), 0, value)
      value = jnp.where(same & (kind[..., j] == _SET), value | operand[..., j], value)
      value = jnp.where(same & (kind[..., j] == _COUNT), value + 1, value)
    k, o = kind[..., i], operand[..., i]
    ok &= ~((k == _SET) & ((value & o) != 0))
    ok &= ~((k == _NEED) & ((value & o) != o))
    ok &= ~((k == _COUNT) & (value >= o))
    ok &= ~((k == _ATLEAST) & (value < o))
    has_live |= k == _LIVE
    some_live |= (k == _LIVE) & ((~value & o) != 0)
    after = jnp.where(k == _CLEAR, 0, jnp.where(k == _SET, value | o,
                                                jnp.where(k == _COUNT, value + 1, value)))
    writes.append((jnp.where((k == _CLEAR) | (k == _SET) | (k == _COUNT), word[..., i],
                             num_words), after))
  return ok & (~has_live | some_live), writes


def run_guards(tables: ConstraintTables, registers: Array, guard: Array
               ) -> tuple[Array, list]:
  """Evaluates guards (`automata/_registers.py`) on each row's registers.

  `registers` is `[B, NR]`, `guard` `[B, *N]` guard ids (-1: none, passes). Returns
  (passes `[B, *N]`, per operation i of the guards the (word, value after it) pairs,
  `[B, *N]` each, word NR for no write).
  """
  ops = tables.guard_ops[jnp.maximum(guard, 0)]  # [B, *N, O, 3]
  kind, word, operand = ops[..., 0], jnp.maximum(ops[..., 1], 0), ops[..., 2]
  kind = jnp.where((guard >= 0)[..., None], kind, -1)
  batch = registers.shape[0]
  flat = word.reshape(batch, -1)
  current = jnp.take_along_axis(registers, jnp.minimum(flat, registers.shape[1] - 1),
                                axis=1).reshape(word.shape)  # [B, *N, O]
  ok, writes = _steps(kind, word, operand, current, registers.shape[1])
  if tables.has_hashes:  # Static: arrays of distinct strings.
    passes, more = _run_hash_ops(tables, registers, kind, word, operand)
    ok &= passes
    writes += more
  return ok, writes


def _packed_passes(tables: ConstraintTables, registers: Array) -> UInt32[Array, "B P"]:
  """Whether each guard passes on each row, packed: guard g is bit g % 16 of word
  g // 16 (`[B, ceil(Gd / 16)]`). Tables without hash operations only.

  Evaluated guard-major (`[Gd, B]`, a guard's operations constant along the inner axis:
  10-20% faster than batch-major on CPU at batch 64, 3 corpus schemas). The packing is
  a matrix product with powers of two: besides packing, it keeps XLA from fusing the
  evaluation into each candidate's read, where it would run again for every one of a
  row's Gm candidates.
  """
  num_guards = tables.guard_ops.shape[0]
  num_packed = -(-num_guards // _PACK)
  ops = tables.guard_ops[:, None]  # [Gd, 1, O, 3]
  kind, word, operand = ops[..., 0], jnp.maximum(ops[..., 1], 0), ops[..., 2]
  num_words = registers.shape[1]
  columns = registers.T[jnp.minimum(word[:, 0], num_words - 1)]  # [Gd, O, B]
  ok, _ = _steps(kind, word, operand, jnp.moveaxis(columns, -1, 1), num_words)  # [Gd, B]
  g = np.arange(num_packed * _PACK)
  weights = np.where(g[None, :] // _PACK == np.arange(num_packed)[:, None],
                     np.float32(2) ** (g % _PACK), 0).astype(np.float32)[:, :num_guards]
  packed = jnp.dot(weights, ok.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
  return packed.astype(jnp.uint32).T


def _dense(tables: ConstraintTables, candidates: int) -> bool:
  """Static: whether `guarded_passes` evaluates every guard once per row (no hash
  operations, and no more guards than a row's candidates)."""
  return not tables.has_hashes and tables.guard_ops.shape[0] <= candidates


def guarded_passes(tables: ConstraintTables, registers: Array, guard: Array
                   ) -> Bool[Array, "B N"]:
  """Whether each of the guards `guard` (`[B, N]` ids, -1: none, passes) passes on its
  row's registers; what `run_guards` returns first, without the writes."""
  if not _dense(tables, guard.shape[1]):
    return run_guards(tables, registers, guard)[0]
  packed = _packed_passes(tables, registers)
  safe = jnp.maximum(guard, 0)
  word = jnp.take_along_axis(packed, safe // _PACK, axis=1)
  return (((word >> (safe % _PACK).astype(jnp.uint32)) & 1) == 1) | (guard < 0)


def guarded_bits(tables: ConstraintTables, registers: Array, row: Array, live: Array,
                 num_words: int) -> UInt32[Array, "B W"]:
  """The tokens of each row's guarded edges whose guards pass, packed as the mask
  (`[B, num_words]`; the mask rows leave them out). `row` is each row's row of
  `guarded_slots` (`[B]`), `live` whether the row takes guarded tokens at all (`[B]`).

  A row's guarded tokens are distinct, so scatter-adding their bits into zeros ORs them.
  (Adding into the mask itself, in place, measured no faster at batch 64 on CPU and
  slower at batch 1: the bits a word already holds had to be read back first.)
  """
  slots = tables.guarded_slots[row]  # [B, Gm]
  tokens = tables.edge_tokens[jnp.maximum(slots, 0)]
  passes = guarded_passes(tables, registers, tables.guarded_ids[row])
  passes &= (slots >= 0) & live[:, None]
  rows = jnp.broadcast_to(jnp.arange(slots.shape[0])[:, None], slots.shape)
  words = jnp.where(passes, tokens >> 5, num_words)  # Out of range: dropped.
  bits = jnp.uint32(1) << (tokens & 31).astype(jnp.uint32)
  return jnp.zeros((slots.shape[0], num_words), jnp.uint32).at[rows, words].add(
      bits, mode="drop")


_PRIME = np.uint32(HASH_PRIME)


def _mod_prime(x: Array) -> Array:
  """x mod p for uint32 x < 2p (p = 2^31 - 1)."""
  return jnp.where(x >= _PRIME, x - _PRIME, x)


def mul_add_mod(h: Array, m: Array, a: Array) -> Array:
  """(h * m + a) mod p for uint32 h, m, a < p = 2^31 - 1, in 16-bit limbs (no 64-bit
  product: jax's x64 is off). With h = hh 2^16 + hl, m = mh 2^16 + ml and 2^31 = 1:
  h m = hh mh 2^32 + (hh ml + hl mh) 2^16 + hl ml, where 2^32 = 2 and a cross term
  c = ch 2^15 + cl contributes ch + cl 2^16."""
  hh, hl = h >> 16, h & 0xFFFF
  mh, ml = m >> 16, m & 0xFFFF
  fold = lambda x: _mod_prime((x & _PRIME) + (x >> 31))  # Any uint32 -> [0, p).
  high = fold((hh * mh) << 1)  # < 2^31 before folding.
  cross = hh * ml + hl * mh  # < 2^32.
  cross = _mod_prime(_mod_prime(cross >> 15) + ((cross & 0x7FFF) << 16))
  low = fold(hl * ml)
  return _mod_prime(_mod_prime(_mod_prime(high + cross) + low) + a)


def _run_hash_ops(tables: ConstraintTables, registers: Array, kind: Array, word: Array,
                  operand: Array) -> tuple[Array, list]:
  """UCLOSE, UHASH and FAIL operations (`tables.py`, "Distinct strings") of guards
  whose operations are `[B, *N, O]`: (passes `[B, *N]`, (word, value) writes). A guard
  holds at most one UCLOSE and one UHASH (`automata/_unique_strings.rewrite`)."""
  num_words = registers.shape[1]
  batch = registers.shape[0]
  closes, hashes = kind == _UCLOSE, kind == _UHASH
  pick = lambda where, x: jnp.sum(jnp.where(where, x, 0), axis=-1)
  has_close, close_word, close_op = closes.any(-1), pick(closes, word), pick(closes, operand)
  has_hash, hash_word, hash_row = hashes.any(-1), pick(hashes, word), pick(hashes, operand)
  shape = close_word.shape

  def read(words):  # [B, *N, k] register words, clamped into range.
    flat = jnp.minimum(words.reshape(batch, -1), num_words - 1)
    return jnp.take_along_axis(registers, flat, axis=1).reshape(words.shape).astype(
        jnp.uint32)

  row, cap = close_op // UNIQUE_CAP_RADIX, close_op % UNIQUE_CAP_RADIX
  consts = tables.hash_consts[row].astype(jnp.uint32)  # [B, *N, 4]
  h = read(close_word[..., None] + jnp.arange(3))  # h0, h1, n
  n = h[..., 2].astype(jnp.int32)
  done = [mul_add_mod(h[..., w], consts[..., 2 * w], consts[..., 2 * w + 1]) for w in (0, 1)]
  slots = (num_words - HASH_STORED) // 2  # Any block's pairs fit in this many.
  stored = read(close_word[..., None] + HASH_STORED + jnp.arange(2 * slots))
  stored = stored.reshape(shape + (slots, 2))
  repeated = ((stored[..., 0] == done[0][..., None]) & (stored[..., 1] == done[1][..., None])
              & (jnp.arange(slots) < n[..., None])).any(-1)
  passes = ~(kind == _FAIL).any(-1) & ~(has_close & (repeated | (n >= cap)))
  nowhere = jnp.int32(num_words)
  pair = close_word + HASH_STORED + 2 * n
  writes = [(jnp.where(has_close, pair, nowhere), done[0].astype(jnp.int32)),
            (jnp.where(has_close, pair + 1, nowhere), done[1].astype(jnp.int32)),
            (jnp.where(has_close, close_word + 2, nowhere), n + 1)]
  consts = tables.hash_consts[hash_row].astype(jnp.uint32)
  h = read(hash_word[..., None] + jnp.arange(2))
  for w in (0, 1):
    value = mul_add_mod(h[..., w], consts[..., 2 * w], consts[..., 2 * w + 1])
    writes.append((jnp.where(has_hash, hash_word + w, nowhere), value.astype(jnp.int32)))
  return passes, writes


def extend_hashes(tables: ConstraintTables, registers: Array, source: Array,
                  tokens: Array, extend: Array) -> Array:
  """`registers` with the running hash of the rows in `extend` extended by their token
  (a token read inside a string item that crosses no marker: `token_hash`)."""
  block = tables.state_hashing[source]  # [B]
  extend &= block >= 0
  rows = jnp.arange(registers.shape[0])
  consts = tables.token_hash[tokens].astype(jnp.uint32)  # [B, 4]
  for w in (0, 1):
    at = jnp.maximum(block, 0) + w
    h = jnp.take_along_axis(registers, jnp.minimum(at, registers.shape[1] - 1)[:, None],
                            axis=1)[:, 0].astype(jnp.uint32)
    value = mul_add_mod(h, consts[:, 2 * w], consts[:, 2 * w + 1]).astype(jnp.int32)
    registers = registers.at[rows, jnp.where(extend, at, registers.shape[1])].set(
        value, mode="drop")
  return registers
