"""Device step of grammars with a lexer: lexer-state x token table + LR parser (issue 18).

Increment 3 of docs/lexer_runtime.md. `LexedTables` holds the arrays that
`constraints/_lexed_grammar.compile_lexed_grammar` builds on the host; the functions
here step them inside `jax.jit` (static shapes, `lax.while_loop`, no host callbacks).
The row state is `runtime.ConstraintState`: `state` is the lexer state, `stack[B, D]`
the LR parser's states (bottom first, `depth[B]` in use; the bottom is the grammar's
parser start state),
`done` and the sticky `error` as in `_runtime.py`.

One step of a row in lexer state s:

* the token's *outcome class* (per lexer state, the tokens with the same completed
  lexeme sequence and final lexer state) gives the lexemes it completes (at most L) and
  the lexer state f it leaves;
* a *lane* runs the parser over those lexemes on a copy of the row's stack: each lexeme
  is the first terminal of its class the top state has an action for; reductions
  (pop `rule_len`, push `goto`) until it shifts, all in one `lax.while_loop` of
  micro-steps (one reduce or shift per lane and iteration) over every lane at once;
* the lane survives when no lexeme is an error, the stack never passes D, and the
  lexeme pending in f can still become an ignored lexeme or a terminal the final top
  state has an action for (canonical LR(1): an action means the terminal can come next);
* end of sequence is one more lane: the lexeme pending in s (if it is complete), then
  `$END`.

`allowed_bits` runs one lane per distinct item sequence of the row's lexer state (Ks,
padded; outcome classes that differ only in their final state share a lane) plus the
end lane; each of the state's K outcome slots then takes its lane's result and checks
its pending lexeme against the lane's top state. Lanes do not copy the row's stack:
they read it and keep only what they push (P = min(D, 2 L + 8) entries); if a lane runs
out of room (long chains of empty rules), all lanes are rerun on full copies
(`lax.cond`, exact either way). The mask ORs the surviving slots' token sets: a gather
of the few bitmap slots' rows (Kb rows of W words) and a scatter-add of the listed
tokens (N per state; tokens of a state are distinct, so adding bits is OR-ing them).
`advance` finds the token's slot (a binary search of the state's listed tokens, one bit
per bitmap slot), runs its lane and the end lane on full stacks, and takes the token
exactly when `allowed_bits` offers it (same lanes, same tables).

Cost per row and step (exact, simple; the design's viable-set classes and prefix-shared
lanes are not built): `allowed_bits` works on Ks + 1 lanes for as many iterations as
the longest surviving lane's lexemes + reductions, O(P) per lane and iteration; then
Kb x W words of OR and N scattered ids. `advance`: log2(N) + Kb gathers, then 2 lanes
of O(D). Ks, K, N, Kb, L are maxima over lexer states, so every row pays the worst
state's widths.

Measured (`.venv/bin/python benchmarks/lexed_step.py`, Gemma 3 vocabulary, 262,144
tokens; `constraints/grammars/sql_select_lexed.lark`; this 2-core shared CPU, jitted
`allowed_bits` + `advance`, median / p90 / max over the 87 states of two queries, best
of 5 rounds): compile 2.1-2.6 s; tables 5.7 MiB (set_bits 60 x 8,192 words 1.9 MiB,
listed tokens N = 2,058 per state 2 x 1.1 MiB, K = 612 slots, Ks = 214 lanes, L = 16,
Kb = 2; canonical LR(1) 343 states x 33 terminals, 0.1 MiB). Step: batch 1 0.24 / 0.27
/ 0.55 ms, batch 8 0.78 / 0.91 / 1.15 ms, batch 64 8.9 / 12.9 / 13.8 ms; the flat JSON
grammar's step in the same runs 0.26-1.0 ms (batch 1), 0.35-1.1 ms (8), 0.87-1.3 ms
(64): on par up to batch 8, 7-10x at batch 64, where the lanes are ~3/4 of the step.

Approximation: a pending lexeme counts as fine when it can still become an ignored
lexeme or a terminal the parser takes next; whether the text after that terminal can
start without extending it (longest match) is not checked. Grammars whose terminals
are separated by an `%ignore`d one (whitespace) never meet the difference.

Several grammars stack into one table set (`_lexed_grammar.stack_lexed_arrays`, rows
pick theirs by `init_state(..., constraint_ids=)`); not with `ConstraintTables` of the
flat runtime. Not yet: `rewind`, lexer modes
(INDENT/DEDENT), stack-aware masks (near the stack bound a row may be left with only
tokens that would overflow: they are refused, so a walk can dead-end within a few
tokens of D; pick D above the nesting the text needs).

Public:
  LexedTables, tables_from_arrays(arrays)   the device tables.
  init_state(tables, batch_size, constraint_ids=)   the start state of each row.
  allowed_bits / allowed_tokens(tables, state)   packed uint32 [B, W] / bool [B, V].
  advance(tables, state, tokens)            consume one token per row.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.typing import ArrayLike
from jaxtyping import Array, Bool, Int, UInt32

from constrained_decoding.errors import DecodingArgumentError
from constrained_decoding.runtime._runtime import ConstraintState
from constrained_decoding.runtime._runtime import _check_int_array

_END = 0  # The parser terminal id of `$END`.


@struct.dataclass(kw_only=True)
class LexedTables:
  """Two-level tables of a grammar with a lexer, for the device (an immutable pytree).

  ```python
  arrays = compile_lexed_grammar(grammar_text, vocab)   # host
  tables = tables_from_arrays(arrays)
  state = init_state(tables, 4)
  state = advance(tables, state, tokens)
  ```

  Fields: as `constraints._lexed_grammar.LexedArrays` (S lexer states, K outcome slots
  per state, L lexemes per token, Q parser states, T terminals in Tw words, W = ceil(V
  / 32) words).
  """
  lex_start: Int[Array, "G"]
  lr_start: Int[Array, "G"]
  state_outcomes: Int[Array, "S K"]
  state_seq_lanes: Int[Array, "S Ks"]
  state_slot_lane: Int[Array, "S K"]
  outcome_seq: Int[Array, "O"]
  outcome_final: Int[Array, "O"]
  seq_items: Int[Array, "Qs L"]
  class_members: Int[Array, "C M"]
  state_big_slot: Int[Array, "S Kb"]
  state_big_row: Int[Array, "S Kb"]
  set_bits: UInt32[Array, "Mb W"]
  state_small_tokens: Int[Array, "S N"]
  state_small_slot: Int[Array, "S N"]
  state_viable: UInt32[Array, "S Tw"]
  state_free: Bool[Array, "S"]
  state_end_item: Int[Array, "S"]
  eos_bits: UInt32[Array, "W"]
  action: Int[Array, "Q T"]
  action_bits: UInt32[Array, "Q Tw"]
  goto: Int[Array, "Q Nt"]
  rule_lhs: Int[Array, "R"]
  rule_len: Int[Array, "R"]
  # Static: they fix shapes (logits width, stack width).
  vocab_size: int = struct.field(pytree_node=False)
  stack_depth: int = struct.field(pytree_node=False)


def tables_from_arrays(arrays) -> LexedTables:
  """`LexedTables` (jax arrays) from a host `LexedArrays` (one grammar or stacked)."""
  fields = {f: jnp.asarray(getattr(arrays, f)) for f in arrays.ARRAY_FIELDS}
  return LexedTables(vocab_size=int(arrays.vocab_size),
                     stack_depth=int(arrays.stack_depth), **fields)


def init_state(tables: LexedTables, batch_size: int | None = None, *,
               constraint_ids: ArrayLike | None = None) -> ConstraintState:
  """The start state of each row: its grammar's lexer start, parser stack [start].

  Args:
    tables: Compiled (possibly stacked) tables.
    batch_size: Number of rows; may be omitted when `constraint_ids` is given.
    constraint_ids: Which stacked grammar each row follows (default: grammar 0),
      integers of shape `[B]` in [0, G); inside jit, an id out of range is clamped.

  Raises:
    DecodingArgumentError: as `_runtime.init_state`.
  """
  if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
      batch_size, (int, np.integer)) or batch_size < 1):
    raise DecodingArgumentError(f"init_state: batch_size {batch_size!r} is not a positive "
                                "int. Expected an int >= 1.")
  if constraint_ids is None:
    if batch_size is None:
      raise DecodingArgumentError(
          "init_state needs batch_size or constraint_ids. Expected one of them.")
    ids = jnp.zeros((int(batch_size),), jnp.int32)
  else:
    ids = _check_int_array("init_state", "constraint_ids", constraint_ids, (batch_size,),
                           int(jnp.shape(tables.lex_start)[0]),
                           "indices of stacked grammars")
    ids = jnp.clip(jnp.asarray(ids, jnp.int32), 0, jnp.shape(tables.lex_start)[0] - 1)
  b = ids.shape[0]
  return ConstraintState(
      state=jnp.asarray(tables.lex_start)[ids].astype(jnp.int32),
      stack=jnp.zeros((b, tables.stack_depth), jnp.int32).at[:, 0].set(
          jnp.asarray(tables.lr_start)[ids]),
      depth=jnp.ones((b,), jnp.int32),
      done=jnp.zeros((b,), bool), error=jnp.zeros((b,), bool))


def _run_lanes(tables: LexedTables, stack: Int[Array, "N D"], depth: Int[Array, "N"],
               items: Int[Array, "N L"]):
  """Runs the parser over each lane's lexemes: (ok [N], top [N], stack [N, D], depth [N]).

  A lane is ok when every lexeme is shifted: no error, no push past D.
  """
  n, d = stack.shape
  length = items.shape[1]
  count = jnp.sum(items >= 0, axis=1)
  lanes = jnp.arange(n)
  # Safety bound on micro-steps (canonical LR(1) tables of a grammar without cycles end
  # far sooner): per lexeme, at most D reductions that pop, each after a chain of at
  # most `Nt` that do not.
  max_steps = (length + 1) * (d + 1) * (tables.goto.shape[1] + 1)

  def cond(carry):
    i, _, _, err, step = carry
    # Some lane has lexemes left and no error, within the safety bound.
    return jnp.any((i < count) & ~err) & (step < max_steps)

  def body(carry):
    i, stack, depth, err, step = carry
    active = (i < count) & ~err
    cls = jnp.take_along_axis(items, jnp.minimum(i, length - 1)[:, None], axis=1)[:, 0]
    members = tables.class_members[jnp.maximum(cls, 0)]  # [N, M]
    top = stack[lanes, jnp.clip(depth - 1, 0, d - 1)]
    acts = jnp.where(members >= 0, tables.action[top[:, None], jnp.maximum(members, 0)], 0)
    has = acts != 0
    a = jnp.take_along_axis(acts, jnp.argmax(has, axis=1)[:, None], axis=1)[:, 0]
    shift = a > 0
    reduce = a < -1  # -1 is accept, only on $END, which no lexeme is.
    p = jnp.maximum(-a - 1, 0)
    base = depth - jnp.where(reduce, tables.rule_len[p], 0)
    below = stack[lanes, jnp.clip(base - 1, 0, d - 1)]
    target = jnp.where(shift, a - 1, tables.goto[below, tables.rule_lhs[p]])
    bad = active & (~(shift | reduce) | (base + 1 > d) | (target < 0))
    ok = active & ~bad
    stack = stack.at[lanes, jnp.where(ok, base, d)].set(target, mode="drop")
    return (jnp.where(ok & shift, i + 1, i), stack, jnp.where(ok, base + 1, depth),
            err | bad, step + 1)

  zero = jnp.zeros((n,), jnp.int32)
  i, stack, depth, err, _ = jax.lax.while_loop(
      cond, body, (zero, stack, depth, jnp.zeros((n,), bool), jnp.int32(0)))
  top = stack[lanes, jnp.clip(depth - 1, 0, d - 1)]
  return ~err & (i >= count), top, stack, depth


def _run_overlay(tables: LexedTables, state: ConstraintState, items: Int[Array, "B X L"]):
  """`_run_lanes` of X lanes per row, each on the row's own stack: (ok [B, X], top [B, X]).

  A lane does not copy its row's stack: it reads the row's `stack[:base]` (`base`
  shrinks as it pops below what it pushed) and keeps what it pushed in a suffix of
  P = min(D, 2 L + 8) entries, so a step costs O(P) per lane instead of O(D). A lane
  whose suffix would pass P (long chains of empty productions) stops; if any does,
  the rows are run again on full copies (`lax.cond`: only then), so the result is
  always exact.
  """
  b, x, length = items.shape
  d = state.stack.shape[1]
  p_width = min(d, 2 * length + 8)
  n = b * x
  items = items.reshape(n, length)
  row = jnp.repeat(jnp.arange(b), x)
  row_stack, row_depth = state.stack, state.depth
  count = jnp.sum(items >= 0, axis=1)
  lanes = jnp.arange(n)
  max_steps = (length + 1) * (d + 1) * (tables.goto.shape[1] + 1)

  def read(base, suffix, pos):
    own = jnp.take_along_axis(suffix, jnp.clip(pos - base, 0, p_width - 1)[:, None],
                              axis=1)[:, 0]
    return jnp.where(pos < base, row_stack[row, jnp.clip(pos, 0, d - 1)], own)

  def cond(carry):
    i, _, _, _, err, over, step = carry
    # Some lane has lexemes left, no error and room, within the safety bound.
    return jnp.any((i < count) & ~err & ~over) & (step < max_steps)

  def body(carry):
    i, base, suffix, size, err, over, step = carry
    active = (i < count) & ~err & ~over
    depth = base + size
    cls = jnp.take_along_axis(items, jnp.minimum(i, length - 1)[:, None], axis=1)[:, 0]
    members = tables.class_members[jnp.maximum(cls, 0)]  # [N, M]
    top = read(base, suffix, depth - 1)
    acts = jnp.where(members >= 0, tables.action[top[:, None], jnp.maximum(members, 0)], 0)
    has = acts != 0
    a = jnp.take_along_axis(acts, jnp.argmax(has, axis=1)[:, None], axis=1)[:, 0]
    shift = a > 0
    reduce = a < -1
    rule = jnp.maximum(-a - 1, 0)
    new = depth - jnp.where(reduce, tables.rule_len[rule], 0)  # where the push goes
    below = read(base, suffix, new - 1)
    target = jnp.where(shift, a - 1, tables.goto[below, tables.rule_lhs[rule]])
    new_base = jnp.minimum(base, new)
    slot = new - new_base
    bad = active & (~(shift | reduce) | (new + 1 > d) | (target < 0))
    no_room = active & ~bad & (slot >= p_width)
    ok = active & ~bad & ~no_room
    suffix = suffix.at[lanes, jnp.where(ok, slot, p_width)].set(target, mode="drop")
    return (jnp.where(ok & shift, i + 1, i), jnp.where(ok, new_base, base), suffix,
            jnp.where(ok, slot + 1, size), err | bad, over | no_room, step + 1)

  zero = jnp.zeros((n,), jnp.int32)
  false = jnp.zeros((n,), bool)
  init = (zero, row_depth[row], jnp.zeros((n, p_width), jnp.int32), zero, false, false,
          jnp.int32(0))
  i, base, suffix, size, err, over, _ = jax.lax.while_loop(cond, body, init)
  top = read(base, suffix, base + size - 1)
  ok = ~err & ~over & (i >= count)

  def full():
    ok, top, _, _ = _run_lanes(
        tables, jnp.broadcast_to(row_stack[:, None], (b, x, d)).reshape(-1, d),
        jnp.repeat(row_depth, x), items)
    return ok, top

  # The suffix was too short for some lane: run all lanes again on full stacks.
  ok, top = jax.lax.cond(jnp.any(over), full, lambda: (ok, top))
  return ok.reshape(b, x), top.reshape(b, x)


def _pending_ok(tables: LexedTables, top: Int[Array, "..."], final: Int[Array, "..."]):
  """Whether the lexeme pending in lexer state `final` can still end well after a lane
  that left parser state `top`: it can become an ignored lexeme (or is empty), or a
  terminal `top` has an action for (canonical LR(1): one that can come next)."""
  bits = tables.action_bits[top] & tables.state_viable[final]
  return tables.state_free[final] | jnp.any(bits != 0, axis=-1)


def _end_ok(tables: LexedTables, top: Int[Array, "..."]):
  """Whether parser state `top` has an action for `$END` (it accepts the end)."""
  return ((tables.action_bits[top, _END // 32] >> (_END % 32)) & 1) == 1


def _end_lane(tables: LexedTables, lex: Int[Array, "B"]):
  """(items [B, L], reachable [B]) of the end-of-sequence lane: the pending lexeme."""
  end_item = tables.state_end_item[lex]
  length = tables.seq_items.shape[1]
  items = jnp.full((lex.shape[0], length), -1, jnp.int32).at[:, 0].set(
      jnp.maximum(end_item, -1))
  return items, end_item != -2


def _sequence_items(tables: LexedTables, seq: Int[Array, "..."]):
  """Items [..., L] of sequence ids (-1: an empty lane)."""
  return jnp.where((seq >= 0)[..., None], tables.seq_items[jnp.maximum(seq, 0)], -1)


def _check_state(fn: str, tables: LexedTables, state) -> int:
  """The batch size of `state` if it is a `ConstraintState` of these tables (checked at
  trace time inside jit), else raises `DecodingArgumentError`."""
  if not isinstance(state, ConstraintState):
    raise DecodingArgumentError(
        f"{fn}: state is a {type(state).__name__}. Expected a ConstraintState (from "
        "_lexed.init_state).")
  shape = tuple(jnp.shape(state.state))
  want = shape + (tables.stack_depth,)
  if len(shape) != 1 or tuple(jnp.shape(state.stack)) != want:
    raise DecodingArgumentError(
        f"{fn}: state has rows {shape} and a stack {tuple(jnp.shape(state.stack))}. "
        f"Expected one batch axis and a stack of {tables.stack_depth} (these tables' "
        "stack_depth): a state made for other tables?")
  return shape[0]


def allowed_bits(tables: LexedTables, state: ConstraintState) -> UInt32[Array, "B W"]:
  """Each row's allowed tokens, packed: token t is bit t % 32 of word t // 32.

  Rows `done` or in `error` allow only end of sequence (as `_runtime.py`).

  Raises:
    DecodingArgumentError: `state` does not fit `tables` (at trace time inside jit).
  """
  _check_state("allowed_bits", tables, state)
  b, d = state.stack.shape
  slots = tables.state_outcomes[state.state]  # [B, K]
  # One lane per distinct sequence of the state, and one for the end of sequence.
  seq_items = _sequence_items(tables, tables.state_seq_lanes[state.state])  # [B, Ks, L]
  end_items, end_reach = _end_lane(tables, state.state)
  items = jnp.concatenate([seq_items, end_items[:, None]], axis=1)
  ok, top = _run_overlay(tables, state, items)
  end_ok = ok[:, -1] & end_reach & _end_ok(tables, top[:, -1])
  # Each slot: its sequence's lane, then the lexeme left pending in its final state.
  lane = jnp.maximum(tables.state_slot_lane[state.state], 0)  # [B, K]
  final = tables.outcome_final[jnp.maximum(slots, 0)]
  slot_ok = (slots >= 0) & jnp.take_along_axis(ok, lane, axis=1) & _pending_ok(
      tables, jnp.take_along_axis(top, lane, axis=1), final)
  # Bitmap slots: OR of their rows.
  big = tables.state_big_slot[state.state]  # [B, Kb]
  big_ok = (big >= 0) & jnp.take_along_axis(slot_ok, jnp.maximum(big, 0), axis=1)
  rows = tables.set_bits[jnp.maximum(tables.state_big_row[state.state], 0)]  # [B, Kb, W]
  words = jax.lax.reduce(jnp.where(big_ok[..., None], rows, jnp.uint32(0)), jnp.uint32(0),
                         jax.lax.bitwise_or, (1,))
  # Listed tokens: distinct within a state and outside its bitmap slots, so adding their
  # bits into the words sets them.
  toks = tables.state_small_tokens[state.state]  # [B, N]
  small = tables.state_small_slot[state.state]
  small_ok = (small >= 0) & jnp.take_along_axis(slot_ok, jnp.maximum(small, 0), axis=1)
  value = jnp.where(small_ok, jnp.uint32(1) << (toks & 31).astype(jnp.uint32),
                    jnp.uint32(0))
  row_ids = jnp.broadcast_to(jnp.arange(b)[:, None], toks.shape)
  words = words.at[row_ids, jnp.where(small_ok, toks >> 5, 0)].add(value)
  words |= jnp.where(end_ok[:, None], tables.eos_bits[None, :], jnp.uint32(0))
  stopped = (state.done | state.error)[:, None]
  return jnp.where(stopped, tables.eos_bits[None, :], words)


def allowed_tokens(tables: LexedTables, state: ConstraintState) -> Bool[Array, "B V"]:
  """Which tokens each row may produce next (`allowed_bits`, unpacked)."""
  bits = allowed_bits(tables, state)
  shifts = jnp.arange(32, dtype=jnp.uint32)
  unpacked = ((bits[:, :, None] >> shifts) & 1).astype(bool)
  return unpacked.reshape(bits.shape[0], -1)[:, :tables.vocab_size]


def _find_slot(tables: LexedTables, lex: Int[Array, "B"], tokens: Int[Array, "B"]):
  """The outcome slot of each row's token in its lexer state, -1 if dead there."""
  listed = tables.state_small_tokens[lex]  # [B, N], ascending, padded with V
  pos = jax.vmap(jnp.searchsorted)(listed, tokens)
  pos = jnp.minimum(pos, listed.shape[1] - 1)
  hit = jnp.take_along_axis(listed, pos[:, None], axis=1)[:, 0] == tokens
  small_slot = jnp.take_along_axis(tables.state_small_slot[lex], pos[:, None], axis=1)[:, 0]
  rows = tables.state_big_row[lex]  # [B, Kb]
  word = tables.set_bits[jnp.maximum(rows, 0), (tokens >> 5)[:, None]]
  in_big = (rows >= 0) & (((word >> (tokens & 31).astype(jnp.uint32)[:, None]) & 1) == 1)
  big_slot = jnp.take_along_axis(tables.state_big_slot[lex],
                                 jnp.argmax(in_big, axis=1)[:, None], axis=1)[:, 0]
  return jnp.where(hit & (small_slot >= 0), small_slot,
                   jnp.where(in_big.any(axis=1), big_slot, -1))


