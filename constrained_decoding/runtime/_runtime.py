"""Device-side constraint stepping: pure functions of `ConstraintTables` and `ConstraintState`.

All functions take the tables as their first (traced) argument, never as a closure or a
static argument, so two constraints whose tables have the same padded shapes share one
compiled executable. Nothing here raises inside jit: a forbidden token, or a push past
the stack capacity, sets the sticky `error` flag.

Push-down tables (recursive grammars, Alg. 3) keep a stack per row: `stack[B, D]` with
`depth[B]` symbols in use. A state's edges come in groups, one per pop sequence; the
allowed set is the union of the groups whose pops match the top of the stack, and
advancing pops the group's symbols and pushes the edge's. The matching groups pop
prefixes of one sequence, so the union is the mask row of the deepest match alone. Regular tables have one
group per state that pops nothing, and `D = 0`. Near the stack bound the mask leaves out
the tokens after which the row could no longer finish within D (`tables.py`,
"Stack-aware masks"), so a walk over allowed tokens never overflows nor dead-ends;
`advance` refuses such a token like any other the mask leaves out (it sets `error`), so
that a token fed by hand (teacher forcing, speculative drafts) is taken exactly when the
mask would have offered it.

Host boundary. Called outside `jax.jit`, the public functions check what users pass
and raise `errors.DecodingArgumentError` naming the argument, what was expected and
what was given: token ids and `constraint_ids` of an integer dtype (no floats, no
bools) and shape `[B]`, logits `[B, V']` of a floating dtype with V' >= vocab_size,
the state's batch and stack width; and, for arrays whose values are known (not
tracers), ids in [0, vocab_size) and `constraint_ids` in [0, C). Inside jit the shape
and dtype checks still run (once, at trace time) but values are unknown: an id out of
range sets the row's `error`, a `constraint_ids` out of range is clamped. Concrete
token arrays are read back to the host for the range check (B ints), so eager loops
that care for every microsecond jit their step, as the decoding loops here do.

Public functions:
  init_state(tables, batch_size, constraint_ids)  the start state of each row.
  allowed_tokens(tables, state)   Bool[B, V] allowed next tokens.
  allowed_bits(tables, state)     the same, packed into uint32 [B, ceil(V / 32)].
  mask_logits(tables, state, logits)  -inf where not allowed.
  advance(tables, state, tokens)  consume one token per row.

Counted chains (`X{n,m}`) use relative targets (`tables.py`): an explicit edge may lead
to the state plus a fixed offset, a counting terminal to the state plus a stride times
the token's character count (one more gather, only in tables that have one).
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.typing import ArrayLike
from jaxtyping import Array, Bool, Float, Int, UInt32

from constrained_decoding.errors import DecodingArgumentError
from constrained_decoding.lexed_tables import LexedTables
from constrained_decoding.runtime import _guards
from constrained_decoding.tables import AT_MOST
from constrained_decoding.tables import RELATIVE
from constrained_decoding.tables import ConstraintTables


# What the public functions step: flat / push-down tables here, or the two-level
# tables of a grammar with a lexer (`_lexed.py`). Which one is a Python type check at
# trace time, so the flat runtime's jitted code and per-step cost stay as they were.
AnyTables = ConstraintTables | LexedTables


def _on_device(tables: AnyTables) -> AnyTables:
  """Tables as jax arrays (a no-op for traced or device tables; numpy ones convert)."""
  return jax.tree_util.tree_map(jnp.asarray, tables)


@struct.dataclass(kw_only=True)
class ConstraintState:
  """Per-row decoding state of a constraint; an immutable pytree.

  ```python
  state = cd.init_state(tables, batch_size=4)
  state = cd.advance(tables, state, tokens)   # tokens: Int[4]
  ```

  Fields are `[B]` (the stack `[B, D]`); a leading `*batch` axis appears only while
  `vmap` stacks states.

  Attributes:
    state: Automaton state of each row (`[B]`).
    stack: Stack symbols of each row, bottom first; only the first `depth` are in use
      (`[B, D]`, D = `tables.stack_depth`, 0 for regular constraints).
    depth: Number of symbols on each row's stack (`[B]`).
    done: An end-of-sequence token was consumed; the row only allows end of sequence
      from now on and ignores further tokens (`[B]`).
    error: A token the constraint forbids was fed, or the stack overflowed (sticky).
      The row's state is left where it was, and only end of sequence is allowed (`[B]`).
    registers: Register words of each row (`[B, NR]`, NR = `tables.register_init`'s
      length, 0 unless the tables check object keys on the device; `tables.py`,
      "Register tables"). None stands for `[B, 0]`.
  """

  state: Int[Array, "*batch B"]
  stack: Int[Array, "*batch B D"]
  depth: Int[Array, "*batch B"]
  done: Bool[Array, "*batch B"]
  error: Bool[Array, "*batch B"]
  registers: Int[Array, "*batch B R"] | None = None


def _traced(x) -> bool:
  """Whether `x`'s values are unknown here (inside jit, vmap, grad, ...)."""
  return isinstance(x, jax.core.Tracer)


