"""Counted chains near their end: bounds and excluded rows (`tables.py`).

A counting entry's "at most r characters" filter is a bound (`AT_MOST - r`, read from
`token_counts`), and a state whose entries share one bound gets its mask row without
the bound plus the row of tokens longer than r, removed on the device. The device's
mask must still equal `reference_allowed` (which applies each entry's bound itself),
alone and stacked, and `maxLength` 10,000 with Gemma 3 must fit in 8 MiB.
"""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import tables as _tables
from constrained_decoding.testing import _reference as ref

_EXTRA = [b"ab", b"abc", b"xyz ", b"abcdefgh", b"\xc3\xa4", b'b"', b'c"!', b"nab", b"n",
          b"u00", b"00e4 a", b"e4", b'\\"', b'a\\', b"\\u", b"uD83D", b"\\uDE00"]


@pytest.fixture(scope="module")
def vocab():
  tokens = [bytes([b]) for b in range(256)] + _EXTRA + [None]
  return cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])


def _device_masks(tables, states: np.ndarray) -> np.ndarray:
  state = cd.init_state(tables, batch_size=len(states))
  state = state.replace(state=jnp.asarray(states, jnp.int32))
  return np.asarray(jax.jit(cd.allowed_tokens)(tables, state))


def test_stacked_excluded_rows_keep_each_part_exact(vocab):
  """Two counted tables with excluded rows around a plain one: every live state of the
  stack masks as the reference says, and as its own part's state does (row offsets)."""
  compiler = cd.Compiler(vocab, cd.CompileOptions(memoize=False))
  parts = [compiler.compile(cd.JsonSchema({"type": "string", "maxLength": 12})),
           compiler.compile(cd.Regex(r"(ab|c)+")),
           compiler.compile(cd.JsonSchema({"type": "string", "minLength": 3,
                                           "maxLength": 30}))]
  assert parts[0].group_excluded.shape[0] and parts[2].group_excluded.shape[0]
  stacked = cd.stack_tables(parts)
  live = np.flatnonzero(np.asarray(stacked.state_groups)[:, 0] >= 0)
  masks = _device_masks(stacked, live)
  for q, mask in zip(live.tolist(), masks):
    np.testing.assert_array_equal(mask, ref.reference_allowed(stacked, q), err_msg=str(q))
  starts = np.asarray(stacked.start).tolist()
  for k, part in enumerate(parts):  # Each part's states, offset, mask as in the part.
    own = np.flatnonzero(np.asarray(part.state_groups)[:, 0] >= 0)
    offset = starts[k] - int(part.start[0])
    for q, mask in zip(own.tolist(), _device_masks(stacked, own + offset)):
      np.testing.assert_array_equal(mask, ref.reference_allowed(part, q), err_msg=str((k, q)))


def test_gemma_max_length_10000_fits_and_masks_exactly(gemma_compiler, gemma_vocab):
  """`maxLength` 10,000 with Gemma 3: at most 8 MiB; at the last 34 positions (more
  than the longest token's 31 characters) and a few far ones, in the slots whose rows
  depend on the characters left, the device mask equals the reference's; strings of
  10,000 characters and one more, under a random tokenization, are accepted and refused
  by the reference walk, and the device takes its last 400 steps alike."""
  n = 10_000
  tables, info = gemma_compiler.compile_with_info(cd.JsonSchema({"type": "string",
                                                                 "maxLength": n}))
  assert info.nbytes["total"] <= 8 << 20, info.nbytes
  assert tables.group_excluded.shape[0] and tables.mask_bits.shape[0] <= 64
  # States are numbered position by position from the one after the opening quote
  # (`_counting.py`), 20 per position (escapes and UTF-8 characters under way).
  stride = 20
  base = ref.reference_step(tables, int(tables.start[0]), gemma_vocab.token_bytes.index(b'"'))
  # Slot 0 and the slots inside escapes (after a backslash, `\u`, ..., and in the
  # second half of a surrogate pair): their rows depend on the characters left.
  positions = list(range(n - 33, n + 1)) + [0, 1, 37, n // 2]
  slots = (0, 1, 8, 10, 16, 17, 18, 19)
  states = np.array([base + i * stride + k for i in positions for k in slots])
  states = states[np.asarray(tables.state_groups)[states, 0] >= 0]
  masks = _device_masks(tables, states)
  for q, mask in zip(states.tolist(), masks):
    np.testing.assert_array_equal(mask, ref.reference_allowed(tables, q), err_msg=str(q))
  rng = random.Random(n)
  index = ref.TokenIndex(gemma_vocab)
  for length in (n, n + 1):
    # One JSON string character each; runs of one, so that long tokens are drawn.
    units = []
    while len(units) < length:
      units += [rng.choice(["a", " ", "b", "\\n", "ä", "\\u00e4"])] * rng.randint(1, 12)
    text = '"' + "".join(units[:length]) + '"'
    tokens = np.array(index.random_tokenization(text.encode(), rng), np.int32)
    walked, ok = ref.reference_walk(tables, tokens.tolist())
    assert ok == (length <= n) and ok == ref.reference_accepts(tables, tokens.tolist())
    # The device takes the last 400 steps (one row each) as the reference does, and
    # refuses the token that makes the string too long.
    before = np.array([int(tables.start[0])] + walked[:-1])[-400:]
    after = jax.jit(cd.advance)(tables, cd.init_state(tables, batch_size=len(before)).replace(
        state=jnp.asarray(before, jnp.int32)), tokens[len(walked) - len(before):len(walked)])
    np.testing.assert_array_equal(np.asarray(after.state), walked[-400:])
    assert not np.asarray(after.error).any()
    if not ok:
      last = cd.init_state(tables, batch_size=1).replace(state=jnp.asarray([walked[-1]]))
      assert bool(jax.jit(cd.advance)(tables, last, tokens[len(walked):][:1]).error[0])


def test_bound_filters_take_no_terminal_row(vocab):
  """"At most r characters" is `AT_MOST - r` in the entry, not a bitmap: every
  terminal row of a JSON string's chain is a counting terminal."""
  tables = cd.Compiler(vocab, cd.CompileOptions(memoize=False)).compile(
      cd.JsonSchema({"type": "string", "maxLength": 12}))
  entries = np.asarray(tables.state_terminals)
  counting = np.asarray(tables.terminal_counts)[np.maximum(entries[..., 0], 0), 0] >= 0
  bounds = entries[..., 1][counting & (entries[..., 0] >= 0)]
  assert (bounds <= _tables.AT_MOST).any() and not (bounds >= 0).any()
