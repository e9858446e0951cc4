"""Device step of grammars with a lexer: lexer-state x token table + LR parser (issue 18).

Increment 3 of docs/lexer_runtime.md. `LexedTables` holds the arrays that
`constraints/_lexed_grammar.compile_lexed_grammar` builds on the host; the functions
here step them inside `jax.jit` (static shapes, `lax.while_loop`, no host callbacks).
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
they read it and keep only what they push (up to D entries, so one run is exact; a
shorter suffix with a rerun on full stacks under `lax.cond` compiled the lane loop a
second time for no faster a step). The mask ORs the surviving slots' token sets: a gather
of the few bitmap slots' rows (Kb rows of W words) and a scatter-add of the listed
tokens (N per state; tokens of a state are distinct, so adding bits is OR-ing them).
`advance` finds the token's slot (a binary search of the state's listed tokens, one bit
per bitmap slot), runs its lane and the end lane on full stacks, and takes the token
exactly when `allowed_bits` offers it (same lanes, same tables).

Cost per row and step (exact, simple; the design's viable-set classes and prefix-shared
lanes are not built): `allowed_bits` runs Ks + 1 lanes, one micro-step (a reduce, a
shift or an indentation decision: ~25 gathers) at a time. On CPU (`LANE_POOL`) they
run as a work queue, so the cost is the micro-steps the lanes take (Python with Gemma
3: ~4 per lane on average), and where lanes outnumber the queue's slots 8 to 1 (batch
8 and up) each row first runs each distinct first lexeme of its lexer state once and
its lanes start after it (`_after_first`: Python's micro-steps 2,144 -> ~900 a row);
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
                                            loop's step).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike
from jaxtyping import Array, Bool, Int, UInt32

from constrained_decoding.errors import DecodingArgumentError
from constrained_decoding.lexed_tables import LexedTables
from constrained_decoding.lexed_tables import lexed_tables_from_arrays
from constrained_decoding.runtime._runtime import ConstraintState
from constrained_decoding.runtime._runtime import _check_int_array

_END = 0  # The parser terminal id of `$END`.
# Parser terminal ids of the newline, INDENT, DEDENT in an indentation grammar, and the
# `class_width` codes (as `constraints/_lexed_grammar.py`, a host module).
_NEWLINE, _INDENT, _DEDENT = 1, 2, 3
_WIDTH_NONE, _WIDTH_BAD, _WIDTH_EOF = -1, -2, -3

# Per platform (`lax.platform_dependent` keys): micro-steps per iteration of the lanes'
# `while_loop`, and whether lanes write their stacks by select instead of scatter. On a
# GPU each iteration of a while loop costs kernel launches and a read-back of its
# predicate (the flat runtime's edge search lost 0.25-0.38 ms a step to ~20 of them on
# an H200), and a scatter is a kernel of its own; Python's mask takes a median of 17
# micro-steps with Gemma 3 (Go's 29, SQL's 5), so 4 an iteration, with selects fused
# into the rest, cut its iterations to ~5. Not yet timed on a GPU: the H200 baseline of
# one micro-step an iteration is in benchmarks/results/lexed_step_h200.json (Python 1.5
# ms a step at batch 1, 2.1 ms at 64); `benchmarks/lexed_step.py --kit` times this. On
# CPU one micro-step and scatters are cheapest (a select writes every column).
LANE_UNROLL = {"cpu": 1, "default": 4}
LANE_SELECT_WRITES = {"cpu": False, "default": True}
# `jnp.searchsorted` method for `advance`'s listed tokens: its default ("scan") is a
# loop of log2(N) iterations, each a kernel launch and read-back on a GPU.
SEARCH_METHOD = {"cpu": "scan", "default": "scan_unrolled"}
# Lane schedule (`_lanes`): 0 runs every lane in one loop until the longest is done; n > 0
# runs them as a work queue of n x ceil(sqrt(B)) slots (B rows). On CPU the cost is the
# micro-steps done, and most lanes end within a few (Python with Gemma 3: 4.1 on
# average, the longest 17-32), so the queue does a fraction of them; fewer slots mean
# more iterations, each with a fixed cost (best measured: 128 slots at B = 1, 512 at
# 8, 1,024-2,048 at 64). On a GPU the cost is the loop's iterations (launches), which
# the one loop keeps fewest.
LANE_POOL = {"cpu": 128, "default": 0}
# The CPU-only form of `allowed_bits`' slot check (the plain one off CPU, not yet timed
# there): packed words (`_slot_ok_packed`: Python's mask without lanes 3.5 -> 1.6 ms at
# batch 64).
SLOT_CHECK_PACKED = {"cpu": True, "default": False}
# In the queue, lanes start after their first lexeme, run once per row and distinct
# first lexeme (`_after_first`): the pushed entries of that run copied to each lane.
# (Lanes share first lexemes only where they outnumber the slots _SHARE_FROM to 1: it
# cuts the queue's work, not its tail (the longest lane), and costs a loop of its own;
# Python with Gemma 3 at batch 1 (5 lanes a slot) was 0.64 -> 0.72 ms with it, at 64
# (41 a slot) 18.4 -> 14.6 ms: docs/lexer_runtime.md "Lane schedule".) First lexemes
# run in a queue of FIRST_SLOTS a row (Python: F = 37 columns, ~2.5 used a row).
_FIRST_COLUMNS = 4
FIRST_SLOTS = 2
_SHARE_FROM = 8


def _per_platform(fn, table: dict, *operands):
  """`fn(value, *operands)` with this platform's value from `table`."""
  return jax.lax.platform_dependent(
      *operands, **{platform: (lambda v: lambda *ops: fn(v, *ops))(value)
                    for platform, value in table.items()})


