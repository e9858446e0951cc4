"""The lanes of the lexed runtime: the LR parser run over token lexemes (issue 18).

`runtime/_lexed.py` checks each candidate token of a row by a *lane*: the parser run over
the lexemes the token completes, on the row's stack. This module runs the lanes of a
batch: `_lanes` (micro-steps: one reduce, shift, reduce and shift, or indentation
decision per lane), the CPU work queue (`_queue`), the shared lane prefixes
(`_after_prefix`), and the stacks a lane leaves (`_materialize`). The lane schedule's
settings (`LANE_*`, `PREFIX_POOL`) are per platform (`lax.platform_dependent`);
docs/lexer_runtime.md "Lane schedule" has the measurements behind them.
"""

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from constrained_decoding.lexed_tables import LexedTables
from constrained_decoding.runtime._runtime import ConstraintState

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
# Lane schedule (`_lanes`): 0 runs every lane in one loop until the longest is done; n > 0
# runs them as a work queue of n x ceil(sqrt(B)) slots (B rows). On CPU the cost is the
# micro-steps done, and most lanes end within a few (Python with Gemma 3: 4.1 on
# average, the longest 17-32), so the queue does a fraction of them; fewer slots mean
# more iterations, each with a fixed cost (best measured: 128 slots at B = 1, 512 at
# 8, 1,024-2,048 at 64). On a GPU the cost is the loop's iterations (launches), which
# the one loop keeps fewest.
LANE_POOL = {"cpu": 128, "default": 0}
# In the queue, lanes start after their prefix (first two lexemes), run once per row
# and distinct prefix (`_after_prefix`): the pushed entries of that run copied to each
# lane. (Lanes share prefixes only where they outnumber the slots _SHARE_FROM to 1: it
# cuts the queue's work, not its tail (the longest lane), and costs a loop of its own;
# Python with Gemma 3 at batch 1 (5 lanes a slot) was 0.64 -> 0.72 ms with first
# lexemes shared: docs/lexer_runtime.md "Lane schedule".) Prefixes run in a queue of
# PREFIX_POOL x ceil(sqrt(B)) slots (Python: F = 293 columns, ~37 used a row, ~175
# micro-steps; Go at batch 8 was slower with 8 slots a row than with 24).
_PREFIX_COLUMNS = 4
PREFIX_POOL = 64
_SHARE_FROM = 8


def _per_platform(fn, table: dict, *operands):
  """`fn(value, *operands)` with this platform's value from `table`."""
  return jax.lax.platform_dependent(
      *operands, **{platform: (lambda v: lambda *ops: fn(v, *ops))(value)
                    for platform, value in table.items()})


def _select_column(a, col, value):
  """`a` [N, P] with `a[i, col[i]] = value[i]` where `col[i] < P` (else unchanged), by
  a select over every column (no scatter)."""
  return jnp.where(jnp.arange(a.shape[1])[None, :] == col[:, None], value[:, None], a)


def _first_action(tables: LexedTables, top, members):
  """(action, terminal) [N] of the first of each lexeme's class `members` [N, M] that
  parser state `top` [N] has an action for (action 0 where none)."""
  acts = jnp.where(members >= 0, tables.action[top[:, None], jnp.maximum(members, 0)], 0)
  first = jnp.argmax(acts != 0, axis=1)[:, None]
  return (jnp.take_along_axis(acts, first, axis=1)[:, 0],
          jnp.take_along_axis(members, first, axis=1)[:, 0])


def _registers(tables: LexedTables, state: ConstraintState) -> Int[Array, "B R"]:
  """The row's indentation registers: [bracket depth, levels, widths (Di)]."""
  return state.registers


