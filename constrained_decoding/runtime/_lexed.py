"""Device step of grammars with a lexer: lexer-state x token table + LR parser (issue 18).

Increment 3 of docs/lexer_runtime.md. `LexedTables` holds the arrays that
`constraints/_lexed_grammar.compile_lexed_grammar` builds on the host; the functions
here step them inside `jax.jit` (static shapes, `lax.while_loop`, no host callbacks).
The lanes (the parser's micro-steps, the CPU work queue and the lane schedule's
settings `LANE_*`, `PREFIX_POOL`) are in `_lexed_lanes.py`; this module builds each
row's lanes and turns their results into masks and next states.
The row state is `runtime.ConstraintState`: `state` is the lexer state, `stack[B, D]`
the LR parser's states (bottom first, `depth[B]` in use; the bottom is the grammar's
parser start state), `registers[B, 2 + Di]` the bracket depth, the number of
indentation levels and their widths (Python's INDENT/DEDENT, `Indentation`; Di = 1
and unused without it), `done` and the sticky `error` as in `_runtime.py`.

One step of a row in lexer state s:

* the token's *outcome class* (per lexer state, the tokens with the same completed
  lexeme sequence and final lexer state) gives the lexemes it completes (at most L) and
  the lexer state f it leaves;
* a *lane* runs the parser over those lexemes on a copy of the row's stack: each lexeme
  is the first terminal of its class the top state has an action for; reductions
  (pop `rule_len`, push `goto`, then the unit reductions that follow, as one) until it
  shifts, all in one `lax.while_loop` of
  micro-steps (one reduce or shift per lane and iteration, or a reduce and the shift
  of the same lexeme that follows it) over every lane at once;
* the lane survives when no lexeme is an error, the stack never passes D, and the
  lexeme pending in f can still become an ignored lexeme or a terminal the final top
  state has an action for (canonical LR(1): an action means the terminal can come next);
* end of sequence is one more lane: the lexeme pending in s (if it is complete), then
  `$END`.

`allowed_bits` runs one lane per distinct item sequence of the row's lexer state (Ks,
padded; outcome classes that differ only in their final state share a lane) plus the
end lane; each of the state's K outcome slots then takes its lane's result and checks
its pending lexeme against the lane's top state. Lanes do not copy the row's stack:
they read it and keep only what they push (up to D entries, so one run is exact; a
shorter suffix with a rerun on full stacks under `lax.cond` compiled the lane loop a
second time for no faster a step). The mask ORs the surviving slots' token sets: a gather
of the few bitmap slots' rows (Kb rows of W words) and a scatter-add of the listed
tokens (N per state; tokens of a state are distinct, so adding bits is OR-ing them).
`advance` finds the token's slot (a binary search of the state's listed tokens, one bit
per bitmap slot), runs its lane and the end lane on full stacks, and takes the token
exactly when `allowed_bits` offers it (same lanes, same tables).

Cost per row and step (exact, simple; the design's viable-set classes are not built):
`allowed_bits` runs Ks + 1 lanes, one micro-step (a reduce, a
shift, a reduce and the shift after it, or an indentation decision: ~25 gathers) at a
time. On CPU (`LANE_POOL`) they
run as a work queue, so the cost is the micro-steps the lanes take (Python with Gemma
3: ~4 per lane on average), and where lanes outnumber the queue's slots 8 to 1 (batch
8 and up) each row first runs each distinct prefix (first two lexemes) of its lexer
state's lanes once and its lanes start after it (`_after_prefix`: Python's micro-steps
2,139 -> ~475 a row, 175 of them in the prefixes);
off CPU all lanes run in one loop for as many iterations as
the longest lane (Python: 17 median), fewest launches. Then
Kb x W words of OR and N scattered ids. `advance`: log2(N) + Kb gathers, then 2 lanes
of O(D). Ks, K, N, Kb, L are maxima over lexer states, so every row pays the worst
state's widths.

Measured step costs against the flat JSON grammar's (`benchmarks/lexed_step.py`, Gemma
3; on CPU and an H200) and what was tried: docs/lexer_runtime.md, "Lane schedule".

Approximation: a pending lexeme counts as fine when it can still become an ignored
lexeme or a terminal the parser takes next; whether the text after that terminal can
start without extending it (longest match) is not checked. Grammars whose terminals
are separated by an `%ignore`d one (whitespace) never meet the difference.

Several grammars stack into one table set (`_lexed_grammar.stack_lexed_arrays`, rows
pick theirs by `init_state(..., constraint_ids=)`); not with `ConstraintTables` of the
flat runtime. Indentation (`_lanes`, docs/lexer_runtime.md "Python: INDENT/DEDENT"): a
newline lexeme's class carries its width; lanes feed NEWLINE / INDENT / DEDENT and keep
their own pushed widths; a pending newline that needs an INDENT is refused when the
indentation stack is full. Not yet: `rewind`, parser-stack-aware masks (near the stack
bound a row may be left with only tokens that would overflow: they are refused, so a
walk can dead-end within a few tokens of D; pick D above the nesting the text needs).

Public:
  LexedTables, tables_from_arrays(arrays)   the device tables.
  init_state(tables, batch_size, constraint_ids=)   the start state of each row.
  allowed_bits / allowed_tokens(tables, state)   packed uint32 [B, W] / bool [B, V].
  advance(tables, state, tokens)            consume one token per row.
  allowed_bits_and_advance(tables, state)   both from one run of the lanes (the decode
                                            loop's step; on CPU at large batches the
                                            mask, then `advance`: FUSED_LANES_MAX).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike
from jaxtyping import Array, Bool, Int, UInt32

from constrained_decoding.errors import DecodingArgumentError
from constrained_decoding.lexed_tables import LexedTables
from constrained_decoding.lexed_tables import lexed_tables_from_arrays
from constrained_decoding.runtime._lexed_lanes import _NEWLINE
from constrained_decoding.runtime._lexed_lanes import _lanes
from constrained_decoding.runtime._lexed_lanes import _materialize
from constrained_decoding.runtime._lexed_lanes import _per_platform
from constrained_decoding.runtime._runtime import ConstraintState
from constrained_decoding.runtime._runtime import _check_int_array

_END = 0  # The parser terminal id of `$END`.

# `jnp.searchsorted` method for `advance`'s listed tokens: its default ("scan") is a
# loop of log2(N) iterations, each a kernel launch and read-back on a GPU.
SEARCH_METHOD = {"cpu": "scan", "default": "scan_unrolled"}
# The CPU-only form of `allowed_bits`' slot check (the plain one off CPU, not yet timed
# there): packed words (`_slot_ok_packed`: Python's mask without lanes 3.5 -> 1.6 ms at
# batch 64).
SLOT_CHECK_PACKED = {"cpu": True, "default": False}
# `allowed_bits_and_advance` keeps every lane's pushes ([B x (Ks + 1), D] int32) so that
# `step` can take the sampled lane's stack. Above this many entries (static; by
# `jax.default_backend()`, None: never), the mask runs as `allowed_bits` (the CPU queue
# keeps pushes per slot) and `step` as `advance` (two lanes a row in one loop). CPU
# median, Gemma 3: Go at batch 64 (3.5M entries) 6.71 -> 5.54 ms, Python at 64 7.49 ->
# 7.13; Python at batch 8 (0.34M) is faster fused (1.15 against 1.20). Off CPU the
# fused step saves a loop's launches.
FUSED_LANES_MAX = {"cpu": 2**20, "default": None}


def tables_from_arrays(arrays) -> LexedTables:
  """`LexedTables` (jax arrays) from a host `LexedArrays` (one grammar or stacked)."""
  fingerprint = getattr(arrays.vocab, "fingerprint", "") or ""
  return jax.tree_util.tree_map(
      jnp.asarray, lexed_tables_from_arrays(arrays, vocab_fingerprint=fingerprint))


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
      done=jnp.zeros((b,), bool), error=jnp.zeros((b,), bool),
      # [bracket depth, indentation levels, widths]: one level, width 0.
      registers=jnp.zeros((b, 2 + tables.indent_depth), jnp.int32).at[:, 1].set(1))


def _pending_ok(tables: LexedTables, top, final, paren, room):
  """Whether the lexeme pending in lexer state `final` can still end well after a lane
  that left parser state `top`, bracket depth `paren` and indentation `room`: it can
  become an ignored lexeme (or is empty), or a terminal `top` has an action for
  (canonical LR(1): one that can come next), or a newline lexeme: dropped inside
  brackets; outside, one `top` takes, with room for the INDENT it may need."""
  bits = tables.action_bits[top] & tables.state_viable[final]
  nl = ((tables.action_bits[top, _NEWLINE // 32] >> (_NEWLINE % 32)) & 1) == 1
  newline = jnp.where(paren > 0, tables.state_nl_any[final],
                      tables.state_nl_width[final] & nl
                      & (~tables.nl_needs_indent[top] | room))
  return tables.state_free[final] | jnp.any(bits != 0, axis=-1) | newline


def _slot_ok_packed(tables: LexedTables, lanes: dict, lane, final):
  """Each slot's lane ok and `_pending_ok`, as one AND of words: per lane [B, X] the
  action bits of its top state (zero if it failed) and flags (ok; ok in brackets; ok
  outside with a newline it can take); per final lexer state its viable terminals and
  flags (free; a newline in brackets; one outside). Same cases, 4 + 4 gathered words a
  slot instead of ~15 gathers, and a reduction, which XLA materializes (it fused the
  plain check into the listed tokens' gather: 1.7 of Python's 3.8 ms at batch 64)."""
  ok, top, paren, room = (lanes[k] for k in ("ok", "top", "paren", "room"))
  nl = ((tables.action_bits[top, _NEWLINE // 32] >> (_NEWLINE % 32)) & 1) == 1
  nl_out = nl & (~tables.nl_needs_indent[top] | room)
  flags = (ok.astype(jnp.uint32) | ((ok & (paren > 0)).astype(jnp.uint32) << 1)
           | ((ok & (paren <= 0) & nl_out).astype(jnp.uint32) << 2))
  lane_words = jnp.concatenate(
      [jnp.where(ok[..., None], tables.action_bits[top], jnp.uint32(0)), flags[..., None]],
      axis=-1)  # [B, X, Tw + 1]
  final_flags = (tables.state_free.astype(jnp.uint32)
                 | (tables.state_nl_any.astype(jnp.uint32) << 1)
                 | (tables.state_nl_width.astype(jnp.uint32) << 2))
  final_words = jnp.concatenate([tables.state_viable, final_flags[:, None]], axis=1)
  picked = jnp.take_along_axis(lane_words, lane[..., None], axis=1)  # [B, K, Tw + 1]
  return jnp.any((picked & final_words[final]) != 0, axis=-1)


def _end_ok(tables: LexedTables, top: Int[Array, "..."]):
  """Whether parser state `top` has an action for `$END` (it accepts the end)."""
  return ((tables.action_bits[top, _END // 32] >> (_END % 32)) & 1) == 1


def _end_lane(tables: LexedTables, lex: Int[Array, "B"], length: int):
  """(items [B, length], reachable [B]) of the end-of-sequence lane: the pending
  lexeme, then the end's newline of an indentation grammar."""
  end_item = jnp.maximum(tables.state_end_item[lex], -1)
  tail = tables.state_end_tail[lex]
  first = jnp.where(end_item >= 0, end_item, tail)
  second = jnp.where(end_item >= 0, tail, -1)
  items = jnp.full((lex.shape[0], length), -1, jnp.int32).at[:, 0].set(first).at[:, 1].set(
      second)
  return items, tables.state_end_item[lex] != -2