def _write_column(a, col, value, select: bool):
  """`a` [N, P] with `a[i, col[i]] = value[i]` where `col[i] < P` (else unchanged)."""
  if select:
    return jnp.where(jnp.arange(a.shape[1])[None, :] == col[:, None], value[:, None], a)
  return a.at[jnp.arange(a.shape[0]), col].set(value, mode="drop")


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


def _registers(tables: LexedTables, state: ConstraintState) -> Int[Array, "B R"]:
  """The row's indentation registers: [bracket depth, levels, widths (Di)]."""
  return state.registers


def _lanes(tables: LexedTables, state: ConstraintState, items: Int[Array, "B X L"],
           first: tuple | None = None, queue_slots: int = 0):
  """Runs the parser over each lane's lexemes, X lanes per row on the row's own stacks.

  A lane does not copy its row's stacks: it reads the row's `stack[:base]` (`base`
  shrinks as it pops below what it pushed) and keeps what it pushes in a suffix of D
  entries (the same for the indentation stack, whose suffix holds at most one push per
  lexeme), so it never runs out of room. (A shorter suffix with a rerun on full stacks
  under `lax.cond` when a lane overflowed it was no faster a step, and compiled the
  loop twice: docs/lexer_runtime.md "Time to first token".)

  A newline lexeme (`class_width` >= 0) is dropped inside brackets; outside, it feeds
  the newline terminal (phase 0 -> 1), then compares its width w with the top of the
  indentation stack: above: INDENT and a push (only from phase 1: after a DEDENT it is
  "unindent does not match", an error), equal: done, below: DEDENT and a pop (phase 2).
  The end-of-text class feeds the newline only where the parser takes one, then
  dedents to width 0. A lexeme of any other class shifts the first member the top
  state has an action for and moves the bracket depth. One micro-step: one reduce,
  shift or indentation decision per lane.

  Two schedules of the same micro-steps (`LANE_POOL`): every lane in one `while_loop`
  until the longest is done, or (pool > 0) a work queue: slots take the rows' lanes
  that have lexemes in turn and pass to the next lane when theirs ends. Most lanes end
  within a few micro-steps (Python with Gemma 3: 4.1 on average against 17 iterations
  of the whole-lane loop), so the queue does a fraction of the micro-steps.

  Returns:
    A dict of [B * X] arrays: ok (every lexeme taken), top (parser state),
    paren (bracket depth), room (the indentation stack can take one more level), and
    base, suffix, size, ibase, isuf, isize (the stacks, for `_materialize`).
  """
  b, x, length = items.shape
  d = p_width = state.stack.shape[1]
  regs = _registers(tables, state)
  di = regs.shape[1] - 2
  indent = di > 1  # Static: tables without indentation skip its steps.
  pi = max(min(di, length), 1)
  n = b * x
  items = items.reshape(n, length)
  row = jnp.repeat(jnp.arange(b), x)
  row_stack, row_widths = state.stack, regs[:, 2:]
  count = jnp.sum(items >= 0, axis=1)
  # Safety bound on micro-steps (canonical LR(1) tables of a grammar without cycles end
  # far sooner): per lexeme, at most D reductions that pop, each after a chain of at
  # most `Nt` that do not, and the indentation steps.
  max_steps = (length + 1) * (d + di + 3) * (tables.goto_id.shape[1] + 1)

  # `lane`: the lanes' rows of `items`, `suffix`, `isuf` for each slot of the queue, or
  # None for every lane in order (the one-pass loop, which keeps its plain forms: on an
  # H200 indexing by an iota instead cost Python's step 5%).
  def at(a, lane, col):
    if lane is None:
      return jnp.take_along_axis(a, col[:, None], axis=1)[:, 0]
    return a[lane, col]

  def row_of(lane):
    return row if lane is None else row[lane]

  def read(lane, base, suffix, pos):
    own = at(suffix, lane, jnp.clip(pos - base, 0, p_width - 1))
    return jnp.where(pos < base, row_stack[row_of(lane), jnp.clip(pos, 0, d - 1)], own)

  def itop_of(lane, ibase, isuf, isize):
    own = at(isuf, lane, jnp.clip(isize - 1, 0, pi - 1))
    return jnp.where(isize > 0, own,
                     row_widths[row_of(lane), jnp.clip(ibase - 1, 0, di - 1)])

  def write(a, lane, col, value, select):
    """`a[lane[j], col[j]] = value[j]` where `col[j]` is in range (else unchanged)."""
    if lane is None:
      return _write_column(a, col, value, select)
    return a.at[lane, col].set(value, mode="drop")

  def micro(lane, alive, lanes, suffix, isuf, select):
    """One micro-step of lanes `lane` (None: all): their scalars in `lanes`, their
    pushes in rows `lane` of `suffix` and `isuf`; lanes not `alive` or ended stay."""
    i, base, size, err, paren, ibase, isize, phase = lanes
    active = alive & (i < (count if lane is None else count[lane])) & ~err
    depth = base + size
    cls = at(items, lane, jnp.minimum(i, length - 1))
    c = jnp.maximum(cls, 0)
    width = tables.class_width[c] if indent else None
    top = read(lane, base, suffix, depth - 1)
    # An ordinary lexeme: the first member of its class the top state takes.
    members = tables.class_members[c]  # [N, M]
    acts = jnp.where(members >= 0, tables.action[top[:, None], jnp.maximum(members, 0)], 0)
    has = acts != 0
    first = jnp.argmax(has, axis=1)[:, None]
    a_lexeme = jnp.take_along_axis(acts, first, axis=1)[:, 0]
    t_lexeme = jnp.take_along_axis(members, first, axis=1)[:, 0]
    if indent:
      # A newline lexeme.
      is_nl = width != _WIDTH_NONE
      outside = is_nl & (paren <= 0)
      skip = is_nl & (paren > 0)  # inside brackets: dropped
      w = jnp.maximum(width, 0)
      itop = itop_of(lane, ibase, isuf, isize)
      a_nl = tables.action[top, _NEWLINE]
      feeding = outside & (phase == 0)
      eof_no_nl = feeding & (width == _WIDTH_EOF) & (a_nl == 0)
      resolving = outside & (phase > 0)
      want_indent = resolving & (w > itop)
      equal = resolving & (w == itop)
      term = jnp.where(~is_nl, t_lexeme,
                       jnp.where(~resolving, _NEWLINE,
                                 jnp.where(want_indent, _INDENT, _DEDENT)))
      a = jnp.where(~is_nl, a_lexeme, tables.action[top, term])
      nomove = skip | equal | eof_no_nl
    else:  # No indentation in these tables: every lexeme is ordinary (static).
      a, term = a_lexeme, t_lexeme
      nomove = jnp.zeros_like(active)
    shift = (a > 0) & ~nomove
    reduce = (a < -1) & ~nomove  # -1 is accept, only on $END, which no lexeme is.
    rule = jnp.maximum(-a - 1, 0)
    new = depth - jnp.where(reduce, tables.rule_len[rule], 0)  # where the push goes
    below = read(lane, base, suffix, new - 1)
    # A reduction enters goto[below, lhs] and runs the unit reductions after it.
    entry = tables.goto_id[below, tables.rule_lhs[rule]]
    chained = jnp.where(entry >= 0, tables.goto_chain[jnp.maximum(entry, 0),
                                                      jnp.maximum(term, 0)], -1)
    target = jnp.where(shift, a - 1, chained)
    new_base = jnp.minimum(base, new)
    slot = new - new_base
    moves = shift | reduce
    bad = active & ((~moves & ~nomove) | (moves & ((new + 1 > d) | (target < 0))))
    if indent:
      bad |= active & ((feeding & (width == _WIDTH_BAD))
                       | (want_indent & ((phase == 2) | (ibase + isize >= di))))
    ok = active & ~bad
    moved = ok & moves
    suffix = write(suffix, lane, jnp.where(moved, slot, p_width), target, select)
    shifted = ok & shift
    if indent:
      # Indentation: push on INDENT, pop on DEDENT.
      push = shifted & want_indent
      pop = shifted & resolving & ~want_indent
      isuf = write(isuf, lane, jnp.where(push, isize, pi), w, select)
      own_pop = pop & (isize > 0)
      isize = jnp.where(push, isize + 1, jnp.where(own_pop, isize - 1, isize))
      ibase = jnp.where(pop & ~own_pop, ibase - 1, ibase)
      # Next lexeme after: an ordinary shift, INDENT, dropped or equal newlines.
      done_item = ok & ((shift & ~is_nl) | push | skip | equal)
      phase = jnp.where(ok & feeding & (shift | eof_no_nl), 1,
                        jnp.where(pop, 2, jnp.where(done_item, 0, phase)))
      paren = paren + jnp.where(shifted & ~is_nl, tables.class_paren[c], 0)
    else:
      done_item = shifted
    lanes = (jnp.where(done_item, i + 1, i), jnp.where(moved, new_base, base),
             jnp.where(moved, slot + 1, size), err | bad, paren, ibase, isize, phase)
    return lanes, suffix, isuf

  zero = jnp.zeros((n,), jnp.int32)
  # Each lane's scalars before its first micro-step: i, base, size, err, paren, ibase,
  # isize, phase.
  start = (zero, state.depth[row], zero, jnp.zeros((n,), bool), regs[row, 0],
           regs[row, 1], zero, zero)
  buffers = (jnp.zeros((n, p_width), jnp.int32), jnp.zeros((n, pi), jnp.int32))

  def run(config, *carry):
    unroll, select, pool = config
    slots = queue_slots or pool * math.ceil(math.sqrt(b))
    # The queue's iterations cost more than the loop's and it needs more of them, so it
    # pays where lanes outnumber slots (SQL at batch 1: 221 lanes of 2.8 micro-steps
    # on average were 0.13 -> 0.16 ms in it); `advance`'s 2 lanes a row never are.
    if pool and (queue_slots or 4 * slots <= n):
      if first is None or n < _SHARE_FROM * slots:
        return _queue(micro, count, count > 0, start, (1, 4, 5), buffers, slots, unroll,
                      max_steps)
      shared_start, shared_buffers = _after_first(tables, state, first, start, buffers)
      live = (count > shared_start[0]) & ~shared_start[3]
      return _queue(micro, count, live, shared_start, range(7), shared_buffers, slots,
                    unroll, max_steps)

    def cond(carry):
      (i, *_, err), step = carry[0][:4], carry[-1]
      # Some lane has lexemes left and no error, within the safety bound.
      return jnp.any((i < count) & ~err) & (step < max_steps)

    def body_unrolled(carry):
      lanes, suffix, isuf, step = carry
      for _ in range(unroll):  # finished lanes are left as they are by `micro`
        lanes, suffix, isuf = micro(None, True, lanes, suffix, isuf, select)
      return lanes, suffix, isuf, step + 1

    lanes, suffix, isuf, steps = jax.lax.while_loop(
        cond, body_unrolled, (start, *buffers, jnp.int32(0)))
    return (*lanes, suffix, isuf, steps)

  configs = {p: (LANE_UNROLL[p], LANE_SELECT_WRITES[p], LANE_POOL.get(p, 0))
             for p in LANE_UNROLL}
  i, base, size, err, paren, ibase, isize, _, suffix, isuf, steps = _per_platform(
      run, configs)
  top = read(None, base, suffix, base + size - 1)
  room = (ibase + isize < di) & (itop_of(None, ibase, isuf, isize) < tables.max_width)
  return dict(ok=~err & (i >= count), top=top, paren=paren, room=room,
              base=base, suffix=suffix, size=size, ibase=ibase, isuf=isuf, isize=isize,
              steps=steps)


