"""The public surface and the host/device import boundary (STYLE.md G1, G9)."""

import subprocess
import sys

import pytest

import constrained_decoding as cd


@pytest.mark.parametrize("name", cd.__all__)
def test_every_public_name_imports(name):
  assert getattr(cd, name) is not None


def _modules_after(statement: str) -> set[str]:
  code = f"import sys; {statement}; print(' '.join(sys.modules))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  return set(out.stdout.split())


def test_device_side_does_not_import_pynini():
  modules = _modules_after("import constrained_decoding.runtime, constrained_decoding.tables")
  assert "jax" in modules
  assert "pynini" not in modules


def test_host_side_does_not_import_the_models_or_the_runtime():
  modules = _modules_after(
      "import constrained_decoding as cd; cd.Compiler; cd.Regex; cd.Vocabulary; "
      "import constrained_decoding.automata._fsa, constrained_decoding.automata._compose")
  assert "pynini" in modules
  assert "flax" not in modules
  assert "constrained_decoding.runtime" not in modules


# Compiles tables, then hands them to jax before anything else of the package (the
# runtime above all) is imported: the pytree must be registered with the class.
_FRESH_PYTREE_SCRIPT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import constrained_decoding as cd
vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None], eos_ids=[256])
tables = cd.Compiler(vocab).compile(cd.Regex(r"ab+"))
import sys
assert "constrained_decoding.runtime" not in sys.modules
import jax, jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P
n = jax.jit(lambda t: t.accepting.sum())(tables)
placed = jax.device_put(tables)
assert isinstance(placed.mask_bits, jax.Array) and placed.vocab_size == tables.vocab_size
pm = jax.pmap(lambda t, x: x + t.start[0], in_axes=(None, 0))(tables, jnp.arange(2))
mesh = Mesh(jax.devices()[:2], ("rows",))
sm = jax.shard_map(lambda t, x: x + t.start[0], mesh=mesh, in_specs=(P(), P("rows")),
                   out_specs=P("rows"))(tables, jnp.arange(2))
leaves, treedef = jax.tree_util.tree_flatten(tables)
assert jax.tree_util.tree_unflatten(treedef, leaves).shape_key == tables.shape_key
print("ok", int(n), pm.tolist(), sm.tolist())
"""


def test_tables_are_a_pytree_in_a_fresh_process():
  out = subprocess.run([sys.executable, "-c", _FRESH_PYTREE_SCRIPT], capture_output=True,
                       text=True, check=False)
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith("ok ")