def _as_array(x):
  """`x` itself if it has a dtype and shape (jax, numpy, tracers), else a numpy array."""
  return x if hasattr(x, "dtype") and hasattr(x, "shape") else np.asarray(x)


def _readable(x) -> bool:
  """Whether `x`'s values can be read on the host: not traced, and all of it here."""
  return not _traced(x) and (not isinstance(x, jax.Array) or x.is_fully_addressable)


def _given(x) -> str:
  return f"a {np.dtype(x.dtype).name} array of shape {tuple(x.shape)}"


def _check_int_array(fn: str, name: str, x, shape: tuple[int | None, ...], high: int,
                     what: str):
  """`x` (as an array) if it has an integer dtype, `shape` (None: any length) and,
  where its values are known, values in [0, high); else raises `DecodingArgumentError`."""
  x = _as_array(x)
  dtype = np.dtype(x.dtype)
  if dtype == np.bool_ or not jnp.issubdtype(dtype, jnp.integer):
    raise DecodingArgumentError(
        f"{fn}: {name} is {_given(x)}. Expected an integer dtype ({what}): a float or "
        f"bool would be truncated or read as 0/1. Cast with .astype(jnp.int32) only if "
        f"the values are whole numbers.")
  if len(x.shape) != len(shape) or any(n not in (None, m) for n, m in zip(shape, x.shape)):
    wanted = "(" + ", ".join("B" if n is None else str(n) for n in shape) + ",)"
    raise DecodingArgumentError(
        f"{fn}: {name} is {_given(x)}. Expected shape {wanted}, one entry per row of the "
        f"batch (no broadcasting); vmap over any extra axis.")
  if _readable(x) and x.size:
    values = np.asarray(x)
    bad = (values < 0) | (values >= high)
    if bad.any():
      row = int(np.argmax(bad))
      raise DecodingArgumentError(
          f"{fn}: {name}[{row}] = {int(values[row])} is out of range. Expected {what} in "
          f"[0, {high}).")
  return x


def _check_state(fn: str, tables: ConstraintTables, state) -> int:
  """The batch size B of `state`, if it is a `ConstraintState` of B rows for `tables`
  (stack width `tables.stack_depth`); else raises `DecodingArgumentError`."""
  if not isinstance(state, ConstraintState):
    raise DecodingArgumentError(
        f"{fn}: state is a {type(state).__name__}. Expected a ConstraintState "
        f"(from init_state).")
  shape = tuple(jnp.shape(state.state))
  if len(shape) != 1:
    raise DecodingArgumentError(
        f"{fn}: state has rows of shape {shape}. Expected one batch axis (B,); vmap over "
        f"any extra axis.")
  expected = dict(state=shape, depth=shape, done=shape, error=shape,
                  stack=shape + (tables.stack_depth,),
                  registers=shape + tuple(jnp.shape(tables.register_init)))
  for field, want in expected.items():
    value = getattr(state, field)
    if value is None and field == "registers" and not tables.has_registers:
      continue
    got = tuple(jnp.shape(value)) if value is not None else None
    if got != want:
      raise DecodingArgumentError(
          f"{fn}: state.{field} has shape {got}. Expected {want} for these tables "
          f"(stack_depth {tables.stack_depth}): a state made for other tables?")
  return shape[0]


