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
  edge_search_steps static int  halvings of the search among one group's edges:
                               ceil(log2(largest group + 1)), at least that of the
                               padding bucket (`edge_search_steps()`)
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
  group_excluded int32 [G] or [0]  row of `excluded_bits` removed from g's mask row (0,
                               the empty row, for most); counted chains only (below)
  excluded_bits uint32 [X, W] or [0, 0]  the tokens of more than r characters of a
                               counted class, one row per (class, r) in use; row 0 empty

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
entry holds the tokens of `terminal_bits[t]` that are also in `terminal_bits[f]` when
f >= 0, those of at most r characters (`token_counts[c, token] <= r`) when
f = AT_MOST - r <= -2, all of them when f = -1. Like every terminal entry, counting
entries are part of the state's mask row, filters applied
(`_counting.CountingTerminals.fold`), so the mask costs one row gather whatever R is;
`advance` reads one word of each entry's bitmap and filter (or the token's count, for a
bound). Near a chain's end, where r characters remain, a
state whose entries share one bound r has the mask row of its tokens without the
bound, and `group_excluded` names the row of `excluded_bits` (tokens of more than r
characters) that the device removes from it: the rows of the last positions are then
shared across r (one exclusion row per r below the longest token, for all slots) instead
of one row per slot and r (~140 rows of 32 KiB for JSON strings with Gemma 3). Other
states (entries with several bounds: a backslash, then `n...` or `u0041...`) keep a
row per r.
The states of a
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
  pack_tables(token_dfa, vocab) TokenDfa -> ConstraintTables      (in `_packing.py`).
  pack_pda_tables(token_pda, vocab, stack_depth=) TokenPda -> ...  (in `_packing.py`).
  stack_tables                 in `_stacking.py` (`cd.stack_tables`).
  tables_nbytes(tables)        size report in bytes, per array and in total.
  ConstraintTables.save(path, vocab=)  one file; `cd.load_tables` reads it (`_tables_file`).
  estimate_nbytes(token_dfa, vocab)  an upper bound, checked before packing (`_packing`).
  bucket_size(n, min_bucket)   the padding rule.
  edge_search_steps(edge_start, min_bucket)  the static search bound of the edges.
  stack_needs(a)               need(q), need_return(s) of a push-down automaton (above;
                               `_packing`).
"""

import dataclasses
from typing import Any

import jax
import numpy as np


PAD_TOKEN = np.iinfo(np.int32).max
NO_STATE = -1
# Explicit edge targets <= RELATIVE are relative: `RELATIVE - k` leads from q to q + k.
RELATIVE = -2
# A counting entry's filter <= AT_MOST is a bound: `AT_MOST - r` keeps the tokens of at
# most r characters (of the terminal's `token_counts` row), with no bitmap.
AT_MOST = -2
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
                 "register_init", "hash_consts", "state_hashing", "token_hash",
                 "group_excluded", "excluded_bits")
# Fields added for push-down tables only: left out of a regular table's `shape_key`.
_CAPPED_FIELDS = ("capped_limits", "capped_rows", "capped_bits")
_META_FIELDS = ("vocab_size", "stack_depth", "vocab_fingerprint", "edge_search_steps")


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
  # Rows removed near counted chains' ends (module docstring); empty otherwise.
  group_excluded: Any = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
  excluded_bits: Any = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.uint32))
  # Halvings of `advance`'s binary search among a group's edges (static): a search never
  # leaves one group, so ceil(log2(largest group + 1)), not of all E edges (13 against
  # 18-21 for JSON schemas). Set from host arrays (`__post_init__`, never below what
  # they need); None (tables built from device arrays) searches all E.
  edge_search_steps: int | None = None

  def __post_init__(self):
    if isinstance(self.edge_start, np.ndarray):  # Host arrays: the bound they need.
      needed = edge_search_steps(self.edge_start)
      if self.edge_search_steps is None or self.edge_search_steps < needed:
        object.__setattr__(self, "edge_search_steps", needed)

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
            self.vocab_size, self.stack_depth, self.edge_search_steps)

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


def edge_search_steps(edge_start: np.ndarray, min_bucket: int = 1) -> int:
  """Halvings that find any token among the edges of the largest group of `edge_start`
  (ceil(log2(n + 1)) for n edges: one fewer misses the second edge of 2^k), that
  size bucketed like the other axes (at least `min_bucket`) so that tables padded to
  one bucket share a compiled step whatever their groups."""
  edge_start = np.asarray(edge_start, np.int64)
  largest = int(np.diff(edge_start).max(initial=0)) if len(edge_start) else 0
  return max(largest, int(min_bucket)).bit_length()


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


def tables_nbytes(tables: ConstraintTables) -> dict[str, int]:
  """Bytes used by each array of `tables`, and their `total`."""
  sizes = {name: _nbytes(getattr(tables, name)) for name in _ARRAY_FIELDS}
  sizes["total"] = sum(sizes.values())
  return sizes


def _nbytes(array) -> int:
  """Bytes of a numpy array (read directly), or of anything `np.asarray` takes."""
  return array.nbytes if isinstance(array, np.ndarray) else int(np.asarray(array).nbytes)
