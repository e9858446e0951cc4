"""`automata/_array_file.py`: the per-vocabulary cache's array files, read as private
mappings (the round trip and damaged files: `token_level_speed_test.py`)."""

import os

import numpy as np
import pytest

from constrained_decoding.automata import _array_file


def test_array_file_reads_a_private_snapshot(tmp_path):
  """Arrays read stay as read: writing to them leaves the file alone (and a second read
  sees the file's values), and replacing or deleting the file (a new version, pruning)
  leaves them intact. An empty file is not an array file."""
  path = tmp_path / "x.arrays"
  with open(path, "wb") as f:
    _array_file.write(f, {"a": np.arange(5000, dtype=np.int64), "b": np.array([7, 8])})
  first = _array_file.read(str(path))
  first["a"][:] = -1
  again = _array_file.read(str(path))
  np.testing.assert_array_equal(again["a"], np.arange(5000))
  with open(tmp_path / "new.arrays", "wb") as f:
    _array_file.write(f, {"a": np.zeros(3, np.int64)})
  os.replace(tmp_path / "new.arrays", path)
  np.testing.assert_array_equal(again["a"], np.arange(5000))
  os.remove(path)
  np.testing.assert_array_equal(again["b"], [7, 8])
  assert (first["a"] == -1).all()
  path.write_bytes(b"")
  with pytest.raises(ValueError):
    _array_file.read(str(path))
