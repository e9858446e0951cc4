"""`_arrays.sorted_unique` and `_arrays.unique_rows` against `np.unique` itself.

Every flag combination, on random integer arrays (empty, one element, all equal, sorted,
negative values, extremes of the dtype, 2-D input) and on rows narrow enough to pack into
one key or too wide for it (the lexsort path): same values, dtypes and shapes.
"""

import itertools

import numpy as np
import pytest

from constrained_decoding import _arrays

@pytest.fixture(name="no_small_cutoff")
def fixture_no_small_cutoff(monkeypatch):
  """Every input, however small, takes the sorting paths (not np.unique's)."""
  monkeypatch.setattr(_arrays, "SMALL_VALUES", 0)
  monkeypatch.setattr(_arrays, "SMALL_POSITIONS", 0)


_FLAGS = [dict(zip(("return_index", "return_inverse", "return_counts"), bits))
          for bits in itertools.product([False, True], repeat=3)]


def _assert_same(got, expected):
  got = got if isinstance(got, tuple) else (got,)
  expected = expected if isinstance(expected, tuple) else (expected,)
  assert len(got) == len(expected)
  for g, e in zip(got, expected):
    assert g.dtype == e.dtype and g.shape == e.shape
    np.testing.assert_array_equal(g, e)


def _arrays_1d(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(2, 500))
  yield np.zeros(0, np.int64)
  yield np.array([7], np.int32)
  yield np.full(n, -3, np.int64)
  yield rng.integers(-5, 5, n).astype(np.int8)
  yield rng.integers(-10**6, 10**6, n)
  yield np.sort(rng.integers(-20, 20, n))  # Already sorted: no sort at all.
  yield rng.integers(0, 2**32, n, dtype=np.uint32)
  yield rng.integers(0, 2, n).astype(bool)
  yield rng.integers(-50, 50, (n // 10 + 1, 3)).astype(np.int16)  # Inverse keeps the shape.
  info = np.iinfo(np.int64)  # Too wide to pack the index: the stable argsort path.
  yield np.array([info.max, info.min, 0, info.max, -1, info.min], np.int64)
  yield np.array([2**64 - 1, 0, 2**64 - 1, 5], np.uint64)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("flags", _FLAGS, ids=str)
def test_sorted_unique_equals_np_unique(seed, flags, no_small_cutoff):
  for values in _arrays_1d(seed):
    _assert_same(_arrays.sorted_unique(values, **flags), np.unique(values, **flags))


def _rows(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(2, 400))
  yield np.zeros((0, 2), np.int32)
  yield np.array([[4, -1]], np.int64)
  yield np.full((n, 3), 9, np.int32)
  yield rng.integers(-3, 3, (n, 2))
  yield rng.integers(0, 4, (n, 300)).astype(np.int32)  # 4**300 > 2**63: lexsort.
  yield rng.integers(-2**40, 2**40, (n, 2))  # Spans' product too big: lexsort.
  yield rng.integers(0, 2, (n, 5)).astype(bool)
  yield np.array([[2**64 - 1, 1], [0, 1], [2**64 - 1, 1]], np.uint64)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("flags", _FLAGS, ids=str)
def test_unique_rows_equals_np_unique_axis0(seed, flags, no_small_cutoff):
  for rows in _rows(seed):
    _assert_same(_arrays.unique_rows(rows, **flags), np.unique(rows, axis=0, **flags))


@pytest.mark.parametrize("flags", _FLAGS, ids=str)
def test_sizes_around_the_small_cutoffs(flags):
  rng = np.random.default_rng(0)
  for n in (_arrays.SMALL_VALUES - 1, _arrays.SMALL_VALUES, _arrays.SMALL_POSITIONS - 1,
            _arrays.SMALL_POSITIONS, 3000):
    values = rng.integers(-n, n, n)
    _assert_same(_arrays.sorted_unique(values, **flags), np.unique(values, **flags))
    rows = rng.integers(-3, 3, (n, 2))
    _assert_same(_arrays.unique_rows(rows, **flags), np.unique(rows, axis=0, **flags))
