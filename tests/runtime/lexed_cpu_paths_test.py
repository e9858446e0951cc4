"""The CPU-only forms of the lexed runtime against the plain ones (issue 18, step cost).

`runtime/_lexed.py` keeps some forms behind its platform switch: on CPU the outcome
slots are checked as packed words (`SLOT_CHECK_PACKED`, `_slot_ok_packed`) and each
row's distinct lane prefixes run in a small queue of their own (`PREFIX_POOL`); off CPU
the plain slot check and every lane in one loop. Here both are forced on CPU and must
give the same masks and states at every step of random walks over Python with
indentation (newline lexemes inside and outside brackets, INDENT near a full
indentation stack: every flag of the packed check), the fused decode step included.
The walks and the compiled tables are `lexed_python_test`'s.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lexed_python_test import _BATCH  # pylint: disable=import-error  (same directory)
from lexed_python_test import SNIPPETS  # pylint: disable=import-error
from lexed_python_test import _walk  # pylint: disable=import-error
from lexed_python_test import shared_setup  # pylint: disable=import-error
from constrained_decoding.runtime import _lexed
from constrained_decoding.runtime import _lexed_lanes


@pytest.fixture(scope="module")
def setup():
  # `lexed_python_test`'s tables and jitted default forms (traced before any patch).
  return shared_setup()


@pytest.fixture(scope="module")
def plain():
  """The plain slot check's mask and fused step, jitted once for both tests that patch
  `SLOT_CHECK_PACKED` off (each patches before its first call: either may trace it)."""
  return _other()


def _other():
  """Fresh jitted mask and fused step, traced under the settings patched at the call."""
  return (jax.jit(lambda t, s: _lexed.allowed_tokens(t, s)),
          jax.jit(lambda t, s, k: _lexed.allowed_bits_and_advance(t, s)[1](k)))


def test_packed_slot_check_agrees_with_the_plain_one(setup, plain, monkeypatch):
  assert _lexed.SLOT_CHECK_PACKED["cpu"]  # the default below is the packed form
  monkeypatch.setattr(_lexed, "SLOT_CHECK_PACKED", {"cpu": False})
  _walk(setup, steps=24, seed=19, compare_with=plain)


def test_prefixes_in_a_queue_of_one_slot_a_row_agree(setup, monkeypatch):
  # The lanes share prefixes (4 queue slots: lanes outnumber them 8 to 1), and the
  # rows' distinct prefixes (several a row) run in ceil(sqrt(B)) slots: every slot takes a
  # next prefix, reusing the slot's pushes buffer, against the default schedule.
  assert 4 * _lexed_lanes._SHARE_FROM <= _BATCH * setup.tables.state_seq_lanes.shape[1]
  monkeypatch.setattr(_lexed_lanes, "LANE_POOL", {"cpu": 1})
  monkeypatch.setattr(_lexed_lanes, "PREFIX_POOL", 1)
  _walk(setup, steps=24, seed=23, compare_with=_other())


def test_packed_slot_check_at_a_full_indentation_stack(setup, plain, monkeypatch):
  # Nested blocks up to the indentation stack's last level (`_INDENT`: 6 levels of 4
  # columns), a byte a step, in brackets too: where a newline after `:` needs an INDENT
  # and there is no room left (the packed check's `room` flag), masks equal the plain.
  text = b"".join(b"    " * k + b"if (x and\n  y):\n" for k in range(5)) + b"    " * 5
  text += b"pass\n" + b"    " * 5 + b"while f(a,\n b):"
  rows = [[setup.by_bytes[bytes([c])] for c in text]] * _BATCH
  states = []
  state = _lexed.init_state(setup.tables, _BATCH)
  for k in range(len(text)):
    states.append(state)
    state = setup.advance(setup.tables, state, jax.numpy.asarray([r[k] for r in rows]))
  assert not bool(state.error.any())
  states.append(state)
  packed = [setup.allowed(setup.tables, s) for s in states]
  monkeypatch.setattr(_lexed, "SLOT_CHECK_PACKED", {"cpu": False})
  mask = plain[0]
  newline = setup.by_bytes[b"\n"]
  assert bool(mask(setup.tables, states[-1])[0, newline]) is False  # no room: refused
  for s, want in zip(states, packed):
    assert bool((mask(setup.tables, s) == want).all())


def _states_inside_snippets(setup):
  """_BATCH single rows, each some bytes into a snippet (one token a byte), stacked."""
  rows = []
  for r in range(_BATCH):
    text = SNIPPETS[r % len(SNIPPETS)].encode()
    state = _lexed.init_state(setup.tables, 1)
    for byte in text[:min(len(text) - 1, 6 + 7 * r)]:
      token = jnp.asarray([setup.by_bytes[bytes([byte])]])
      state = setup.advance(setup.tables, state, token)
    assert not bool(state.error[0])
    rows.append(state)
  return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *rows)


def test_queue_with_prefix_heads_and_stored_heads_agrees(setup, monkeypatch):
  # `_lanes` with both the lanes' prefix pushes as `heads` (lanes start after shared
  # prefixes, pushes kept per slot) and stored heads (`heads=`: each lane's first pushed
  # entries at its end), which no caller passes together yet: a slot's fresh lane must
  # start from its prefix's pushes, not zeros (the queue once zeroed its slot's first
  # columns after writing them). Against every lane run whole in one loop: ok, top
  # state, indentation, and the stored entries below the lane's stack sizes.
  tables = setup.tables
  state = _states_inside_snippets(setup)
  seq = _lexed._sequence_items(tables, tables.state_seq_lanes[state.state])
  end, _ = _lexed._end_lane(tables, state.state, _lexed._lane_width(tables))
  items = jnp.concatenate([seq, end[:, None]], axis=1)
  prefixes = (tables.state_prefix_items[state.state],
              jnp.pad(tables.state_lane_prefix[state.state], [(0, 0), (0, 1)],
                      constant_values=-1))
  columns = _lexed_lanes._PREFIX_COLUMNS + 2  # past the prefixes' copied columns too
  monkeypatch.setattr(_lexed_lanes, "LANE_POOL", {"cpu": 0})
  whole = jax.jit(lambda t, s: _lexed_lanes._lanes(t, s, items))(tables, state)
  monkeypatch.setattr(_lexed_lanes, "LANE_POOL", {"cpu": 1})
  assert items.size >= _lexed_lanes._SHARE_FROM * 2  # so the lanes share prefixes
  shared = jax.jit(lambda t, s: _lexed_lanes._lanes(
      t, s, items, prefixes, queue_slots=2, stacks=False, heads=columns))(tables, state)
  for key in ("ok", "top", "paren", "room", "base", "size", "ibase", "isize"):
    np.testing.assert_array_equal(np.asarray(shared[key]), np.asarray(whole[key]), key)
  ok = np.asarray(whole["ok"])
  assert 0 < ok.sum() < ok.size
  size, isize = np.asarray(whole["size"]), np.asarray(whole["isize"])
  below = np.arange(columns)[None, :] < size[:, None]
  assert below[:, 1].any()  # lanes that end with pushes past their first entry
  whole_head = np.asarray(whole["suffix"])[:, :columns]
  np.testing.assert_array_equal(np.where(below, np.asarray(shared["head"]), 0),
                                np.where(below, whole_head, 0))
  ibelow = isize[:, None] > 0
  np.testing.assert_array_equal(np.where(ibelow, np.asarray(shared["ihead"]), 0),
                                np.where(ibelow, np.asarray(whole["isuf"])[:, :1], 0))


def test_shift_after_a_reduction_from_action_agrees(setup):
  # Tables without the derived `goto_chain_shift` (None: as when made from traced
  # leaves) read the shift that follows a reduction from `action` instead of the packed
  # goto entry: the same masks and states, the fused decode step included.
  assert setup.tables.goto_chain_shift is not None
  bare = lambda t: t.replace(goto_chain_shift=None)
  other = (jax.jit(lambda t, s: _lexed.allowed_tokens(bare(t), s)),
           jax.jit(lambda t, s, k: _lexed.allowed_bits_and_advance(bare(t), s)[1](k)))
  _walk(setup, steps=16, seed=29, compare_with=other)
