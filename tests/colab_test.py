"""Executes every notebook in colab/ with nbclient, offline, on CPU, with small inputs.

Each notebook has one cell tagged `parameters` (papermill's convention); the test inserts
a cell after it that shrinks the run (fewer problems, shorter replies), so the notebooks
as stored stay the ones a user runs. A notebook that raises fails its test. The kernel
is the `python3` kernel of the interpreter running pytest (jupyter_client starts it with
`sys.executable`), and the first inserted cell checks that it is this virtual
environment's Python.
"""

import json
import os
import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

COLAB = pathlib.Path(__file__).resolve().parent.parent / "colab"
# Executed copies written next to them by the README's `jupyter execute --output=..._out`
# are not notebooks of the repository.
NOTEBOOKS = sorted(p.name for p in COLAB.glob("*.ipynb") if not p.stem.endswith("_out"))
# What each notebook runs with here: small enough that all of them take a few minutes.
SMALL = {
    "gsm_answer_format.ipynb": "N = 4\nMAX_NEW_TOKENS = 32",
    "gpqa_answer_format.ipynb": "N = 4\nMAX_NEW_TOKENS = 32",
    "your_own_loop.ipynb": "MAX_NEW_TOKENS = 12",
}
MAX_BYTES = 50_000
# Host devices for the pmap/shard_map cells; must be set before the kernel imports jax.
XLA_FLAGS = "--xla_force_host_platform_device_count=8"


def test_the_expected_notebooks_are_there():
  assert NOTEBOOKS == sorted(SMALL)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_small_and_clean(name):
  path = COLAB / name
  assert path.stat().st_size < MAX_BYTES, f"{name} is {path.stat().st_size} bytes"
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert not any(c.outputs for c in code), f"{name} is stored with outputs"
  assert sum("parameters" in c.metadata.get("tags", ()) for c in code) == 1
  # A set-up cell at the top installs the package in Colab and does nothing elsewhere
  # (your_own_loop.ipynb first asks XLA for host devices, before anything imports jax).
  assert any('find_spec("constrained_decoding")' in c.source for c in code[:2])


def _small_copy(name: str):
  nb = nbformat.read(COLAB / name, as_version=4)
  at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", ()))
  nb.cells.insert(at + 1, nbformat.v4.new_code_cell(SMALL[name]))
  check = (f"import sys\nassert sys.prefix == {sys.prefix!r}, "
           f"'kernel runs ' + sys.executable + ', not the Python of ' + {sys.prefix!r}")
  nb.cells.insert(0, nbformat.v4.new_code_cell(check))
  return nb


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path, monkeypatch):
  # Find the `python3` kernel of this environment before one in the user's home folder.
  monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "1")
  nb = _small_copy(name)
  env = dict(os.environ, XLA_FLAGS=XLA_FLAGS, JAX_PLATFORMS="cpu",
             PYTHONWARNINGS="ignore::DeprecationWarning")
  env.pop("COLAB_RELEASE_TAG", None)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": str(COLAB)}})
  try:
    client.execute(env=env)
  finally:  # Keep the executed copy for a look at what failed.
    with open(tmp_path / name, "w", encoding="utf-8") as f:
      nbformat.write(nb, f)
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == "error"]
  assert not errors, json.dumps(errors)[:2000]
