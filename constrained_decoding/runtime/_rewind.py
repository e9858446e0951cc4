"""Rewindable constraint state: a per-row ring buffer of `ConstraintState` snapshots.

Speculative decoding (paper Sec. 5.3) advances the constraint through k draft tokens,
then keeps only the prefix the target model accepts, so the constraint must go back to
an earlier state. `ConstraintHistory` keeps the last `max_rewind + 1` states of every
row (the current one included); `rewind` restores the state of n steps ago, per row.

The history is a separate pytree rather than a field of `ConstraintState` (as
DESIGN.md sketches): decoding loops that never rewind pay nothing for it, and the code
is generic over `ConstraintState`'s fields (every array leaf `[B, ...]` gains an H axis
after B), so fields added later (a push-down stack `[B, D]`, its `depth [B]`) are
snapshotted without changes here.

Cost: snapshots, not an undo log. Memory is `(max_rewind + 1) x` the size of one row's
state per row: for regular-language tables 10 bytes per snapshot (`state` and `depth`
int32, `done` and `error` bools, an empty stack); push-down tables add the stack's
`4 D` bytes (max_rewind = 8, D = 64: 9 x 266 B = 2.4 kB per row). `record` writes one row's state
and `rewind` reads one, so each costs O(size of a row's state), independent of n: far
below a step's O(V / 32) mask work. An undo log (the pops and pushes of each step)
would store O(P) per step instead of O(D) but needs n replayed steps per rewind.

```python
history = init_history(state, max_rewind=4)
for token in tokens:                       # e.g. k draft tokens
  state = advance(tables, state, token)
  history = record(history, state)         # after every advance
history, state = rewind(history, state, n) # n: Int[B], 0 <= n <= 4 per row
```

Public names:
  ConstraintHistory               the ring buffer (an immutable pytree).
  init_history(state, max_rewind) a history holding just `state`.
  record(history, state)          push the state reached by the last advance.
  rewind(history, state, n)       undo the last n advances of each row.
"""

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Int

from constrained_decoding.runtime._runtime import ConstraintState


@struct.dataclass(kw_only=True)
class ConstraintHistory:
  """The last `max_rewind + 1` constraint states of each row (a ring buffer).

  ```python
  history = init_history(state, max_rewind=4)
  history = record(history, advance(tables, state, tokens))
  ```

  Attributes:
    snapshots: A `ConstraintState` whose every leaf has an extra slot axis after the
      batch axis: `[B, max_rewind + 1, ...]`.
    head: Slot of each row's newest snapshot (`[B]`).
    count: Valid snapshots of each row, 1 to `max_rewind + 1` (`[B]`); a row can go
      back `count - 1` steps.

  A leading `*batch` axis appears only while `vmap` stacks histories.
  """

  snapshots: Any
  head: Int[Array, "*batch B"]
  count: Int[Array, "*batch B"]

  @property
  def num_slots(self) -> int:
    return jax.tree_util.tree_leaves(self.snapshots)[0].shape[1]

  @property
  def max_rewind(self) -> int:
    """The most steps any row can go back (H)."""
    return self.num_slots - 1


def _batch_size(state: Any) -> int:
  return jax.tree_util.tree_leaves(state)[0].shape[0]


def _per_row(flags: Bool[Array, "B"], leaf: Array) -> Array:
  """`flags` reshaped to broadcast against a `[B, ...]` leaf."""
  return flags.reshape(flags.shape + (1,) * (leaf.ndim - 1))


def init_history(state: ConstraintState, max_rewind: int) -> ConstraintHistory:
  """A history of `state` alone: nothing to rewind yet.

  Args:
    state: The current constraint state (`[B]` rows).
    max_rewind: H, the most steps a row can go back; fixes the buffer's shape (static).

  Raises:
    ValueError: If `max_rewind` is not a non-negative int.
  """
  if not isinstance(max_rewind, int) or max_rewind < 0:
    raise ValueError(f"init_history got max_rewind={max_rewind!r}. Expected an int >= 0 "
                     f"(the most steps a row can be rewound).")
  slots = max_rewind + 1
  snapshots = jax.tree_util.tree_map(
      lambda leaf: jnp.repeat(jnp.asarray(leaf)[:, None], slots, axis=1), state)
  batch = _batch_size(state)
  return ConstraintHistory(snapshots=snapshots, head=jnp.zeros(batch, jnp.int32),
                           count=jnp.ones(batch, jnp.int32))


def record(history: ConstraintHistory, state: ConstraintState) -> ConstraintHistory:
  """Pushes `state` (the state after the latest advance) as each row's newest snapshot.

  Once `max_rewind + 1` snapshots are held, the oldest is overwritten.
  """
  rows = jnp.arange(history.head.shape[0])
  head = (history.head + 1) % history.num_slots
  snapshots = jax.tree_util.tree_map(
      lambda buffer, leaf: buffer.at[rows, head].set(jnp.asarray(leaf, buffer.dtype)),
      history.snapshots, state)
  count = jnp.minimum(history.count + 1, history.num_slots)
  return history.replace(snapshots=snapshots, head=head, count=count)


def rewind(
    history: ConstraintHistory, state: ConstraintState, n: Int[Array, "B"] | int
) -> tuple[ConstraintHistory, ConstraintState]:
  """Undoes the last `n[b]` advances of each row b: the exact state of n steps ago.

  `state` must be the newest snapshot (call `record` after every `advance`). A row
  asked to go back further than it can (`n > count - 1`, or `n < 0`) keeps its state
  and gets its `error` flag set, in the state and in all its snapshots, so that no
  later rewind clears it: never a corrupted state. Otherwise the restored state's own
  flags come back with it (rewinding past a forbidden token clears that `error`).

  Args:
    history: Snapshots of the recent states.
    state: The current state.
    n: Steps to undo per row (an int applies to every row); 0 leaves a row as it is.

  Returns:
    The history with the undone snapshots dropped (recording continues from the
    restored state), and the restored state.
  """
  batch = history.head.shape[0]
  n = jnp.broadcast_to(jnp.asarray(n, jnp.int32), (batch,))
  ok = (n >= 0) & (n < history.count)
  steps = jnp.where(ok, n, 0)
  slot = (history.head - steps) % history.num_slots
  rows = jnp.arange(batch)
  restored = jax.tree_util.tree_map(lambda buffer: buffer[rows, slot], history.snapshots)
  state = jax.tree_util.tree_map(
      lambda old, new: jnp.where(_per_row(ok, new), new, jnp.asarray(old, new.dtype)),
      state, restored)
  state = state.replace(error=state.error | ~ok)
  # A failed rewind is sticky: every snapshot of the row carries the error, so no later
  # rewind can clear it.
  snapshots = history.snapshots.replace(error=history.snapshots.error | ~ok[:, None])
  return history.replace(snapshots=snapshots, head=slot,
                         count=history.count - steps), state
