"""Pack token automata into `ConstraintTables`, the host -> device contract.

Host-side numpy. `ConstraintTables` is registered as a JAX pytree right where it is
defined, so tables can go straight into `jax.jit`, `jax.device_put`, `jax.pmap` or
`shard_map` whatever else has been imported (the one reason this module imports jax).

Layout (S states, G edge groups, K groups per state, E edges, M distinct masks,
W = ceil(V / 32) words, C constraints stacked, P pops and Q pushes per edge at most):

  start         int32  [C]     start state of each stacked constraint
  accepting     bool   [S]     the input may end here (for push-down tables: the state
                               is final in its rule; see "end of sequence" below)
  mask_bits     uint32 [M, W]  deduplicated allowed-token sets; token t is bit t % 32 of
                               word t // 32 (end-of-sequence ids are added at run time)
  state_groups  int32  [S, K]  the edge groups leaving each state, -1 padded
  group_mask    int32  [G]     row of `mask_bits` allowed when g is the deepest group
                               matching the stack: g's tokens and those of its state's
                               groups that pop a prefix of g's pops (they match too)
  group_pops    int32  [G, P]  stack symbols a group pops, top of stack first, -1 padded;
                               the group applies only when the stack ends with them
  group_num_pops int32 [G]     how many symbols each group pops
  edge_start    int32  [G + 1] explicit edges of group g are edge_start[g]:edge_start[g+1]
  edge_tokens   int32  [E]     explicit edges, sorted by (group, token), padded at the end
                               with PAD_TOKEN (int32 max) so binary search stays valid
  edge_targets  int32  [E]     target state of each edge, padded with NO_STATE (-1)
  edge_pushes   int32  [E]     row of `push_symbols` an edge pushes (0: push nothing)
  push_symbols  int32  [U, Q]  symbol sequences pushed, bottom first, -1 padded
  push_lengths  int32  [U]     length of each sequence (row 0 is the empty one)
  eos_bits      uint32 [W]     the end-of-sequence ids as a bitmask
  terminal_bits uint32 [T, W]  token bitmaps of terminal edges (wide states, Sec. 2.5.1)
  state_terminals int32 [S, R, 2]  (terminal id, target) per state in precedence order,
                               -1 padded; consulted only when no explicit edge matches;
                               terminal edges never touch the stack
  state_terminal_rows int32 [S] or [0]  row of `state_terminals` of each state; empty
                               (the usual case) means row s for state s. Counted chains
                               use it so that their states share a few rows
  terminal_counts int32 [T, 3]  (row of `token_counts`, stride, bias): row -1 for an
                               ordinary terminal, else a *counting* terminal (below)
  token_counts  int8   [C, V]  per counted character class, how many characters each
                               token spells (0 for tokens outside the class); C = 0
                               unless some terminal counts
  stack_depth   static int     D, the stack capacity of a row (0 for regular tables)
  capped_limits int32  [G, L]  push-down only (L = 0 otherwise): per group, ascending
                               free-capacity limits, padded with CAP_PAD (int32 max)
  capped_rows   int32  [G, L]  row of `capped_bits` removed from g's mask when the row's
                               free capacity D - depth is below capped_limits[g, l] (the
                               first such l); 0 (the empty row) in padding
  capped_bits   uint32 [X, W]  tokens removed near the stack bound; row 0 is empty
                               ([0, 0] for regular tables)
  guard_ops     int32  [Gd, O, 3]  each guard's operations (kind, word, operand), kind
                               -1 padded; `automata/_registers.py` ([0, 0, 3]: none)
  group_guarded int32  [G] or [0]  row of `guarded_slots` of each group (0: the empty row)
  guarded_slots int32  [Gg, Gm] or [0, 0]  the edges (slots) with a guard of the groups
                               that have some, -1 padded (few: an [E] column would cost
                               4 bytes an edge, a [G, Gm] matrix a row per group)
  guarded_ids   int32  [Gg, Gm] or [0, 0]  the guard of each of those edges
  register_init int32  [NR]    the register words of a row at the start (NR = 0 for
                               tables without registers; only the shape is read)
  hash_consts   int32  [H, 4] or [0, 4]  (multiplier, addend) of each of the two hash
                               words, per row that UCLOSE and UHASH operations name
  state_hashing int32  [S] or [0]  first register word of the distinct-strings block a
                               state's tokens extend the running hash of (-1: none)
  token_hash    int32  [V, 4] or [0, 4]  (B^n, hash of the bytes) per token and hash word:
                               what a token read inside a string item adds to the hash

Distinct strings (`uniqueItems` of string items, `automata/_unique_strings.py`). A
block of register words [h0, h1, n, then n stored pairs] keeps the running hash of the
string item being written and the hashes of the n items written before; the hash is
polynomial modulo the prime 2^31 - 1 (two bases, uint32 limbs on the device). A guarded
edge that finishes an item (UCLOSE) passes only when the finished item's hash is not
stored, and then stores it; an edge that starts an item (UHASH) sets the running hash
to its bytes'; any other token read in a state of `state_hashing` extends the hash by
its `token_hash` row. Zero-size arrays otherwise, so no other table's step changes.

Register tables (objects whose keys are checked on the device, `automata/_registers.py`).
A row also holds NR int32 register words. An explicit edge with a guard is taken only if
its guard passes on the row's registers, and then applies the guard's operations; such
edges are left out of the mask rows, and the device ORs in, per row, the tokens of its
group's guarded slots whose guards pass (one [Gm] gather and a scatter per step);
`advance` finds its edge's slot among them (Gm compares).

Relative targets (counted repetitions, `automata/_counting.py`). An explicit edge whose
target is `RELATIVE - k` (k >= 0, so at most -2) leads from state q to q + k. A counting
terminal t with (row c, stride s, bias b) leads from q to q + s * token_counts[c, token]
+ b, and the second field of a state's entry (t, f) is a *filter*, not a target: the
entry holds the tokens of `terminal_bits[t]` that are also in `terminal_bits[f]` (all of
them when f = -1). Like every terminal entry, counting entries are part of the state's
mask row, filters applied (`_counting.CountingTerminals.fold`), so the mask costs one row
gather whatever R is; `advance` reads one word of each entry's bitmap and filter. States
near a chain's end get a row per slot and remaining count below the longest token (~100
rows of 32 KiB for JSON strings with Gemma 3). The states of a
counted chain `X{n,m}` are numbered position by position, so the middle positions of a
long chain share one edge group (`state_groups` points them at it), one mask row and
the same terminal entries: tables grow with the longest token, not with m.

A regular constraint (token DFA) has one group per state (K = 1, G = S), pops nothing
and pushes nothing (P = Q = 0). A grammar (token-level push-down automaton, Alg. 3)
has several groups per state, one per distinct pop sequence: the allowed set for
(state, stack) is the union of the groups whose pops match the top of the stack (which
is the mask row of the deepest of them), and the stack symbols are return addresses,
i.e. state ids. Every state of push-down tables has a group that pops nothing.

End of sequence is allowed in state q with stack s when q and every state on s are
`accepting` (each pending rule may return without more input). For regular tables the
stack is empty, so this is `accepting[q]`.

Stack-aware masks (push-down tables). The stack holds D symbols, so a token that pushes
near the bound could steer a row into overflow, or into a state from which nothing
finishes within D (an `error` or a dead end the mask itself offered). The packer
computes (`stack_needs`) need(q), the least stack height above a row's depth with which
a row at q can still reach a state where end is allowed, and need_return(s), the same
for a row once it has returned to address s (measured from the depth below s). An edge
pushing U (bottom first, j from 0) to t and popping k requires r(e) = max(|U| + need(t),
max_j (j + need_return(U_j))) - k above the row's depth, and its token is allowed only
when r(e) <= D - depth. r(e) does not depend on D, so tables keep their meaning when
`stack_tables` raises D. A group's tokens with r >= 1 are stored as nested exclusion
rows (r >= v, one per distinct v); the device gathers the one for the row's free
capacity and ANDs it out of the group's mask row (one more [W] row per step, push-down
tables only). Why no walk over allowed tokens dead-ends: every allowed token keeps
"depth + need(state) <= D, and i + need_return(s) <= D for the symbol s at position i";
need(q) counts only q's pop-free edges, which apply whatever the stack holds, and a row
at an accepting state under a pending return address s has the tokens that return to s
(the lazy returns of `automata/_pda.py`), which need_return(s) counts. A grammar whose
start needs more than D raises `CompileBudgetError` at compile time.

S, G, E and M are padded to the next power of two (at least `min_bucket`) so that
constraints of similar size share one compiled executable. Edges are one flat CSR
array rather than a [G, K] matrix padded to the widest group, so one group with 100k
explicit edges costs 100k entries, not 100k per group. Padding states are dead: not
accepting, no groups, never the target of an edge.

Public names:
  ConstraintTables             the packed arrays (+ static `vocab_size`, `stack_depth`).
  pack_tables(token_dfa, vocab) TokenDfa -> ConstraintTables.
  pack_pda_tables(token_pda, vocab, stack_depth=) TokenPda -> ConstraintTables.
  stack_tables                 in `_stacking.py` (`cd.stack_tables`).
  tables_nbytes(tables)        size report in bytes, per array and in total.
  ConstraintTables.save(path, vocab=)  one file; `cd.load_tables` reads it (`_tables_file`).
  estimate_nbytes(token_dfa, vocab)  an upper bound, checked before packing.
  bucket_size(n, min_bucket)   the padding rule.
  stack_needs(a)               need(q), need_return(s) of a push-down automaton (above).
"""