def _lane_width(tables: LexedTables) -> int:
  """Items per lane: the longest sequence, and 2 for the end lane."""
  return max(tables.seq_items.shape[1], 2)


def _sequence_items(tables: LexedTables, seq: Int[Array, "..."]):
  """Items [..., L'] of sequence ids (-1: an empty lane), L' = `_lane_width`."""
  items = jnp.where((seq >= 0)[..., None], tables.seq_items[jnp.maximum(seq, 0)], -1)
  pad = _lane_width(tables) - items.shape[-1]
  return jnp.pad(items, [(0, 0)] * (items.ndim - 1) + [(0, pad)], constant_values=-1)


def _check_state(fn: str, tables: LexedTables, state) -> int:
  """The batch size of `state` if it is a `ConstraintState` of these tables (checked at
  trace time inside jit), else raises `DecodingArgumentError`."""
  if not isinstance(state, ConstraintState):
    raise DecodingArgumentError(
        f"{fn}: state is a {type(state).__name__}. Expected a ConstraintState (from "
        "_lexed.init_state).")
  shape = tuple(jnp.shape(state.state))
  want = shape + (tables.stack_depth,)
  regs = None if state.registers is None else tuple(jnp.shape(state.registers))
  if (len(shape) != 1 or tuple(jnp.shape(state.stack)) != want
      or regs != shape + (2 + tables.indent_depth,)):
    raise DecodingArgumentError(
        f"{fn}: state has rows {shape}, a stack {tuple(jnp.shape(state.stack))} and "
        f"registers {regs}. Expected one batch axis, a stack of {tables.stack_depth} "
        f"(these tables' stack_depth) and {2 + tables.indent_depth} registers (bracket "
        "depth, indentation levels and widths): a state made for other tables? Use "
        "_lexed.init_state.")
  return shape[0]