def advance(tables: LexedTables, state: ConstraintState,
            tokens: ArrayLike) -> ConstraintState:
  """Consumes one token per row, exactly when `allowed_bits` offers it.

  An allowed end-of-sequence token sets `done`; any token not allowed (or, inside jit,
  out of [0, vocab_size)) sets the sticky `error` and leaves the row as it was. Rows
  already `done` or in `error` ignore their token.

  Raises:
    DecodingArgumentError: `tokens` is not an integer array of shape `[B]`, or (values
      known, outside jit) holds an id outside [0, vocab_size); `state` does not fit
      `tables`. As `_runtime.advance`.
  """
  batch = _check_state("advance", tables, state)
  tokens = _check_int_array("advance", "tokens", tokens, (batch,), tables.vocab_size,
                            "token ids")
  b, d = state.stack.shape
  tokens = jnp.asarray(tokens, jnp.int32)
  in_range = (tokens >= 0) & (tokens < tables.vocab_size)
  safe = jnp.where(in_range, tokens, 0)
  is_eos = in_range & (((tables.eos_bits[safe >> 5] >> (safe & 31).astype(jnp.uint32))
                        & 1) == 1)
  slot = jnp.where(in_range & ~is_eos, _find_slot(tables, state.state, safe), -1)
  outcome = jnp.where(
      slot >= 0,
      jnp.take_along_axis(tables.state_outcomes[state.state], jnp.maximum(slot, 0)[:, None],
                          axis=1)[:, 0], -1)
  o = jnp.maximum(outcome, 0)
  items = _sequence_items(tables, jnp.where(outcome >= 0, tables.outcome_seq[o], -1))
  final = tables.outcome_final[o]
  end_items, end_reach = _end_lane(tables, state.state)
  ok, top, stack, depth = _run_lanes(
      tables, jnp.concatenate([state.stack, state.stack]),
      jnp.concatenate([state.depth, state.depth]), jnp.concatenate([items, end_items]))
  moved = ok[:b] & (outcome >= 0) & _pending_ok(tables, top[:b], final)
  end = is_eos & ok[b:] & end_reach & _end_ok(tables, top[b:])
  active = ~(state.done | state.error)
  take = active & moved
  return state.replace(
      state=jnp.where(take, final, state.state),
      stack=jnp.where(take[:, None], stack[:b], state.stack),
      depth=jnp.where(take, depth[:b], state.depth),
      done=state.done | (active & end),
      error=state.error | (active & ~moved & ~end))