def _after_first(tables: LexedTables, state: ConstraintState, first: tuple, start: tuple,
                 buffers: tuple):
  """Each lane's scalars and stacks after its first lexeme, from one run per row of
  each distinct first lexeme of the row's lexer state (`first` = (first_items [B, F],
  lane_first [B, X]), `lexed_tables.first_lexeme_tables`).

  A lane's micro-steps are a function of its row and its lexemes, so its state after
  its first lexeme is the first-lexeme run's: i = 1, the same base, size, bracket
  depth, indentation, phase 0 and the same pushed entries (those columns are copied;
  a first-lexeme run that wrote past the copied columns leaves its lanes to start from
  the row, as before). A failed first lexeme fails its lanes without running them.
  Returns `start` and `buffers` for `_queue`, per lane.
  """
  first_items, lane_first = first
  b, f = first_items.shape
  n = lane_first.size
  items1 = jnp.full((b, f, 2), -1, jnp.int32).at[:, :, 0].set(first_items)
  # B * F lanes, of which ~2.5 a row have a lexeme (Python, Gemma 3: F = 37): a small
  # queue runs those alone (the one loop ran all B * F for the longest one's ~12 steps).
  one = _lanes(tables, state, items1, queue_slots=FIRST_SLOTS * b)
  suffix, isuf = buffers
  cols, icols = min(_FIRST_COLUMNS, suffix.shape[1]), 1
  fits = (jnp.all(one["suffix"][:, cols:] == 0, axis=1)
          & jnp.all(one["isuf"][:, icols:] == 0, axis=1))
  lane_first = lane_first.reshape(n)
  at = jnp.repeat(jnp.arange(b) * f, n // b) + jnp.maximum(lane_first, 0)
  shared = (lane_first >= 0) & fits[at]
  pick = lambda k, default: jnp.where(shared, one[k][at], default)
  i, base, size, _, paren, ibase, isize, phase = start
  start = (jnp.where(shared, 1, i), pick("base", base), pick("size", size),
           shared & ~one["ok"][at], pick("paren", paren), pick("ibase", ibase),
           pick("isize", isize), phase)
  head = jnp.where(shared[:, None], one["suffix"][at, :cols], 0)
  ihead = jnp.where(shared[:, None], one["isuf"][at, :icols], 0)
  return start, (jnp.concatenate([head, suffix[:, cols:]], axis=1),
                 jnp.concatenate([ihead, isuf[:, icols:]], axis=1))


def _queue(micro, count, live, start, per_lane, buffers, pool: int, unroll: int,
           max_steps: int):
  """The lanes' micro-steps as a work queue: `pool` slots (static) run the lanes that
  have lexemes, in order; a slot whose lane ends (all lexemes taken, an error, or the
  safety bound) stores the lane's scalars and takes the next lane of the queue.

  Each lane runs alone from its start to its end, as in the one-pass loop (which
  leaves an ended lane as it is), so the results are the same, in about (micro-steps
  of all lanes) / pool iterations plus the longest lane's tail instead of (longest
  lane) x (all lanes) micro-steps. `start`: the lanes' scalars before their first
  micro-step (i, base, size, err, paren, ibase, isize, phase: base, paren and ibase
  from the lane's row, the others 0). Returns the lanes' scalars [n] (as `start`), the
  pushes `buffers` and the number of iterations.
  """
  n = count.shape[0]
  queue = jnp.zeros((n,), jnp.int32).at[jnp.where(live, jnp.cumsum(live) - 1, n)].set(
      jnp.arange(n, dtype=jnp.int32), mode="drop")
  n_live = jnp.sum(live)
  firsts = jnp.arange(pool)
  slot_lane = jnp.where(firsts < n_live, queue[firsts], -1)
  lanes = tuple(v[jnp.maximum(slot_lane, 0)] for v in start)
  # Ended lanes' scalars [n, 8] (as `start`); lanes without lexemes keep their start.
  results = jnp.stack([v.astype(jnp.int32) for v in start], axis=1)
  # A fresh lane's start: base, paren, ibase from its row; the others are constants.
  start_rows = tuple(v if k in per_lane else None for k, v in enumerate(start))
  start_consts = tuple(None if k in per_lane else jnp.zeros((), v.dtype)
                       for k, v in enumerate(start))

  def cond(carry):
    return jnp.any(carry[0] >= 0)

  def body(carry):
    slot_lane, lanes, suffix, isuf, results, head, steps, it = carry
    occupied = slot_lane >= 0
    lane = jnp.maximum(slot_lane, 0)
    for _ in range(unroll):
      lanes, suffix, isuf = micro(lane, occupied, lanes, suffix, isuf, False)
    steps = steps + unroll
    i, err = lanes[0], lanes[3]
    ended = occupied & ((i >= count[lane]) | err | (steps >= max_steps))
    # The safety bound ends a lane unfinished (i < count: not ok), as the one-pass loop.
    results = results.at[jnp.where(ended, slot_lane, n)].set(
        jnp.stack([v.astype(jnp.int32) for v in lanes], axis=1), mode="drop")
    free = ~occupied | ended
    ahead = head + jnp.cumsum(free) - 1
    nxt = jnp.where(ahead < n_live, queue[jnp.clip(ahead, 0, n - 1)], -1)
    slot_lane = jnp.where(free, nxt, slot_lane)
    fresh = free & (slot_lane >= 0)
    lane = jnp.maximum(slot_lane, 0)
    lanes = tuple(v if s is None else jnp.where(fresh, s[lane], v)
                  for s, v in zip(start_rows, lanes))
    lanes = tuple(v if s is None else jnp.where(fresh, s, v)
                  for s, v in zip(start_consts, lanes))
    steps = jnp.where(fresh, 0, steps)
    return (slot_lane, lanes, suffix, isuf, results, head + jnp.sum(free), steps, it + 1)

  carry = (slot_lane, lanes, *buffers, results, jnp.int32(pool),
           jnp.zeros((pool,), jnp.int32), jnp.int32(0))
  _, _, suffix, isuf, results, _, _, iterations = jax.lax.while_loop(cond, body, carry)
  return (*(results[:, k].astype(v.dtype) for k, v in enumerate(start)), suffix, isuf,
          iterations)


def _materialize(state: ConstraintState, lanes: dict, row):
  """The parser stack [N, D] and indentation widths [N, Di] each lane leaves."""
  d = state.stack.shape[1]
  di = state.registers.shape[1] - 2
  pos = jnp.arange(d)[None, :]
  base = lanes["base"][:, None]
  own = jnp.take_along_axis(lanes["suffix"], jnp.clip(pos - base, 0, d - 1), axis=1)
  stack = jnp.where(pos < base, state.stack[row], own)
  ipos = jnp.arange(di)[None, :]
  ibase = lanes["ibase"][:, None]
  pi = lanes["isuf"].shape[1]
  iown = jnp.take_along_axis(lanes["isuf"], jnp.clip(ipos - ibase, 0, pi - 1), axis=1)
  widths = jnp.where(ipos < ibase, state.registers[row, 2:], iown)
  widths = jnp.where(ipos < ibase + lanes["isize"][:, None], widths, 0)
  return stack, widths


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
  return _bits_of_lanes(tables, state, _state_lanes(tables, state))


def _state_lanes(tables: LexedTables, state: ConstraintState) -> dict:
  """`_lanes` of each row's lexer state: one per distinct sequence of the state, then
  one for the end of sequence; each value [B, Ks + 1, ...]."""
  b = state.stack.shape[0]
  seq_items = _sequence_items(tables, tables.state_seq_lanes[state.state])  # [B, Ks, L]
  end_items, _ = _end_lane(tables, state.state, _lane_width(tables))
  items = jnp.concatenate([seq_items, end_items[:, None]], axis=1)
  first = None
  if tables.state_first_items is not None:  # Static: the lanes share first lexemes.
    lane_first = tables.state_lane_first[state.state]
    first = (tables.state_first_items[state.state],
             jnp.pad(lane_first, [(0, 0), (0, 1)], constant_values=-1))  # end lane: own
  lanes = _lanes(tables, state, items, first)
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
  (mask, sample, advance) compiles and runs the lanes' loop once, not twice.

  Raises:
    DecodingArgumentError: as `allowed_bits`; `step` as `advance`.
  """
  batch = _check_state("allowed_bits", tables, state)
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