def allowed_bits(tables: LexedTables, state: ConstraintState) -> UInt32[Array, "B W"]:
  """Each row's allowed tokens, packed: token t is bit t % 32 of word t // 32.

  Rows `done` or in `error` allow only end of sequence (as `_runtime.py`).

  Raises:
    DecodingArgumentError: `state` does not fit `tables` (at trace time inside jit).
  """
  _check_state("allowed_bits", tables, state)
  return _bits_of_lanes(tables, state, _state_lanes(tables, state, stacks=False))


def _state_lanes(tables: LexedTables, state: ConstraintState, stacks: bool = True) -> dict:
  """`_lanes` of each row's lexer state: one per distinct sequence of the state, then
  one for the end of sequence; each value [B, Ks + 1, ...] (the lanes' stacks only
  with `stacks`: `allowed_bits` reads their top states)."""
  b = state.stack.shape[0]
  seq_items = _sequence_items(tables, tables.state_seq_lanes[state.state])  # [B, Ks, L]
  end_items, _ = _end_lane(tables, state.state, _lane_width(tables))
  items = jnp.concatenate([seq_items, end_items[:, None]], axis=1)
  prefixes = None
  if tables.state_prefix_items is not None:  # Static: the lanes share prefixes.
    lane_prefix = tables.state_lane_prefix[state.state]
    prefixes = (tables.state_prefix_items[state.state],
                jnp.pad(lane_prefix, [(0, 0), (0, 1)], constant_values=-1))  # end lane: own
  lanes = _lanes(tables, state, items, prefixes, stacks=stacks)
  return {k: v.reshape(b, -1, *v.shape[1:]) for k, v in lanes.items() if k != "steps"}


