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


def test_host_side_does_not_import_jax():
  modules = _modules_after(
      "import constrained_decoding as cd; cd.Compiler; cd.Regex; cd.Vocabulary; "
      "import constrained_decoding.automata._fsa, constrained_decoding.automata._compose")
  assert "pynini" in modules
  assert "jax" not in modules