def init_state(
    tables: AnyTables,
    batch_size: int | None = None,
    *,
    constraint_ids: ArrayLike | Sequence | None = None,
) -> ConstraintState:
  """The start state of each row (empty stacks).

  Args:
    tables: Compiled (possibly stacked) tables.
    batch_size: Number of rows, an int >= 1; may be omitted when `constraint_ids` is
      given.
    constraint_ids: Which stacked constraint each row follows (default: constraint 0):
      integers of shape `[B]`, each in [0, C) for C stacked constraints. Inside jit
      only the dtype and shape are checked, and an id out of range is clamped.

  Raises:
    DecodingArgumentError: (a `ValueError`) If neither argument is given, `batch_size`
      is not a positive int, or `constraint_ids` is not an integer array of shape
      `(batch_size,)` (when both are given) or, where its values are known, names no
      constraint of `tables`.
  """
  fn = "init_state"
  if isinstance(tables, LexedTables):  # Static: a grammar with a lexer.
    return _lexed.init_state(_on_device(tables), batch_size, constraint_ids=constraint_ids)
  if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
      batch_size, (int, np.integer)) or batch_size < 1):
    raise DecodingArgumentError(
        f"{fn}: batch_size {batch_size!r} is not a positive int. Expected an int >= 1.")
  if constraint_ids is None:
    if batch_size is None:
      raise DecodingArgumentError(
          "init_state needs batch_size or constraint_ids. Expected one of them.")
    constraint_ids = jnp.zeros((int(batch_size),), jnp.int32)
  else:
    ids = _as_array(constraint_ids)
    if batch_size is not None and tuple(ids.shape) != (batch_size,):
      raise DecodingArgumentError(
          f"constraint_ids has shape {tuple(ids.shape)}. Expected ({batch_size},), one "
          f"per row.")
    constraint_ids = _check_int_array(fn, "constraint_ids", ids, (batch_size,),
                                      int(jnp.shape(tables.start)[0]),
                                      "indices of stacked constraints")
  constraint_ids = jnp.asarray(constraint_ids, jnp.int32)
  start = jnp.asarray(tables.start)[constraint_ids]
  false = jnp.zeros(start.shape, bool)
  return ConstraintState(
      state=start.astype(jnp.int32),
      stack=jnp.zeros(start.shape + (tables.stack_depth,), jnp.int32),
      depth=jnp.zeros(start.shape, jnp.int32), done=false, error=false,
      registers=jnp.broadcast_to(jnp.asarray(tables.register_init, jnp.int32),
                                 start.shape + tables.register_init.shape))


def _matching_groups(tables: ConstraintTables, state: ConstraintState) -> tuple[Array, Array]:
  """Groups of each row's state and whether their pops match its stack: ([B, K], [B, K]).

  One gather of the top P stack symbols and one comparison against every group's pop
  sequence, vectorized over K and P (no Python loop: the compiled step stays small).
  """
  groups = tables.state_groups[state.state]  # [B, K]
  safe = jnp.maximum(groups, 0)
  match = groups >= 0
  pops = tables.group_pops.shape[1]
  capacity = state.stack.shape[-1]
  if pops and capacity:
    position = state.depth[:, None] - 1 - jnp.arange(pops)[None, :]  # [B, P]
    tops = jnp.take_along_axis(state.stack, jnp.clip(position, 0, capacity - 1), axis=1)
    tops = jnp.where(position >= 0, tops, -2)
    num_pops = tables.group_num_pops[safe]  # [B, K]
    wanted = tables.group_pops[safe]  # [B, K, P]
    needed = jnp.arange(pops)[None, None, :] < num_pops[:, :, None]
    match &= jnp.all(~needed | (wanted == tops[:, None, :]), axis=-1)
  elif pops:  # No stack at all: only groups that pop nothing apply.
    match &= tables.group_num_pops[safe] == 0
  return safe, match