def _bits_of_lanes(tables: LexedTables, state: ConstraintState, lanes: dict):
  """`allowed_bits` from the rows' `_state_lanes`."""
  b = state.stack.shape[0]
  slots = tables.state_outcomes[state.state]  # [B, K]
  end_reach = tables.state_end_item[state.state] != -2
  ok, top, paren, room = (lanes[k] for k in ("ok", "top", "paren", "room"))
  end_ok = ok[:, -1] & end_reach & _end_ok(tables, top[:, -1])
  # Each slot: its sequence's lane, then the lexeme left pending in its final state.
  lane = jnp.maximum(tables.state_slot_lane[state.state], 0)  # [B, K]
  final = tables.outcome_final[jnp.maximum(slots, 0)]

  def slot_check(packed):
    if packed:
      return _slot_ok_packed(tables, lanes, lane, final)
    pick = lambda v: jnp.take_along_axis(v, lane, axis=1)
    return pick(ok) & _pending_ok(tables, pick(top), final, pick(paren), pick(room))

  slot_ok = (slots >= 0) & _per_platform(slot_check, SLOT_CHECK_PACKED)
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
  search = lambda method, listed, tokens: jax.vmap(
      lambda a, v: jnp.searchsorted(a, v, method=method))(listed, tokens)
  pos = _per_platform(search, SEARCH_METHOD, listed, tokens)
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
  b = state.stack.shape[0]
  is_eos, _, outcome = _token_outcome(tables, state, tokens)
  items = _sequence_items(
      tables, jnp.where(outcome >= 0, tables.outcome_seq[jnp.maximum(outcome, 0)], -1))
  end_items, _ = _end_lane(tables, state.state, _lane_width(tables))
  # Two lanes per row: the token's lexemes, and the end of sequence.
  lanes = _lanes(tables, state, jnp.stack([items, end_items], axis=1))
  lanes = {k: v.reshape(b, 2, *v.shape[1:]) for k, v in lanes.items() if k != "steps"}
  return _take_lane(tables, state, is_eos, outcome, {k: v[:, 0] for k, v in lanes.items()},
                    {k: v[:, 1] for k, v in lanes.items()})