import dataclasses
from typing import Any

import jax
import numpy as np

from constrained_decoding.errors import CompileBudgetError

PAD_TOKEN = np.iinfo(np.int32).max
NO_STATE = -1
# Explicit edge targets <= RELATIVE are relative: `RELATIVE - k` leads from q to q + k.
RELATIVE = -2
# Padding of `capped_limits`: no free capacity is that low.
CAP_PAD = np.iinfo(np.int32).max
# need(q) of a state that cannot finish with any stack (larger than any capacity).
NO_FINISH = 1 << 24
DEFAULT_MIN_BUCKET = 8
# Kinds of guard operations (`guard_ops[..., 0]`; `automata/_registers.py`).
GUARD_CLEAR, GUARD_SET, GUARD_NEED, GUARD_LIVE, GUARD_COUNT, GUARD_ATLEAST = 0, 1, 2, 3, 4, 5
# Distinct strings: finish an item (operand: hash_consts row * UNIQUE_CAP_RADIX +
# capacity), set the running hash (operand: hash_consts row), never pass (a token that
# finishes two items, refused).
GUARD_UCLOSE, GUARD_UHASH, GUARD_FAIL = 6, 7, 8
UNIQUE_CAP_RADIX = 128
# The prime modulus of the string hashes, and the offset of the stored pairs in a block.
HASH_PRIME = (1 << 31) - 1
HASH_STORED = 3