def _end_allowed(tables: ConstraintTables, state: ConstraintState) -> Array:
  """Bool [B]: the row's state and every state on its stack are accepting."""
  ok = tables.accepting[state.state]
  if state.stack.shape[-1]:
    in_use = jnp.arange(state.stack.shape[-1])[None, :] < state.depth[:, None]
    ok &= jnp.all(tables.accepting[state.stack] | ~in_use, axis=1)
  return ok


def _terminal_rows(tables: ConstraintTables, state: ConstraintState) -> Array:
  """Row of `state_terminals` of each row's state (the state itself unless the tables
  share rows between states: `state_terminal_rows`, counted chains)."""
  if tables.state_terminal_rows.shape[0]:  # Static.
    return tables.state_terminal_rows[state.state]
  return state.state


def _deepest_group(tables: ConstraintTables, groups: Array, match: Array) -> tuple[Array, Array]:
  """(deepest [B], any [B]): each row's matching group that pops the most, and whether
  any group matches. The matching groups pop prefixes of one sequence (the stack's
  top), so the deepest one's mask row holds the others' tokens (`_packing._group_masks`)."""
  rank = jnp.where(match, tables.group_num_pops[groups] + 1, 0)
  deepest = jnp.take_along_axis(groups, jnp.argmax(rank, axis=1)[:, None], axis=1)[:, 0]
  return deepest, rank.max(axis=1) > 0


def _capped_row(tables: ConstraintTables, state: ConstraintState, deepest: Array) -> Array:
  """Int [B]: the row of `capped_bits` holding the tokens of each row's deepest group
  that need more stack than the row has left (`tables.py`, "Stack-aware masks"): the
  exclusion row of the first limit above the free capacity (row 0, empty, when none is)."""
  free = state.stack.shape[-1] - state.depth  # [B]
  limits = tables.capped_limits[deepest]  # [B, L], ascending
  level = jnp.sum(limits <= free[:, None], axis=1)
  rows = jnp.take_along_axis(tables.capped_rows[deepest],
                             jnp.minimum(level, limits.shape[1] - 1)[:, None], axis=1)[:, 0]
  return jnp.where(level < limits.shape[1], rows, 0)


def _capped(tables: ConstraintTables, state: ConstraintState) -> bool:
  """Static: whether the tables have stack-aware masks and the state a stack."""
  return bool(tables.capped_limits.shape[-1]) and bool(state.stack.shape[-1])


def allowed_bits(tables: AnyTables, state: ConstraintState) -> UInt32[Array, "B W"]:
  """The allowed set of each row, packed: token t is bit t % 32 of word t // 32.

  What `allowed_tokens` unpacks; 32x smaller, for callers that count or combine sets
  (popcounts for jump-forward, ORs across rows) without materializing `[B, V]` bools.
  End of sequence only, once a row is `done` or in `error`.

  Raises:
    DecodingArgumentError: If `state` is not a `ConstraintState` of one batch axis
      whose stack is `tables.stack_depth` wide (checked at trace time inside jit).
  """
  if isinstance(tables, LexedTables):  # Static: a grammar with a lexer.
    return _lexed.allowed_bits(_on_device(tables), state)
  _check_state("allowed_bits", tables, state)
  return _allowed_bits(tables, state)