def allowed_bits_and_advance(tables: LexedTables, state: ConstraintState):
  """`(allowed_bits(tables, state), step)` where `step(tokens)` equals
  `advance(tables, state, tokens)`, from one run of the lanes.

  A token's lexemes are the sequence of one of its lexer state's lanes (the lane its
  outcome slot takes in `allowed_bits`), and the end of sequence is the last lane, so
  `step` picks those lanes' results instead of running the parser again: a decode step
  (mask, sample, advance) compiles and runs the lanes' loop once, not twice. Where the
  lanes' pushes would be many (`FUSED_LANES_MAX`: on CPU from batch 64 with Gemma 3)
  it is `allowed_bits`, and `step` is `advance`.

  Raises:
    DecodingArgumentError: as `allowed_bits`; `step` as `advance`.
  """
  batch = _check_state("allowed_bits", tables, state)
  limit = FUSED_LANES_MAX.get(jax.default_backend(), FUSED_LANES_MAX["default"])
  if limit is not None and batch * (tables.state_seq_lanes.shape[1] + 1) * (
      tables.stack_depth) > limit:  # too many pushes to keep: the mask, then `advance`
    return allowed_bits(tables, state), lambda tokens: advance(tables, state, tokens)
  lanes = _state_lanes(tables, state)

  def step(tokens: ArrayLike) -> ConstraintState:
    tokens = _check_int_array("advance", "tokens", tokens, (batch,), tables.vocab_size,
                              "token ids")
    is_eos, slot, outcome = _token_outcome(tables, state, tokens)
    lane = jnp.take_along_axis(tables.state_slot_lane[state.state],
                               jnp.maximum(slot, 0)[:, None], axis=1)[:, 0]
    rows = jnp.arange(batch)
    token_lane = {k: v[rows, jnp.maximum(lane, 0)] for k, v in lanes.items()}
    return _take_lane(tables, state, is_eos, outcome, token_lane,
                      {k: v[:, -1] for k, v in lanes.items()})

  return _bits_of_lanes(tables, state, lanes), step


def _token_outcome(tables: LexedTables, state: ConstraintState, tokens):
  """(is_eos, slot, outcome) [B] of each row's token in its lexer state: slot and
  outcome -1 for an end of sequence or a token dead there (or out of range)."""
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
  return is_eos, slot, outcome


def _take_lane(tables: LexedTables, state: ConstraintState, is_eos, outcome, pick: dict,
               end_lane: dict) -> ConstraintState:
  """The rows after their token: `pick` is the lane of its lexemes, `end_lane` the end
  of sequence's (each a dict of [B, ...] `_lanes` results)."""
  b = state.stack.shape[0]
  final = tables.outcome_final[jnp.maximum(outcome, 0)]
  end_reach = tables.state_end_item[state.state] != -2
  moved = pick["ok"] & (outcome >= 0) & _pending_ok(tables, pick["top"], final,
                                                    pick["paren"], pick["room"])
  end = is_eos & end_lane["ok"] & end_reach & _end_ok(tables, end_lane["top"])
  active = ~(state.done | state.error)
  take = active & moved
  stack, widths = _materialize(state, pick, jnp.arange(b))
  registers = jnp.concatenate(
      [pick["paren"][:, None], (pick["ibase"] + pick["isize"])[:, None], widths], axis=1)
  return state.replace(
      state=jnp.where(take, final, state.state),
      stack=jnp.where(take[:, None], stack, state.stack),
      depth=jnp.where(take, pick["base"] + pick["size"], state.depth),
      registers=jnp.where(take[:, None], registers, state.registers),
      done=state.done | (active & end),
      error=state.error | (active & ~moved & ~end))