def apply_guard(ops, registers, hash_consts=()) -> tuple[int, ...] | None:
  """The registers after the guard `ops` ((kind, word, operand) triples in order; kinds
  below 0 are padding), or None when it fails: the host's definition of what the device
  computes (`runtime._run_guards`), for the references (`_registers.ByteWalker`,
  `testing._reference`). `hash_consts` are the tables' rows UCLOSE and UHASH name."""
  out = list(registers)
  live = []
  for kind, word, operand in ops:
    if kind == GUARD_UCLOSE:
      row, cap = divmod(operand, UNIQUE_CAP_RADIX)
      m0, a0, m1, a1 = (int(x) for x in hash_consts[row])
      done = (out[word] * m0 + a0) % HASH_PRIME, (out[word + 1] * m1 + a1) % HASH_PRIME
      n = out[word + 2]
      stored = [tuple(out[word + HASH_STORED + 2 * j:word + HASH_STORED + 2 * j + 2])
                for j in range(n)]
      if n >= cap or done in stored:
        return None
      out[word + HASH_STORED + 2 * n:word + HASH_STORED + 2 * n + 2] = done
      out[word + 2] = n + 1
      continue
    if kind == GUARD_UHASH:
      m0, a0, m1, a1 = (int(x) for x in hash_consts[operand])
      out[word] = (out[word] * m0 + a0) % HASH_PRIME
      out[word + 1] = (out[word + 1] * m1 + a1) % HASH_PRIME
      continue
    if kind == GUARD_FAIL:
      return None
    if kind == GUARD_CLEAR:
      out[word] = 0
    elif kind == GUARD_SET:
      if out[word] & operand:
        return None
      out[word] |= operand
    elif kind == GUARD_NEED:
      if out[word] & operand != operand:
        return None
    elif kind == GUARD_LIVE:
      live.append((word, operand))
    elif kind == GUARD_COUNT:
      if out[word] >= operand:
        return None
      out[word] += 1
    elif kind == GUARD_ATLEAST:
      if out[word] < operand:
        return None
  if live and not any(~out[word] & operand for word, operand in live):
    return None
  return tuple(out)

_ARRAY_FIELDS = ("start", "accepting", "mask_bits", "state_groups", "group_mask",
                 "group_pops", "group_num_pops", "edge_start", "edge_tokens", "edge_targets",
                 "edge_pushes", "push_symbols", "push_lengths", "eos_bits", "terminal_bits",
                 "state_terminals", "state_terminal_rows", "terminal_counts",
                 "token_counts", "capped_limits", "capped_rows", "capped_bits",
                 "guard_ops", "group_guarded", "guarded_slots", "guarded_ids",
                 "register_init", "hash_consts", "state_hashing", "token_hash")
# Fields added for push-down tables only: left out of a regular table's `shape_key`.
_CAPPED_FIELDS = ("capped_limits", "capped_rows", "capped_bits")
_META_FIELDS = ("vocab_size", "stack_depth", "vocab_fingerprint")


@dataclasses.dataclass(frozen=True, eq=False)
class ConstraintTables:
  """Token-level automaton for one or more constraints, packed for the device.

  ```python
  tables = cd.Compiler(vocab).compile(cd.Regex(r"\\d{3}"))
  state = cd.init_state(tables, batch_size=2)
  ```

  Attributes: see the module docstring for shapes and meaning. `vocab_size` (width of
  the model's logits) and `stack_depth` (stack capacity per row) are static: they fix
  shapes.
  """

  # numpy arrays on the host, jax arrays (or tracers) on the device: hence `Any`.
  start: Any
  accepting: Any
  mask_bits: Any
  state_groups: Any
  group_mask: Any
  group_pops: Any
  group_num_pops: Any
  edge_start: Any
  edge_tokens: Any
  edge_targets: Any
  edge_pushes: Any
  push_symbols: Any
  push_lengths: Any
  eos_bits: Any
  terminal_bits: Any
  state_terminals: Any
  state_terminal_rows: Any
  terminal_counts: Any
  token_counts: Any
  vocab_size: int
  stack_depth: int = 0
  # `Vocabulary.fingerprint` of the vocabulary the tables were compiled for ("" when
  # unknown, e.g. tables built by hand): `generate`, `evaluate` and `stack_tables` check
  # it, so tables of another tokenizer with the same width cannot steer a row silently.
  vocab_fingerprint: str = ""
  # Stack-aware masks (module docstring); empty for regular tables.
  capped_limits: Any = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.int32))
  capped_rows: Any = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.int32))
  capped_bits: Any = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.uint32))
  # Register tables (module docstring); empty otherwise.
  guard_ops: Any = dataclasses.field(default_factory=lambda: np.zeros((0, 0, 3), np.int32))
  group_guarded: Any = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
  guarded_slots: Any = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.int32))
  guarded_ids: Any = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.int32))
  register_init: Any = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
  # Distinct strings (module docstring); empty otherwise.
  hash_consts: Any = dataclasses.field(default_factory=lambda: np.zeros((0, 4), np.int32))
  state_hashing: Any = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
  token_hash: Any = dataclasses.field(default_factory=lambda: np.zeros((0, 4), np.int32))

  @property
  def num_constraints(self) -> int:
    return int(self.start.shape[0])

  @property
  def has_registers(self) -> bool:
    """Whether rows keep register words (static: from a shape)."""
    return bool(np.shape(self.guard_ops)[0])

  @property
  def has_hashes(self) -> bool:
    """Whether rows hash string items to keep them distinct (static: from a shape)."""
    return bool(np.shape(self.token_hash)[0])

  @property
  def is_pushdown(self) -> bool:
    """Whether any stacked constraint uses the stack (a recursive grammar)."""
    return self.stack_depth > 0

  @property
  def shape_key(self) -> tuple:
    """Tables with equal keys share one compiled step function."""
    names = _ARRAY_FIELDS if self.stack_depth else tuple(
        name for name in _ARRAY_FIELDS if name not in _CAPPED_FIELDS)
    return (tuple(np.shape(getattr(self, name)) for name in names),
            self.vocab_size, self.stack_depth)

  def save(self, path, *, vocab, description: str = "") -> None:
    """Writes the tables to one file that `cd.load_tables` reads without pynini.

    `vocab` is the `Vocabulary` they were compiled for (its fingerprint is stored and
    checked on load); `description` is free text, e.g. `spec.describe()`. The format is
    in `_tables_file.py`.
    """
    from constrained_decoding import _tables_file  # pylint: disable=g-import-not-at-top  (cycle)

    _tables_file.save_tables(self, path, vocab=vocab, description=description)

  def __repr__(self) -> str:
    kind = f", stack_depth={self.stack_depth}" if self.stack_depth else ""
    return (f"ConstraintTables(constraints={self.start.shape[0]}, "
            f"states={self.accepting.shape[0]}, groups={self.group_mask.shape[0]}, "
            f"edges={self.edge_tokens.shape[0]}, masks={self.mask_bits.shape[0]}, "
            f"terminals={self.terminal_bits.shape[0]}, vocab_size={self.vocab_size}{kind}, "
            f"nbytes={tables_nbytes(self)['total']})")