def _allowed_bits(tables: ConstraintTables, state: ConstraintState) -> UInt32[Array, "B W"]:
  tables = _on_device(tables)
  groups, match = _matching_groups(tables, state)
  # Gather one mask row per batch row, the deepest matching group's, however many match.
  deepest, any_match = _deepest_group(tables, groups, match)
  bits = jnp.where(any_match[:, None], tables.mask_bits[tables.group_mask[deepest]],
                   jnp.uint32(0))
  if tables.group_excluded.shape[0]:  # Static: counted chains, tokens too long for r.
    bits &= ~tables.excluded_bits[tables.group_excluded[deepest]]
  if tables.has_registers:  # Static: objects whose keys the device checks.
    bits |= _guards.guarded_bits(tables, _registers(tables, state),
                                 tables.group_guarded[deepest], any_match, bits.shape[1])
  if _capped(tables, state):  # Static: push-down only; guarded tokens are capped too.
    bits &= ~tables.capped_bits[_capped_row(tables, state, deepest)]
  bits |= jnp.where(_end_allowed(tables, state)[:, None], tables.eos_bits[None, :],
                    jnp.uint32(0))
  stopped = (state.done | state.error)[:, None]
  return jnp.where(stopped, tables.eos_bits[None, :], bits)


def _registers(tables: ConstraintTables, state: ConstraintState) -> Int[Array, "B R"]:
  """The row's register words (`[B, NR]`; a state made without them has none)."""
  if state.registers is None:
    return jnp.zeros(state.state.shape + tables.register_init.shape, jnp.int32)
  return state.registers


def allowed_tokens(tables: AnyTables, state: ConstraintState) -> Bool[Array, "B V"]:
  """Which tokens each row may produce next.

  Raises:
    DecodingArgumentError: As `allowed_bits`, for a `state` that does not fit `tables`.
  """
  if isinstance(tables, LexedTables):  # Static: a grammar with a lexer.
    return _lexed.allowed_tokens(_on_device(tables), state)
  _check_state("allowed_tokens", tables, state)
  return _allowed_tokens(tables, state)


def _allowed_tokens(tables: ConstraintTables, state: ConstraintState) -> Bool[Array, "B V"]:
  bits = _allowed_bits(tables, state)
  shifts = jnp.arange(32, dtype=jnp.uint32)
  unpacked = ((bits[:, :, None] >> shifts) & 1).astype(bool)
  return unpacked.reshape(bits.shape[0], -1)[:, :tables.vocab_size]


def mask_logits(
    tables: AnyTables, state: ConstraintState, logits: ArrayLike
) -> Float[Array, "B V"]:
  """`logits` with -inf wherever the constraint forbids the token.

  `logits` is `[B, V']`, B the state's batch, of a floating dtype. It may be wider than
  `tables.vocab_size` (padded embeddings): the extra columns are forbidden too; never
  narrower (the mask would lose the tokens past V'). Jit the caller with `logits`
  donated (`donate_argnums`) so XLA masks in place instead of writing a fresh [B, V]
  buffer.

  Raises:
    DecodingArgumentError: If `logits` is not a floating array of shape `[B, V']`
      with V' >= `tables.vocab_size` (a 1-D row, another batch size and narrower
      logits are not broadcast or truncated), or `state` does not fit `tables`.
      Checked at trace time inside jit.
  """
  fn = "mask_logits"
  lexed = isinstance(tables, LexedTables)  # Static: a grammar with a lexer.
  batch = (_lexed._check_state if lexed else _check_state)(fn, tables, state)
  logits = _as_array(logits)
  if not jnp.issubdtype(logits.dtype, jnp.floating):
    raise DecodingArgumentError(
        f"{fn}: logits is {_given(logits)}. Expected a floating dtype (float32, "
        f"bfloat16, ...): masking writes -inf.")
  if len(logits.shape) != 2 or logits.shape[0] != batch or logits.shape[1] < tables.vocab_size:
    raise DecodingArgumentError(
        f"{fn}: logits is {_given(logits)}. Expected shape ({batch}, V') with V' >= "
        f"{tables.vocab_size}: one row per row of the state (no broadcasting), at least "
        f"as wide as the vocabulary the tables were compiled for.")
  # Unpacking bits by broadcasting (not gathering word i // 32 per token) keeps this one
  # elementwise fusion that XLA merges into whatever consumes the logits: inside the
  # decode loop the gather form cost ~4 ms per step at batch 8, this form nothing.
  width = logits.shape[-1]
  allowed = (_lexed.allowed_tokens(_on_device(tables), state) if lexed
             else _allowed_tokens(tables, state))
  if width > tables.vocab_size:
    allowed = jnp.pad(allowed, ((0, 0), (0, width - tables.vocab_size)))
  return jnp.where(allowed, logits, jnp.asarray(-jnp.inf, logits.dtype))


