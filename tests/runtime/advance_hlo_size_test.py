"""The compiled `advance` does not grow with the tables: a regression guard for compile time.

An unrolled binary search over edges (one dependent gather per halving) made jax 0.12's
XLA take minutes to compile `advance` for register tables. Counting gathers in the traced
program checks the structure, not a timing: register tables with 8x more edges trace to
the same number of gathers.
"""

import sys

import jax
import jax.numpy as jnp

import constrained_decoding as cd

sys.path.insert(0, __file__.rsplit("/", 1)[0])  # The schemas live in registers_test.py.
from registers_test import CLOSED, KEYS, VOCAB  # noqa: E402


def _gathers(tables: cd.ConstraintTables) -> int:
  """Gathers in the traced `advance` of `tables`, batch 2 (loop bodies count once)."""
  state = cd.init_state(tables, 2)
  jaxpr = jax.make_jaxpr(cd.advance)(tables, state, jnp.zeros((2,), jnp.int32))
  return str(jaxpr).count("gather[")


def test_advance_gathers_do_not_grow_with_the_edges():
  compiler = cd.Compiler(VOCAB)
  small = compiler.compile(cd.JsonSchema(
      {**CLOSED, "required": [], "properties": {k: {"type": "integer"} for k in KEYS[:8]}}))
  large = compiler.compile(cd.JsonSchema(CLOSED))
  assert small.has_registers and large.has_registers
  assert large.edge_tokens.shape[0] >= 8 * small.edge_tokens.shape[0]
  assert _gathers(large) == _gathers(small)