jax.tree_util.register_dataclass(
    ConstraintTables, data_fields=list(_ARRAY_FIELDS), meta_fields=list(_META_FIELDS))


def bucket_size(n: int, min_bucket: int = DEFAULT_MIN_BUCKET) -> int:
  """The padded size for `n` items: the next power of two, at least `min_bucket`."""
  size = max(int(min_bucket), 1)
  while size < n:
    size *= 2
  return size


def num_words(vocab_size: int) -> int:
  return -(-vocab_size // 32)


def bitmask(token_ids: np.ndarray, vocab_size: int) -> np.ndarray:
  """uint32 `[W]` bitmask with the bits of `token_ids` set."""
  bits = np.zeros(num_words(vocab_size), np.uint32)
  token_ids = np.asarray(token_ids, np.int64)
  if len(token_ids) <= 8:  # A few end-of-sequence ids: item by item is ~3x faster.
    for t in token_ids.tolist():
      bits[t >> 5] |= np.uint32(1 << (t & 31))
    return bits
  np.bitwise_or.at(bits, token_ids >> 5, (np.uint32(1) << (token_ids & 31).astype(np.uint32)))
  return bits


# Above this many states `estimate_nbytes` counts the distinct mask rows exactly (one
# pass over the edges, as packing does) rather than assuming one row per state.
_EXACT_ROWS_ABOVE = 512


def estimate_nbytes(token_dfa, vocab, *, min_bucket: int = DEFAULT_MIN_BUCKET) -> int:
  """Upper bound on the bytes `pack_tables` would use, checked before it allocates.

  Mask rows (32 KiB each with 262k tokens) are counted one per state for small
  automata, and exactly (distinct allowed sets, as packing deduplicates them) for
  large ones, where many states of repeated sub-schemas share their rows.
  """
  s = token_dfa.num_states
  s_pad = bucket_size(s, min_bucket)
  e_pad = bucket_size(len(token_dfa.edge_token), min_bucket)
  rows = s
  if s > _EXACT_ROWS_ABOVE:
    edge_start = np.searchsorted(token_dfa.edge_source, np.arange(s + 1)).tolist()
    terminals = np.ascontiguousarray(np.asarray(token_dfa.state_terminals)[:, :, 0], np.int32)
    rows = len(_distinct_groups(token_dfa.edge_token, edge_start, terminals)[1])
  m_pad = bucket_size(rows, min_bucket)
  t_pad = bucket_size(token_dfa.terminal_bits.shape[0], 1)
  r = token_dfa.state_terminals.shape[1]
  return (e_pad * 12 + (m_pad + t_pad) * num_words(vocab.vocab_size) * 4
          + s_pad * (21 + 8 * r))


@dataclasses.dataclass(frozen=True)
class _Automaton:
  """What both packers share: states, edge groups, edges and terminals as numpy arrays.

  Groups must be sorted by state and edges by (group, token).
  """

  num_states: int
  accepting: np.ndarray       # bool [S]
  group_state: np.ndarray     # int [G]
  group_pops: np.ndarray      # int [G, P], -1 padded, top of stack first
  group_num_pops: np.ndarray  # int [G]
  edge_group: np.ndarray      # int [E]
  edge_token: np.ndarray      # int [E]
  edge_target: np.ndarray     # int [E]
  edge_push: np.ndarray       # int [E], rows of push_symbols
  push_symbols: np.ndarray    # int [U, Q], -1 padded, bottom first; row 0 empty
  push_lengths: np.ndarray    # int [U]
  terminal_bits: np.ndarray   # uint32 [T, W]
  state_terminals: np.ndarray  # int [S, R, 2]: (terminal, target) by precedence, -1 padded
  # A token DFA: group g is state g, and nothing pops or pushes (skips generic work).
  regular: bool = False


def pack_tables(token_dfa, vocab, *, min_bucket: int = DEFAULT_MIN_BUCKET,
                guards=None) -> ConstraintTables:
  """Packs a `TokenDfa` (start state 0, edges sorted by (source, token)).

  Args:
    token_dfa: A trimmed token DFA from `automata.compose_token_dfa`, non-empty.
    vocab: The `Vocabulary` it was built for (end-of-sequence ids and logits width).
    min_bucket: Smallest padded size of S, E and M.
    guards: The `_registers.Guards` of its explicit edges, or None.
  """
  s = token_dfa.num_states
  e = len(token_dfa.edge_token)
  automaton = _Automaton(
      num_states=s, accepting=np.asarray(token_dfa.accepting, bool),
      group_state=np.arange(s), group_pops=np.zeros((s, 0), np.int32),
      group_num_pops=np.zeros(s, np.int32), edge_group=token_dfa.edge_source,
      edge_token=token_dfa.edge_token, edge_target=token_dfa.edge_target,
      edge_push=np.zeros(e, np.int32), push_symbols=np.zeros((1, 0), np.int32),
      push_lengths=np.zeros(1, np.int32), terminal_bits=token_dfa.terminal_bits,
      state_terminals=token_dfa.state_terminals, regular=True)
  if guards is None or not (guards.edge_guard >= 0).any():
    return _pack(automaton, vocab, stack_depth=0, min_bucket=min_bucket)
  # Guarded edges are looked up like the others but kept out of the mask rows.
  unguarded = guards.edge_guard < 0
  masked = dataclasses.replace(automaton, edge_group=automaton.edge_group[unguarded],
                               edge_token=automaton.edge_token[unguarded],
                               edge_target=automaton.edge_target[unguarded],
                               edge_push=automaton.edge_push[unguarded])
  tables = _pack(automaton, vocab, stack_depth=0, min_bucket=min_bucket, masked=masked)
  return _with_guards(tables, guards, token_dfa.edge_source, s)


def _with_guards(tables: ConstraintTables, guards, edge_group: np.ndarray,
                 num_groups: int) -> ConstraintTables:
  """`tables` with the guard arrays of a token DFA's edges (groups are states)."""
  slots = np.flatnonzero(guards.edge_guard >= 0)
  groups = edge_group[slots]
  per_group = np.bincount(groups, minlength=num_groups)
  width = int(per_group.max())
  group_guarded = np.zeros(tables.group_mask.shape[0], np.int32)
  with_guards = np.flatnonzero(per_group)
  group_guarded[with_guards] = np.arange(1, len(with_guards) + 1)  # Row 0: none.
  guarded_slots = np.full((len(with_guards) + 1, width), NO_STATE, np.int32)
  guarded_ids = np.full_like(guarded_slots, NO_STATE)
  first = np.concatenate([[0], np.cumsum(per_group)[:-1]])
  column = np.arange(len(slots)) - first[groups]
  guarded_slots[group_guarded[groups], column] = slots
  guarded_ids[group_guarded[groups], column] = guards.edge_guard[slots]
  hashes = {}
  if guards.token_hash is not None:  # Distinct strings: states padded as not hashing.
    state_hashing = np.full(tables.accepting.shape[0], NO_STATE, np.int32)
    state_hashing[:len(guards.state_hashing)] = guards.state_hashing
    hashes = dict(hash_consts=np.asarray(guards.hash_consts, np.int32),
                  state_hashing=state_hashing, token_hash=guards.token_hash)
  return dataclasses.replace(tables, guard_ops=np.asarray(guards.ops, np.int32),
                             group_guarded=group_guarded, guarded_slots=guarded_slots,
                             guarded_ids=guarded_ids,
                             register_init=np.zeros(guards.num_words, np.int32), **hashes)


def pack_pda_tables(token_pda, vocab, *, stack_depth: int,
                    min_bucket: int = DEFAULT_MIN_BUCKET) -> ConstraintTables:
  """Packs a `TokenPda` (`automata/_pda.py`) with a stack of `stack_depth` symbols."""
  automaton = _Automaton(
      num_states=token_pda.num_states, accepting=np.asarray(token_pda.accepting, bool),
      group_state=token_pda.group_state, group_pops=token_pda.group_pops,
      group_num_pops=token_pda.group_num_pops, edge_group=token_pda.edge_group,
      edge_token=token_pda.edge_token, edge_target=token_pda.edge_target,
      edge_push=token_pda.edge_push, push_symbols=token_pda.push_symbols,
      push_lengths=token_pda.push_lengths, terminal_bits=token_pda.terminal_bits,
      state_terminals=np.stack([token_pda.state_terminal, token_pda.terminal_target],
                               axis=-1)[:, None, :])
  stack_depth = max(int(stack_depth), 1)
  needs = stack_needs(automaton)
  start_need = int(needs[0][token_pda.start])
  if start_need > stack_depth:
    needed = ("no stack depth suffices: no token sequence reaches the end"
              if start_need >= NO_FINISH else f"it needs a stack of {start_need}")
    raise CompileBudgetError(
        f"No input can finish within stack_depth={stack_depth}: {needed}. Expected "
        f"CompileOptions.stack_depth >= {start_need if start_need < NO_FINISH else '?'}; "
        "raise it or make the grammar's shortest completion shallower.")
  tables = _pack(automaton, vocab, stack_depth=stack_depth, min_bucket=min_bucket)
  limits, capped_rows, capped_bits = _capped_masks(
      automaton, tables.mask_bits.shape[1], vocab.vocab_size, min_bucket, needs)
  return dataclasses.replace(tables, capped_limits=limits, capped_rows=capped_rows,
                             capped_bits=capped_bits)


def stack_needs(a: _Automaton) -> tuple[np.ndarray, np.ndarray]:
  """(need [S], need_return [S]) of a push-down automaton, int64, `NO_FINISH` for never.

  need(q): the least stack height above the current depth with which a row at q can
  reach a state where end is allowed: 0 for an accepting q, else the least requirement
  of q's pop-free edges (explicit edges of groups popping nothing, terminal edges),
  which apply whatever the stack holds. need_return(s): the same for the row once the
  return address s is popped, measured from the depth below s: 0 if s is final in its
  rule, else, over the accepting states whose group pops exactly (s,) (the row waits
  there, at a token boundary, before returning), the largest of each group's least
  edge requirement. An edge pushing U (bottom first) to t requires max(|U| + need(t),
  max_j (j + need_return(U_j))) above its base. Fixpoint from the top (rounds over all
  edges at once until nothing changes), so cycles with no way out stay `NO_FINISH`.
  """
  accepting = np.asarray(a.accepting, bool)
  n = a.num_states
  group_pops = np.asarray(a.group_num_pops)
  edge_pops = group_pops[a.edge_group]
  edge_target = np.asarray(a.edge_target).astype(np.int64)
  push = np.asarray(a.edge_push)
  symbols = np.asarray(a.push_symbols, np.int64)
  lengths = np.asarray(a.push_lengths, np.int64)
  positions = np.arange(symbols.shape[1], dtype=np.int64)[None, :]
  pop_free = np.nonzero(edge_pops == 0)[0]
  pop_free_source = np.asarray(a.group_state)[a.edge_group[pop_free]]
  # Groups of accepting states popping exactly one symbol: where a row waits to return.
  returning = (group_pops == 1) & accepting[a.group_state]
  returning_edges = np.nonzero(returning[a.edge_group])[0]
  returning_groups = np.nonzero(returning)[0]
  returned_to = np.asarray(a.group_pops)[returning_groups, 0].astype(np.int64)
  term = np.asarray(a.state_terminals)
  has_term = (term[..., 0] >= 0) & (term[..., 1] >= 0)
  term_source = np.nonzero(has_term)[0]
  term_target = term[..., 1][has_term].astype(np.int64)
  need = np.where(accepting, 0, NO_FINISH).astype(np.int64)
  need_return = need.copy()
  # Only these edges count (the others pop below the row's own pushes).
  counted = np.concatenate([pop_free, returning_edges])
  target, push = edge_target[counted], push[counted]
  returning_group = a.edge_group[returning_edges]
  while True:
    required = _edge_requirements(need, need_return, target, push, symbols, lengths,
                                  positions)
    new_need = np.full(n, NO_FINISH, np.int64)
    np.minimum.at(new_need, pop_free_source, required[:len(pop_free)])
    np.minimum.at(new_need, term_source, need[term_target])
    new_need[accepting] = 0
    group_best = np.full(len(group_pops), NO_FINISH, np.int64)
    np.minimum.at(group_best, returning_group, required[len(pop_free):])
    new_return = np.full(n, -1, np.int64)
    np.maximum.at(new_return, returned_to, group_best[returning_groups])
    new_return = np.where(new_return < 0, NO_FINISH, new_return)
    new_return[accepting] = 0
    if np.array_equal(new_need, need) and np.array_equal(new_return, need_return):
      return need, need_return
    need, need_return = new_need, new_return


def _edge_requirements(need, need_return, target, push, symbols, lengths,
                       positions) -> np.ndarray:
  """int64 [E]: each edge's requirement above its base (see `stack_needs`)."""
  pushed = np.where(symbols >= 0, positions + need_return[np.maximum(symbols, 0)], 0)
  push_need = pushed.max(axis=1, initial=0)  # [U]
  return np.minimum(np.maximum(lengths[push] + need[np.maximum(target, 0)], push_need[push]),
                    NO_FINISH)


def _capped_masks(a: _Automaton, w: int, vocab_size: int, min_bucket: int,
                  needs: tuple[np.ndarray, np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(capped_limits [G, L], capped_rows [G, L], capped_bits [X, W]): stack-aware masks.

  For group g as the deepest matching group, the tokens it allows (its own and its
  prefix groups' explicit edges, then its state's terminal tokens no explicit edge of
  those takes) each have a requirement r (module docstring); for each distinct r >= 1,
  v, the tokens with r >= v form one exclusion row (deduplicated across groups),
  removed when the row's free capacity is below v.
  """
  g_count = len(a.group_state)
  need, need_return = needs
  requirement = _edge_requirements(
      need, need_return, np.asarray(a.edge_target).astype(np.int64), np.asarray(a.edge_push),
      np.asarray(a.push_symbols, np.int64), np.asarray(a.push_lengths, np.int64),
      np.arange(np.asarray(a.push_symbols).shape[1], dtype=np.int64)[None, :]
  ) - np.asarray(a.group_num_pops)[a.edge_group]
  demanding = np.nonzero(requirement >= 1)[0]  # sorted by group, as the edges are
  demanding_groups = np.asarray(a.edge_group)[demanding]
  present, first = np.unique(demanding_groups, return_index=True)
  by_group = dict(zip(present.tolist(), np.split(demanding, first[1:])))
  pops = [tuple(int(x) for x in row[:n]) for row, n in zip(a.group_pops, a.group_num_pops)]
  by_key = {(state, popped): k for k, (state, popped)
            in enumerate(zip(np.asarray(a.group_state).tolist(), pops))}
  term = np.asarray(a.state_terminals)
  rows: dict[bytes, int] = {bytes(num_words(vocab_size) * 4): 0}
  bits_list = [np.zeros(w, np.uint32)]
  per_group: list[list[tuple[int, int]]] = [[] for _ in range(g_count)]
  edge_starts = np.searchsorted(a.edge_group, np.arange(g_count + 1))
  for k, (state, popped) in enumerate(zip(np.asarray(a.group_state).tolist(), pops)):
    chain = [by_key[state, popped[:n]] for n in range(len(popped) + 1)
             if (state, popped[:n]) in by_key]
    edges = np.concatenate([by_group[h] for h in chain if h in by_group] + [demanding[:0]])
    tokens = np.asarray(a.edge_token)[edges].astype(np.int64)
    levels = requirement[edges]
    terminal_bits = None
    for terminal, target in term[state].tolist():
      if terminal >= 0 and target >= 0 and need[target] >= 1:
        covered = np.concatenate([np.asarray(a.edge_token)[edge_starts[h]:edge_starts[h + 1]]
                                  for h in chain])
        terminal_bits = (a.terminal_bits[terminal][:w].astype(np.uint32)
                         & ~bitmask(covered, vocab_size))
        terminal_level = int(need[target])
        break  # A push-down state has one terminal entry.
    values = set(levels.tolist()) | ({terminal_level} if terminal_bits is not None else set())
    for v in sorted(values):
      row = bitmask(tokens[levels >= v], vocab_size)
      if terminal_bits is not None and terminal_level >= v:
        row |= terminal_bits
      key = row.tobytes()
      if key not in rows:
        rows[key] = len(bits_list)
        bits_list.append(row)
      per_group[k].append((min(v, CAP_PAD), rows[key]))
  g_pad = bucket_size(g_count, min_bucket)
  l_pad = bucket_size(max((len(x) for x in per_group), default=0), 1)
  limits = np.full((g_pad, l_pad), CAP_PAD, np.int32)
  capped_rows = np.zeros((g_pad, l_pad), np.int32)
  for k, entries in enumerate(per_group):
    for l, (v, row) in enumerate(entries):
      limits[k, l], capped_rows[k, l] = v, row
  capped_bits = np.zeros((bucket_size(len(bits_list), min_bucket), w), np.uint32)
  capped_bits[:len(bits_list)] = bits_list
  return limits, capped_rows, capped_bits


def _group_masks(a: _Automaton, w: int, min_bucket: int,
                 edge_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Deduplicated mask rows: (mask_bits [M_pad, W], row of each group [G]).

  The groups of a state that match one stack are those whose pops are prefixes of the
  deepest match's, so a group's row is the union of its own tokens (`_own_rows`) and
  those of its state's groups that pop a prefix of its pops: the allowed set when it is
  the deepest matching group, one row gathered per step however many match. When no
  group pops (token DFAs) the rows are the own rows.
  """
  own_bits, own_row = _own_rows(a, w, min_bucket, edge_start)
  if a.regular or not a.group_num_pops.any():
    return own_bits, own_row
  rows: dict[tuple[int, ...], int] = {}
  row_of_group = np.array([rows.setdefault(chain, len(rows))
                           for chain in _prefix_chains(a, own_row)], np.int32)
  # Whole-row ORs of own rows, so a root group with a million edges is not expanded
  # once per descendant.
  mask_bits = np.zeros((bucket_size(len(rows), min_bucket), w), np.uint32)
  for chain, row in rows.items():
    np.bitwise_or.reduce(own_bits[list(chain)], axis=0, out=mask_bits[row])
  return mask_bits, row_of_group


def _own_rows(a: _Automaton, w: int, min_bucket: int,
              edge_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Each group's own tokens, deduplicated: (rows [M_pad, W], row of each group [G]).

  A group's own tokens are its explicit edges (`edge_start[g]:edge_start[g + 1]`), plus
  its state's terminal bitmaps when it pops nothing (terminal edges apply whatever the
  stack holds; every push-down state has a pop-free group). Each row is written once,
  by the first group holding it.
  """
  if a.regular:
    terminals = a.state_terminals[:, :, 0]
  else:
    terminals = np.where((a.group_num_pops == 0)[:, None],
                         a.state_terminals[a.group_state, :, 0], -1)
  terminals = np.ascontiguousarray(terminals, np.int32)
  starts = edge_start.tolist()
  row_of_group, first = _distinct_groups(a.edge_token, starts, terminals)
  bits = np.zeros((bucket_size(len(first), min_bucket), w), np.uint32)
  _copy_terminal_rows(bits, [(row, terms) for row, terms in enumerate(terminals[first].tolist())
                             if max(terms, default=-1) >= 0], a.terminal_bits)
  lo, hi = [starts[k] for k in first], [starts[k + 1] for k in first]
  if len(a.edge_token) - (sum(hi) - sum(lo)) > _DUPLICATE_EDGES:
    # Only the rows' first groups set bits: their edges, copied slice by slice.
    _set_bits(bits, np.repeat(np.arange(len(first)), np.subtract(hi, lo)),
              np.concatenate([a.edge_token[l:h] for l, h in zip(lo, hi)]))
  else:  # Setting a row's bits twice changes nothing: skip filtering.
    _set_bits(bits, np.repeat(row_of_group, edge_start[1:] - edge_start[:-1]), a.edge_token)
  return bits, row_of_group


# Edges of duplicate rows above which `_own_rows` copies out the edges of the rows' first
# groups (~0.3 us a row) rather than setting the bits of every edge (~8 ns an edge).
_DUPLICATE_EDGES = 512


def _distinct_groups(tokens: np.ndarray, edge_start: list[int],
                     terminals: np.ndarray) -> tuple[np.ndarray, list[int]]:
  """Numbers the groups' distinct (terminal ids, explicit tokens) in order of first use.

  Returns (row of each group int32 [G], first group of each row [M], ascending). Keys
  are raw bytes, one comprehension over the groups (no per-group numpy calls); the first
  group holding a key stands for its row.
  """
  tok_bytes = np.asarray(tokens, np.int32).tobytes()
  r4 = 4 * terminals.shape[1]
  term_bytes = terminals.tobytes()
  first_of: dict[bytes, int] = {}
  first_group = [first_of.setdefault(term_bytes[r4 * k:r4 * (k + 1)] + tok_bytes[4 * lo:4 * hi], k)
                 for k, (lo, hi) in enumerate(zip(edge_start[:-1], edge_start[1:]))]
  first = list(first_of.values())
  row_of_first = np.zeros(len(first_group), np.int32)
  row_of_first[first] = np.arange(len(first))
  return row_of_first[first_group], first


def _copy_terminal_rows(bits: np.ndarray, written: list, terminal_bits: np.ndarray) -> None:
  """Writes terminal bitmaps into rows of `bits` (still zero): (row, terminal ids, -1
  for none) pairs.

  Row by row, in place: the first terminal is copied and later ones ORed into the row
  view, so no `[rows, W]` temporaries are gathered (each row is 32 KiB for 262k tokens).
  """
  for row, terminals in written:
    view, empty = bits[row], True
    for terminal in terminals:
      if terminal >= 0:
        if empty:
          view[:] = terminal_bits[terminal]
          empty = False
        else:
          view |= terminal_bits[terminal]


def _prefix_chains(a: _Automaton, own_row: np.ndarray) -> list[tuple[int, ...]]:
  """Per group, the sorted own rows of its state's groups popping a prefix of its pops."""
  by_key = {}
  pops = [tuple(int(x) for x in row[:n]) for row, n in zip(a.group_pops, a.group_num_pops)]
  for k, (state, popped) in enumerate(zip(a.group_state.tolist(), pops)):
    by_key[state, popped] = k
  chains = []
  for k, (state, popped) in enumerate(zip(a.group_state.tolist(), pops)):
    prefixes = (by_key.get((state, popped[:n])) for n in range(len(popped) + 1))
    chains.append(tuple(sorted({int(own_row[h]) for h in prefixes if h is not None})))
  return chains


def _pack(a: _Automaton, vocab, *, stack_depth: int, min_bucket: int,
          masked: _Automaton | None = None) -> ConstraintTables:
  """Packs `a`; its mask rows from `masked` (the same groups, fewer edges) when given."""
  s, g, e = a.num_states, len(a.group_state), len(a.edge_token)
  w = num_words(vocab.vocab_size)
  s_pad, g_pad, e_pad = bucket_size(s, min_bucket), bucket_size(g, min_bucket), bucket_size(
      e, min_bucket)
  # Edges are sorted by group: group k's are those before the first of group k + 1.
  edge_start = np.full(g_pad + 1, e, np.int32)
  edge_start[:g + 1] = a.edge_group.searchsorted(np.arange(g + 1, dtype=a.edge_group.dtype))
  if masked is None:
    mask_bits, row_of_group = _group_masks(a, w, min_bucket, edge_start[:g + 1])
  else:
    mask_bits, row_of_group = _group_masks(
        masked, w, min_bucket,
        masked.edge_group.searchsorted(np.arange(g + 1, dtype=masked.edge_group.dtype)))
  state_groups = _state_groups(a, s_pad)
  group_mask = np.zeros(g_pad, np.int32)
  group_mask[:g] = row_of_group
  group_pops = np.full((g_pad, a.group_pops.shape[1]), NO_STATE, np.int32)
  group_num_pops = np.zeros(g_pad, np.int32)
  edge_pushes = np.zeros(e_pad, np.int32)
  if not a.regular:  # A token DFA pops and pushes nothing: these stay empty.
    group_pops[:g] = a.group_pops
    group_num_pops[:g] = a.group_num_pops
    edge_pushes[:e] = a.edge_push
  edge_tokens = _padded(a.edge_token, e_pad, PAD_TOKEN)
  edge_targets = _padded(a.edge_target, e_pad, NO_STATE)
  accepting = np.zeros(s_pad, bool)
  accepting[:s] = a.accepting
  terminal_bits = _padded_terminal_bits(a, w)
  state_terminals = np.full((s_pad, a.state_terminals.shape[1], 2), NO_STATE, np.int32)
  state_terminals[:s] = a.state_terminals
  return ConstraintTables(
      start=np.zeros(1, np.int32), accepting=accepting, mask_bits=mask_bits,
      state_groups=state_groups, group_mask=group_mask, group_pops=group_pops,
      group_num_pops=group_num_pops, edge_start=edge_start, edge_tokens=edge_tokens,
      edge_targets=edge_targets, edge_pushes=edge_pushes,
      push_symbols=np.asarray(a.push_symbols, np.int32),
      push_lengths=np.asarray(a.push_lengths, np.int32),
      eos_bits=bitmask(np.asarray(vocab.eos_ids, np.int64), vocab.vocab_size),
      terminal_bits=terminal_bits, state_terminals=state_terminals,
      state_terminal_rows=np.zeros(0, np.int32),
      terminal_counts=np.full((terminal_bits.shape[0], 3), NO_STATE, np.int32),
      token_counts=np.zeros((0, vocab.vocab_size), np.int8),
      vocab_size=vocab.vocab_size, stack_depth=stack_depth,
      vocab_fingerprint=vocab.fingerprint)


def _padded(values: np.ndarray, size: int, fill: int) -> np.ndarray:
  """int32 `[size]`: `values`, then `fill` (each entry written once: these are ~E long)."""
  out = np.empty(size, np.int32)
  out[:len(values)] = values
  out[len(values):] = fill
  return out


def _padded_terminal_bits(a: _Automaton, w: int) -> np.ndarray:
  """uint32 `[T_pad, W]`: the terminal bitmaps, zero rows appended up to a power of two.

  A token DFA's bitmaps are an array of its own (`compose_token_dfa` stacks them): used
  as they are when no padding is needed, saving a copy of 32 KiB per terminal.
  """
  num_terminals = a.terminal_bits.shape[0]
  t_pad = bucket_size(num_terminals, 1)
  if (a.regular and t_pad == num_terminals and a.terminal_bits.dtype == np.uint32
      and a.terminal_bits.shape[1] == w):
    return a.terminal_bits
  terminal_bits = np.zeros((t_pad, w), np.uint32)
  terminal_bits[:num_terminals] = a.terminal_bits
  return terminal_bits


def _state_groups(a: _Automaton, s_pad: int) -> np.ndarray:
  """int32 `[S_pad, K]`: the groups of each state, -1 padded (groups sorted by state)."""
  s, g = a.num_states, len(a.group_state)
  if a.regular:
    state_groups = np.full((s_pad, 1), NO_STATE, np.int32)
    state_groups[:s, 0] = np.arange(s)
    return state_groups
  groups_per_state = np.bincount(a.group_state, minlength=s)
  k = max(int(groups_per_state.max(initial=0)), 1)
  state_groups = np.full((s_pad, k), NO_STATE, np.int32)
  first_group = np.zeros(s + 1, np.int64)
  np.cumsum(groups_per_state, out=first_group[1:])
  rank = np.arange(g) - first_group[a.group_state]
  state_groups[a.group_state, rank] = np.arange(g)
  return state_groups


def _set_bits(bits: np.ndarray, rows: np.ndarray, tokens: np.ndarray) -> None:
  """ORs token bits into `bits[rows]`: whole groups of edges, each sorted by token, where
  the groups of one row hold the same tokens.

  `np.bitwise_or.at` (unbuffered, fast since numpy 1.25) costs ~8 ns an edge. When words
  hold several tokens (dense groups, as in push-down tables), the runs of equal words
  are ORed with `np.bitwise_or.reduceat` and written once, several times faster.
  """
  key = rows.astype(np.int64) * bits.shape[1] + (tokens >> 5)
  token_bits = np.uint32(1) << (tokens & 31).astype(np.uint32)
  if len(key) > _DENSE_CHECK_EDGES:
    word_ends = key[1:] != key[:-1]
    if 2 * np.count_nonzero(word_ends) < len(key):  # Two tokens or more a word on average.
      runs = np.flatnonzero(np.concatenate(([True], word_ends)))
      # A row's groups give its words the same bits in every run: `|=` may write a word
      # several times, always with the same value.
      bits.reshape(-1)[key[runs]] |= np.bitwise_or.reduceat(token_bits, runs)
      return
  np.bitwise_or.at(bits.reshape(-1), key, token_bits)


# Edges above which `_set_bits` checks whether words hold several tokens (the check costs
# ~3% of `np.bitwise_or.at`; dense push-down groups have ~1M edges).
_DENSE_CHECK_EDGES = 1 << 16


def tables_nbytes(tables: ConstraintTables) -> dict[str, int]:
  """Bytes used by each array of `tables`, and their `total`."""
  sizes = {name: _nbytes(getattr(tables, name)) for name in _ARRAY_FIELDS}
  sizes["total"] = sum(sizes.values())
  return sizes


def _nbytes(array) -> int:
  """Bytes of a numpy array (read directly), or of anything `np.asarray` takes."""
  return array.nbytes if isinstance(array, np.ndarray) else int(np.asarray(array).nbytes)