def _lanes(tables: LexedTables, state: ConstraintState, items: Int[Array, "B X L"],
           prefixes: tuple | None = None, queue_slots: int = 0, stacks: bool = True,
           heads: int = 0):
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
  shift or indentation decision per lane; a reduce on an ordinary lexeme also takes
  the shift that follows it (that lexeme's first member the target takes; read with
  the goto from the derived `goto_chain_shift` where the tables have it), which cuts
  the longest lane's micro-steps (the one loop's iterations) for Go 29 -> 15.5, SQL
  5 -> 4 (median, Gemma 3; Python 16, whose lexemes mostly reduce more than once).

  Two schedules of the same micro-steps (`LANE_POOL`): every lane in one `while_loop`
  until the longest is done, or (pool > 0) a work queue: slots take the rows' lanes
  that have lexemes in turn and pass to the next lane when theirs ends. Most lanes end
  within a few micro-steps (Python with Gemma 3: 4.1 on average against 17 iterations
  of the whole-lane loop), so the queue does a fraction of the micro-steps.

  With `stacks` False (static: `allowed_bits`, which needs each lane's top state and
  indentation room, not its stack) the queue keeps pushes per slot ([slots, D], reused
  by the slot's next lane) instead of per lane ([B * X, D]: 10.9 MB for Python at batch
  64, whose creation and cache misses the queue paid at every micro-step).

  Returns:
    A dict of [B * X] arrays: ok (every lexeme taken), top (parser state),
    paren (bracket depth), itop and room (the top indentation width, and whether the
    indentation stack can take one more level: both only where ok), and base, size,
    ibase, isize, and with `stacks` suffix, isuf (the stacks, for `_materialize`),
    with `heads` (static C > 0) head, ihead: the first C and 1 entries each lane
    pushed ([B * X, C], [B * X, 1]; for `_after_prefix`).
  """
  b, x, length = items.shape
  d = p_width = state.stack.shape[1]
  packed = tables.goto_chain_shift  # None: the shift after a reduction from `action`
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

  # `lane`: the lanes' rows of `items` for each slot of the queue, or None for every
  # lane in order (the one-pass loop, which keeps its plain forms: on an H200 indexing
  # by an iota instead cost Python's step 5%); `buf`: their rows of `suffix` and `isuf`
  # (the lanes', or the queue's slots' own: an iota), None with `lane`.
  def at(a, lane, col):
    if lane is None:
      return jnp.take_along_axis(a, col[:, None], axis=1)[:, 0]
    return a[lane, col]

  def row_of(lane):
    return row if lane is None else row[lane]

  def read(lane, buf, base, suffix, pos):
    own = at(suffix, buf, jnp.clip(pos - base, 0, p_width - 1))
    return jnp.where(pos < base, row_stack[row_of(lane), jnp.clip(pos, 0, d - 1)], own)

  def itop_of(lane, buf, ibase, isuf, isize):
    own = at(isuf, buf, jnp.clip(isize - 1, 0, pi - 1))
    return jnp.where(isize > 0, own,
                     row_widths[row_of(lane), jnp.clip(ibase - 1, 0, di - 1)])

  def write(a, lane, col, value, select):
    """`a[lane[j], col[j, k]] = value[j, k]` (or with `col`, `value` [N]: one entry a
    lane) where `col[j, k]` is in range (else unchanged)."""
    if col.ndim == 1:
      col, value = col[:, None], value[:, None]
    if lane is None and select:
      for k in range(col.shape[1]):
        a = _select_column(a, col[:, k], value[:, k])
      return a
    rows = jnp.arange(a.shape[0]) if lane is None else lane
    return a.at[rows[:, None], col].set(value, mode="drop")

  def micro(lane, buf, alive, lanes, suffix, isuf, select):
    """One micro-step of lanes `lane` (None: all): their scalars in `lanes`, their
    pushes in rows `buf` of `suffix` and `isuf`; lanes not `alive` or ended stay.
    Also returns their top state and, where the step ends the lane well (its last
    lexeme taken: no DEDENT, which is never a lexeme's last step), top width after it:
    as `ends`, without reading the buffers after their writes (in the queue's loop
    such a read made XLA copy them at every iteration)."""
    i, base, size, err, paren, ibase, isize, phase = lanes
    active = alive & (i < (count if lane is None else count[lane])) & ~err
    depth = base + size
    cls = at(items, lane, jnp.minimum(i, length - 1))
    c = jnp.maximum(cls, 0)
    width = tables.class_width[c] if indent else None
    top = read(lane, buf, base, suffix, depth - 1)
    # An ordinary lexeme: the first member of its class the top state takes.
    members = tables.class_members[c]  # [N, M]
    a_lexeme, t_lexeme = _first_action(tables, top, members)
    if indent:
      # A newline lexeme.
      is_nl = width != _WIDTH_NONE
      outside = is_nl & (paren <= 0)
      skip = is_nl & (paren > 0)  # inside brackets: dropped
      w = jnp.maximum(width, 0)
      itop = itop_of(lane, buf, ibase, isuf, isize)
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
    below = read(lane, buf, base, suffix, new - 1)
    # A reduction enters goto[below, lhs] and runs the unit reductions after it (with
    # `goto_chain_shift`, the same gather gives the shift that follows: +1, -1 none).
    entry = tables.goto_id[below, tables.rule_lhs[rule]]
    chain = (tables.goto_chain if packed is None else packed)[jnp.maximum(entry, 0),
                                                             jnp.maximum(term, 0)]
    chained = jnp.where(entry >= 0, chain if packed is None else (chain & 0xFFFF) - 1, -1)
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
    # A reduction whose target shifts the same ordinary lexeme: that shift too, as the
    # next micro-step would take it (the first member the target takes; where the push
    # would pass D it is left to the next micro-step, which fails the lane).
    if packed is None:
      a_next, _ = _first_action(tables, jnp.maximum(target, 0), members)
    else:  # the target's shift, where the next micro-step surely takes it
      a_next = jnp.where(entry >= 0, chain >> 16, 0)
    fused = ok & reduce & (a_next > 0) & (new + 2 <= d)
    if indent:
      fused &= ~is_nl
    top_after = jnp.where(fused, a_next - 1, jnp.where(moved, target, top))
    suffix = write(suffix, buf, jnp.stack([jnp.where(moved, slot, p_width),
                                           jnp.where(fused, slot + 1, p_width)], axis=1),
                   jnp.stack([target, a_next - 1], axis=1), select)
    shifted = ok & shift
    if indent:
      # Indentation: push on INDENT, pop on DEDENT.
      push = shifted & want_indent
      pop = shifted & resolving & ~want_indent
      isuf = write(isuf, buf, jnp.where(push, isize, pi), w, select)
      own_pop = pop & (isize > 0)
      isize = jnp.where(push, isize + 1, jnp.where(own_pop, isize - 1, isize))
      ibase = jnp.where(pop & ~own_pop, ibase - 1, ibase)
      itop_after = jnp.where(push, w, itop)
      # Next lexeme after: an ordinary shift, INDENT, dropped or equal newlines.
      done_item = ok & ((shift & ~is_nl) | push | skip | equal) | fused
      phase = jnp.where(ok & feeding & (shift | eof_no_nl), 1,
                        jnp.where(pop, 2, jnp.where(done_item, 0, phase)))
      paren = paren + jnp.where((shifted & ~is_nl) | fused, tables.class_paren[c], 0)
    else:
      done_item = shifted | fused
      itop_after = jnp.zeros_like(top)  # no room: `di` is 1, ibase 1
    lanes = (jnp.where(done_item, i + 1, i), jnp.where(moved, new_base, base),
             jnp.where(moved, slot + 1 + fused, size), err | bad, paren, ibase, isize,
             phase)
    return lanes, suffix, isuf, (top_after, itop_after)

  zero = jnp.zeros((n,), jnp.int32)
  # Each lane's scalars before its first micro-step: i, base, size, err, paren, ibase,
  # isize, phase.
  start = (zero, state.depth[row], zero, jnp.zeros((n,), bool), regs[row, 0],
           regs[row, 1], zero, zero)

  def ends(lane, buf, lanes, suffix, isuf):
    """(top state, top indentation width) of lanes `lane` (None: all) at their end."""
    base, size, ibase, isize = (lanes[k] for k in (1, 2, 5, 6))
    return (read(lane, buf, base, suffix, base + size - 1),
            itop_of(lane, buf, ibase, isuf, isize))

  # (top, top width) of every lane before it pushes anything: its row's.
  row_ends = (row_stack[row, jnp.clip(start[1] - 1, 0, d - 1)],
              row_widths[row, jnp.clip(start[5] - 1, 0, di - 1)])

  def run(config, *carry):
    unroll, select, pool = config
    slots = queue_slots or pool * math.ceil(math.sqrt(b))
    # The queue's iterations cost more than the loop's and it needs more of them, so it
    # pays where lanes outnumber slots (SQL at batch 1: 221 lanes of 2.8 micro-steps
    # on average were 0.13 -> 0.16 ms in it); `advance`'s 2 lanes a row never are.
    if pool and (queue_slots or 4 * slots <= n):
      rows = n if stacks else slots  # the pushes per lane, or per slot
      buffers = (jnp.zeros((rows, p_width), jnp.int32), jnp.zeros((rows, pi), jnp.int32))
      if prefixes is None or n < _SHARE_FROM * slots:
        return _queue(micro, count, count > 0, start, row_ends, (1, 4, 5),
                      buffers, slots, unroll, max_steps, per_slot=not stacks,
                      head_columns=heads)
      shared_start, shared_ends, lane_heads = _after_prefix(tables, state, prefixes,
                                                            start, row_ends)
      live = (count > shared_start[0]) & ~shared_start[3]
      if stacks:  # each lane's row starts with its prefix's pushes
        buffers = tuple(jnp.concatenate([h, a[:, h.shape[1]:]], axis=1)
                        for h, a in zip(lane_heads, buffers))
        lane_heads = None
      return _queue(micro, count, live, shared_start, shared_ends, range(7),
                    buffers, slots, unroll, max_steps, lane_heads, per_slot=not stacks,
                    head_columns=heads)
    buffers = (jnp.zeros((n, p_width), jnp.int32), jnp.zeros((n, pi), jnp.int32))

    def cond(carry):
      (i, *_, err), step = carry[0][:4], carry[-1]
      # Some lane has lexemes left and no error, within the safety bound.
      return jnp.any((i < count) & ~err) & (step < max_steps)

    def body_unrolled(carry):
      lanes, suffix, isuf, step = carry
      for _ in range(unroll):  # finished lanes are left as they are by `micro`
        lanes, suffix, isuf, _ = micro(None, None, True, lanes, suffix, isuf, select)
      return lanes, suffix, isuf, step + 1

    lanes, suffix, isuf, steps = jax.lax.while_loop(
        cond, body_unrolled, (start, *buffers, jnp.int32(0)))
    top, itop = ends(None, None, lanes, suffix, isuf)
    out = (*lanes, top, itop) + ((suffix, isuf) if stacks else ())
    return out + ((suffix[:, :heads], isuf[:, :1]) if heads else ()) + (steps,)

  configs = {p: (LANE_UNROLL[p], LANE_SELECT_WRITES[p], LANE_POOL.get(p, 0))
             for p in LANE_UNROLL}
  out = _per_platform(run, configs)
  i, base, size, err, paren, ibase, isize, _, top, itop = out[:10]
  room = (ibase + isize < di) & (itop < tables.max_width)
  result = dict(ok=~err & (i >= count), top=top, itop=itop, paren=paren, room=room,
                base=base, size=size, ibase=ibase, isize=isize, steps=out[-1])
  if stacks:
    result.update(suffix=out[10], isuf=out[11])
  if heads:
    result.update(head=out[-3], ihead=out[-2])
  return result


def _after_prefix(tables: LexedTables, state: ConstraintState, prefixes: tuple,
                  start: tuple, row_ends: tuple):
  """Each lane's scalars and stacks after its prefix (its first two lexemes, or all
  of a shorter sequence), from one run per row of each distinct prefix of the row's
  lexer state (`prefixes` = (prefix_items [B, F, P], lane_prefix [B, X]),
  `lexed_tables.lane_prefix_tables`).

  A lane's micro-steps are a function of its row and its lexemes, so its state after
  its prefix is the prefix run's: the same i, base, size, bracket depth, indentation,
  phase 0 and the same pushed entries (those columns are copied; a prefix run whose
  stacks end with more pushed entries than the copied columns leaves its lanes to
  start from the row, as before). A failed prefix fails its lanes without running
  them; a lane that is its prefix ends with it.
  Returns `start`, the (top, top width) of each lane there (`row_ends`: from the row)
  and its pushes there ([n, C] and [n, 1]: the first columns of its stacks), for
  `_queue`.
  """
  prefix_items, lane_prefix = prefixes
  b, f, length = prefix_items.shape
  n = lane_prefix.size
  cols = min(_PREFIX_COLUMNS, state.stack.shape[1])
  # B * F prefix lanes, of which ~37 a row are used (Python, Gemma 3: F = 293): a queue
  # runs those alone, each slot keeping its pushes in its own row and storing the
  # first `cols` when its lane ends.
  one = _lanes(tables, state, prefix_items, queue_slots=PREFIX_POOL * math.ceil(math.sqrt(b)),
               stacks=False, heads=cols)
  # A run fits when what it holds pushed at its end lies in the copied columns (a lane
  # reads only the first `size` / `isize` entries it pushed).
  fits = (one["size"] <= cols) & (one["isize"] <= 1)
  lane_prefix = lane_prefix.reshape(n)
  at = jnp.repeat(jnp.arange(b) * f, n // b) + jnp.maximum(lane_prefix, 0)
  shared = (lane_prefix >= 0) & fits[at]
  taken = jnp.sum(prefix_items >= 0, axis=2).reshape(b * f)[at]  # lexemes in the prefix
  pick = lambda k, default: jnp.where(shared, one[k][at], default)
  i, base, size, _, paren, ibase, isize, phase = start
  start = (jnp.where(shared, taken, i), pick("base", base), pick("size", size),
           shared & ~one["ok"][at], pick("paren", paren), pick("ibase", ibase),
           pick("isize", isize), phase)
  ends = (pick("top", row_ends[0]), pick("itop", row_ends[1]))
  head = jnp.where(shared[:, None], one["head"][at], 0)
  ihead = jnp.where(shared[:, None], one["ihead"][at], 0)
  return start, ends, (head, ihead)


def _queue(micro, count, live, start, start_ends, per_lane, buffers, pool: int,
           unroll: int, max_steps: int, heads=None, per_slot: bool = False,
           head_columns: int = 0):
  """The lanes' micro-steps as a work queue: `pool` slots (static) run the lanes that
  have lexemes, in order; a slot whose lane ends (all lexemes taken, an error, or the
  safety bound) stores the lane's scalars, its top state and top width, and takes the
  next lane of the queue.

  Each lane runs alone from its start to its end, as in the one-pass loop (which
  leaves an ended lane as it is), so the results are the same, in about (micro-steps
  of all lanes) / pool iterations plus the longest lane's tail instead of (longest
  lane) x (all lanes) micro-steps. `start`: the lanes' scalars before their first
  micro-step (i, base, size, err, paren, ibase, isize, phase: base, paren and ibase
  from the lane's row, the others 0); `start_ends` their (top, top width) there.
  `buffers`: the pushes, a row per lane ([n, D] and [n, Pi]) or with `per_slot` (static)
  a row per slot ([pool, D], [pool, Pi]: a slot's next lane writes over its last's and
  reads only what it pushed itself; `heads` [n, C], [n, 1] are the first columns a lane
  starts with).
  Returns the lanes' scalars [n] (as `start`), their (top, top width), the pushes
  `buffers` (not `per_slot`), with `head_columns` (static C > 0) the first C and 1
  entries of each lane's pushes at its end ([n, C], [n, 1]: stored from its slot's
  rows when it ends), and the number of iterations.
  """
  n = count.shape[0]
  slots = jnp.arange(pool)
  queue = jnp.zeros((n,), jnp.int32).at[jnp.where(live, jnp.cumsum(live) - 1, n)].set(
      jnp.arange(n, dtype=jnp.int32), mode="drop")
  n_live = jnp.sum(live)
  slot_lane = jnp.where(slots < n_live, queue[slots], -1)
  lanes = tuple(v[jnp.maximum(slot_lane, 0)] for v in start)
  # Ended lanes' scalars and ends [n, 10] (as `start`, `start_ends`); lanes without
  # lexemes keep their start.
  results = jnp.stack([v.astype(jnp.int32) for v in start + tuple(start_ends)], axis=1)
  if head_columns:  # then the first pushed entries (read only below `size` / `isize`):
    # a lane that never runs here keeps those it starts with
    results = jnp.concatenate([results, *_start_heads(heads, n, head_columns)], axis=1)
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
    buf = slots if per_slot else lane
    # A fresh lane's first columns (none where its slot's steps went on).
    suffix, isuf = _fresh_columns(occupied & (steps == 0), lane, (suffix, isuf), heads,
                                  head_columns, per_slot)
    for _ in range(unroll):
      lanes, suffix, isuf, (top, itop) = micro(lane, buf, occupied, lanes, suffix, isuf,
                                               False)
    steps = steps + unroll
    i, err = lanes[0], lanes[3]
    ended = occupied & ((i >= count[lane]) | err | (steps >= max_steps))
    # The safety bound ends a lane unfinished (i < count: not ok), as the one-pass loop.
    stored = [v.astype(jnp.int32)[:, None] for v in lanes + (top, itop)]
    if head_columns:
      own = (suffix, isuf) if per_slot else (suffix[lane], isuf[lane])
      stored += [own[0][:, :head_columns], own[1][:, :1]]
    results = results.at[jnp.where(ended, slot_lane, n)].set(
        jnp.concatenate(stored, axis=1), mode="drop")
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
  out = tuple(results[:, k].astype(v.dtype) for k, v in enumerate(start))
  out += (results[:, 8], results[:, 9])
  out += (suffix, isuf) if not per_slot else ()
  if head_columns:
    out += (results[:, 10:10 + head_columns], results[:, 10 + head_columns:])
  return out + (iterations,)


def _start_heads(heads, n: int, columns: int):
  """The first `columns` and 1 pushed entries ([n, columns], [n, 1]) each of n lanes
  starts with: its `heads` (None: none pushed), cut or padded with zeros."""
  if heads is None:
    return jnp.zeros((n, columns), jnp.int32), jnp.zeros((n, 1), jnp.int32)
  return tuple(jnp.pad(h[:, :c], [(0, 0), (0, c - min(c, h.shape[1]))])
               for h, c in zip(heads, (columns, 1)))


def _fresh_columns(fresh, lane, buffers, heads, zeroed: int, per_slot: bool):
  """The pushes buffers (`buffers`: [rows, D], [rows, Pi]) where lanes start in the
  queue's slots (`fresh` [pool]; `lane` [pool] the slots' lanes): with `per_slot`
  (static; rows = slots) the first `zeroed` columns (static: the stored heads' columns,
  0 for none; 1 of the second buffer) zeroed, since the slot's last lane wrote them and
  stored heads hold zeros past what their lane wrote, as per-lane buffers do; then each
  fresh lane's `heads` ([n, C], [n, 1], its first pushed entries; None: none) written
  over the first columns of its slot's row (of its own row without `per_slot`).
  Zeroing comes first: after the heads it would wipe them (as it did before 2026-11-28,
  unseen while no caller passed both `heads` and `head_columns`)."""
  out = []
  for a, h, cols in zip(buffers, (None, None) if heads is None else heads,
                        (zeroed, min(zeroed, 1))):
    if per_slot and cols:
      a = a.at[:, :cols].set(jnp.where(fresh[:, None], 0, a[:, :cols]))
    if h is not None:
      c = h.shape[1]
      if per_slot:
        a = a.at[:, :c].set(jnp.where(fresh[:, None], h[lane], a[:, :c]))
      else:
        a = a.at[jnp.where(fresh, lane, a.shape[0]), :c].set(h[lane], mode="drop")
    out.append(a)
  return tuple(out)


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
