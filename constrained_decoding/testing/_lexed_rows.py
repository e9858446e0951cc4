"""Token rows fed through the jitted two-level (lexed) step a batch at a time: what the
lexed grammars' tests and `benchmarks/python_acceptance.py` check texts with."""

import jax.numpy as jnp
import numpy as np

from constrained_decoding.runtime import _lexed


def run_lexed_rows(tables, rows: list[list[int]], eos: int, batch: int, advance,
                   allowed=None) -> tuple[list[bool], list[int]]:
  """Feeds each row of token ids, then end of sequence (`eos`), through `advance` (the
  jitted `runtime._lexed.advance`), `batch` rows at a time, shortest rows together.

  Returns (accepted [R], index of the first refused token or -1 [R]), in the order of
  `rows`. With `allowed` (the jitted `allowed_tokens`), also asserts at every step that
  `advance` refuses a token exactly when the mask does not offer it.
  """
  order = sorted(range(len(rows)), key=lambda r: len(rows[r]))
  accepted, first_bad = [False] * len(rows), [-1] * len(rows)
  for lo in range(0, len(order), batch):
    idx = order[lo:lo + batch]
    chunk = [rows[r] + [eos] for r in idx]
    chunk += [[eos]] * (batch - len(chunk))
    width = max(map(len, chunk))
    tokens = np.array([r + [eos] * (width - len(r)) for r in chunk], np.int32)
    state = _lexed.init_state(tables, batch)
    bad = np.full(batch, -1)
    for j in range(width):
      live = ~np.asarray(state.done | state.error)
      if not live.any():
        break
      if allowed is not None:
        offered = np.asarray(allowed(tables, state))[np.arange(batch), tokens[:, j]]
      state = advance(tables, state, jnp.asarray(tokens[:, j]))
      refused = live & np.asarray(state.error)
      if allowed is not None:  # `advance` takes a token exactly when the mask offers it.
        np.testing.assert_array_equal(refused, live & ~offered)
      bad = np.where(refused & (bad < 0), j, bad)
    ok = np.asarray(state.done & ~state.error)
    for k, r in enumerate(idx):
      accepted[r], first_bad[r] = bool(ok[k]), int(bad[k])
  return accepted, first_bad