# The unroll factor of `_find_edges`' loop per platform (`lax.platform_dependent` keys;
# read at trace time, chosen when lowering). A loop on CPU: unrolled, the chain of
# dependent gathers made XLA 0.12 take minutes to compile `advance` for register tables.
# Unrolled elsewhere: on a GPU every iteration of a while loop costs kernel launches and a
# read-back of its predicate, ~0.3 ms a step on an H200 for ~20 halvings, against
# 0.02-0.1 ms unrolled (benchmarks/device_kit.py, README "On a GPU").
EDGE_SEARCH_UNROLL = {"cpu": 1, "default": True}


def _find_edges(tables: ConstraintTables, group: Array, tokens: Array) -> tuple[Array, Array]:
  """Binary search of each row's token among each of its groups' sorted edges.

  `group` is `[B, K]` (a row's candidate groups) and `tokens` `[B]`: one `fori_loop`
  for all groups at once, unrolled per platform (`EDGE_SEARCH_UNROLL`), of
  `tables.edge_search_steps` halvings (log2 of the largest group, not of all E edges:
  a search never leaves its group), or log2(E + 1) when the tables do not say.
  """
  num_edges = tables.edge_tokens.shape[0]
  lo = tables.edge_start[group]
  hi = tables.edge_start[group + 1]
  end = hi
  tokens = tokens[:, None]

  def halve(_, bounds):
    lo, hi = bounds
    mid = (lo + hi) // 2
    value = tables.edge_tokens[jnp.minimum(mid, num_edges - 1)]
    right = (value < tokens) & (lo < hi)
    left = (value >= tokens) & (lo < hi)
    return jnp.where(right, mid + 1, lo), jnp.where(left, mid, hi)

  steps = num_edges.bit_length()  # ceil(log2(E + 1)): enough for any group.
  if tables.edge_search_steps is not None:  # Static: the largest group's bound.
    steps = min(steps, tables.edge_search_steps)
  search = lambda unroll: lambda lo, hi: jax.lax.fori_loop(0, steps, halve, (lo, hi),
                                                           unroll=unroll)[0]
  lo = jax.lax.platform_dependent(
      lo, hi, **{platform: search(unroll) for platform, unroll in EDGE_SEARCH_UNROLL.items()})
  slot = jnp.minimum(lo, num_edges - 1)
  found = (lo < end) & (tables.edge_tokens[slot] == tokens)
  return slot, found


def _apply_stack(tables: ConstraintTables, state: ConstraintState, moved: Array,
                 num_pops: Array, push: Array) -> tuple[Array, Array, Array]:
  """(stack, depth, overflow) after popping `num_pops` and pushing row `push`, where moved."""
  capacity = state.stack.shape[-1]
  if not capacity:
    return state.stack, state.depth, jnp.zeros(state.depth.shape, bool)
  length = tables.push_lengths[push]
  base = state.depth - num_pops
  new_depth = base + length
  overflow = moved & (new_depth > capacity)
  ok = moved & ~overflow
  stack = state.stack
  width = tables.push_symbols.shape[1]
  if width:
    offsets = jnp.arange(width)[None, :]
    # Positions of rows not moving, or past the pushed sequence, are out of range: dropped.
    position = jnp.where(ok[:, None] & (offsets < length[:, None]), base[:, None] + offsets,
                         capacity)
    rows = jnp.broadcast_to(jnp.arange(stack.shape[0])[:, None], position.shape)
    stack = stack.at[rows, position].set(tables.push_symbols[push], mode="drop")
  return stack, jnp.where(ok, new_depth, state.depth), overflow


