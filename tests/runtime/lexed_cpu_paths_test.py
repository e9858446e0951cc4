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
import pytest

from lexed_python_test import _BATCH  # pylint: disable=import-error  (same directory)
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