def advance(
    tables: AnyTables, state: ConstraintState, tokens: ArrayLike | Sequence
) -> ConstraintState:
  """Consumes one token per row.

  A row takes its token exactly when `allowed_tokens` offers it: an end-of-sequence
  token where end is allowed sets `done`; any other token the mask leaves out sets
  `error` and leaves the state and stack unchanged. That includes, for push-down
  tables, a token of the language that the stack-aware mask leaves out because the row
  could not finish within the stack after it (`tables.py`, "Stack-aware masks"), even
  if its pushes would fit: one more bit gathered per row, only for push-down tables.
  Rows already `done` or in `error` ignore their token.

  Args:
    tables: The tables the state was made for.
    state: The current state (`[B]` rows).
    tokens: One token id per row: integers of shape `[B]` (no broadcasting). Where
      their values are known (outside jit) each must be in [0, vocab_size); inside jit
      an id out of range sets the row's `error`.

  Raises:
    DecodingArgumentError: If `tokens` has a float or bool dtype, another shape than
      `(B,)`, or (values known) an id outside [0, `tables.vocab_size`) (an int64
      2**32 + 97 is not read as 97); or `state` does not fit `tables`. Dtype and shape
      are checked at trace time inside jit, so a jitted step does not retrace.
  """
  fn = "advance"
  if isinstance(tables, LexedTables):  # Static: a grammar with a lexer.
    return _lexed.advance(_on_device(tables), state, tokens)
  batch = _check_state(fn, tables, state)
  tokens = _check_int_array(fn, "tokens", tokens, (batch,), tables.vocab_size, "token ids")
  tables = _on_device(tables)
  tokens = jnp.asarray(tokens, jnp.int32)
  in_range = (tokens >= 0) & (tokens < tables.vocab_size)
  safe = jnp.where(in_range, tokens, 0)
  word = tables.eos_bits[safe >> 5]
  is_eos = in_range & (((word >> (safe & 31).astype(jnp.uint32)) & 1) == 1)
  groups, match = _matching_groups(tables, state)
  # Explicit edges: a deterministic automaton has at most one in the matching groups.
  slot, hit = _find_edges(tables, groups, safe)  # [B, K]
  hit &= match & (in_range & ~is_eos)[:, None]
  found = hit.any(axis=1)
  k = jnp.argmax(hit, axis=1)[:, None]
  slot = jnp.take_along_axis(slot, k, axis=1)[:, 0]
  group = jnp.take_along_axis(groups, k, axis=1)[:, 0]
  registers = written = _registers(tables, state)
  guarded = jnp.zeros(found.shape, bool)
  if tables.has_registers:  # Static. A guarded edge is taken only if its guard passes.
    row = tables.group_guarded[group]
    listed = tables.guarded_slots[row] == slot[:, None]  # [B, Gm]
    guard = jnp.where(found & listed.any(axis=1), jnp.take_along_axis(
        tables.guarded_ids[row], jnp.argmax(listed, axis=1)[:, None], axis=1)[:, 0], -1)
    passes, writes = _guards.run_guards(tables, registers, guard)
    found &= passes
    guarded = found & (guard >= 0)
    rows = jnp.arange(guard.shape[0])
    for word, value in writes:  # In order: a later write to a word holds the earlier.
      # Only the explicit edge taken writes (not one whose guard failed, nor a terminal's).
      word = jnp.where(found, word, registers.shape[1])
      written = written.at[rows, word].set(value, mode="drop")
  target = tables.edge_targets[slot]
  # Targets <= RELATIVE (-2) are relative (counted chains, `tables.py`): q + RELATIVE - t.
  target = jnp.where(target >= 0, target, state.state + RELATIVE - target)
  target = jnp.where(found, target, state.state)
  num_pops = jnp.where(found, tables.group_num_pops[group], 0)
  push = jnp.where(found, tables.edge_pushes[slot], 0)
  # Terminal edges, in precedence order, for tokens without an explicit edge: all R of
  # a row's at once (one gather each, whatever R), the first that holds the token wins.
  # [B, R, 2]: (terminal id, target)
  terminal = tables.state_terminals[_terminal_rows(tables, state)]
  term_ids = jnp.maximum(terminal[..., 0], 0)
  bits = tables.terminal_bits[term_ids, (safe >> 5)[:, None]]
  if tables.token_counts.shape[0]:  # A counting entry's filter ANDs another bitmap ...
    count_rows = tables.terminal_counts[term_ids, 0]  # [B, R]
    filters = jnp.where(count_rows >= 0, terminal[..., 1], -1)
    bits &= jnp.where(filters >= 0,
                      tables.terminal_bits[jnp.maximum(filters, 0), (safe >> 5)[:, None]],
                      jnp.uint32(0xFFFFFFFF))
    # ... or bounds the token's characters: AT_MOST - r keeps counts <= r.
    counts = tables.token_counts[jnp.maximum(count_rows, 0), safe[:, None]].astype(jnp.int32)
    bits = jnp.where((filters <= AT_MOST) & (counts > AT_MOST - filters), jnp.uint32(0), bits)
  hit = ((bits >> (safe & 31).astype(jnp.uint32)[:, None]) & 1) == 1
  hit &= terminal[..., 0] >= 0
  first = jnp.argmax(hit, axis=1)[:, None]
  term_found = hit.any(axis=1) & in_range & ~is_eos & ~found
  term_target = jnp.take_along_axis(terminal[..., 1], first, axis=1)[:, 0]
  if tables.token_counts.shape[0]:  # Static: tables without counted chains skip this.
    # A counting terminal's target field is a stride: q + stride * characters + bias.
    term_id = jnp.maximum(jnp.take_along_axis(terminal[..., 0], first, axis=1)[:, 0], 0)
    row, stride, bias = (tables.terminal_counts[term_id, k] for k in range(3))
    count = tables.token_counts[jnp.maximum(row, 0), safe].astype(jnp.int32)
    term_target = jnp.where(row >= 0, state.state + stride * count + bias, term_target)
  target = jnp.where(term_found, term_target, target)
  found |= term_found
  if _capped(tables, state):  # Static: push-down only. As the mask: refused at the bound.
    deepest, _ = _deepest_group(tables, groups, match)
    word = tables.capped_bits[_capped_row(tables, state, deepest), safe >> 5]
    refused = ((word >> (safe & 31).astype(jnp.uint32)) & 1) == 1
    found &= ~refused
  end = is_eos & _end_allowed(tables, state)
  active = ~(state.done | state.error)
  stack, depth, overflow = _apply_stack(tables, state, active & found, num_pops, push)
  moved = active & found & ~overflow
  if tables.has_hashes:  # Static. Tokens inside a string item without a guard.
    written = _guards.extend_hashes(tables, written, state.state, safe, ~guarded)
  if tables.has_registers:  # Static. A row that did not move keeps its registers.
    registers = jnp.where(moved[:, None], written, registers)
  return state.replace(
      state=jnp.where(moved, target, state.state), stack=stack, depth=depth,
      registers=registers,
      done=state.done | (active & end),
      error=state.error | (active & ~found & ~end) | overflow)


# Last: `_lexed` imports `ConstraintState` and the argument checks from this module.
from constrained_decoding.runtime import _lexed  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
