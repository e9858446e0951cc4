"""`advance`'s binary search among a group's edges runs `tables.edge_search_steps` halvings.

A search never leaves its group, so the bound is the largest group's (ceil(log2(n + 1))
for n edges), not all E edges'. Oracles: a plain-Python lower-bound search (the fewest
halvings that find every index), the byte language of a character class (every byte of
it is taken, no other), and `advance` with the full bound (`edge_search_steps=None`,
log2(E + 1) halvings as before) on random walks. The bound is static, so it is carried
through stacking (largest part), padding buckets (one compiled step per bucket) and
tables files (header; files without it get the bound their arrays need).
"""

import dataclasses
import json
import os
import random
import sys
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import tables as _tables
from constrained_decoding.errors import TablesFileError

sys.path.insert(0, os.path.dirname(__file__))  # The small schemas live in registers_test.py.
from registers_test import SCHEMAS, VOCAB  # noqa: E402  pylint: disable=wrong-import-position


def _found(n: int, index: int, steps: int) -> bool:
  """Whether `steps` halvings of a lower-bound search over n sorted items reach `index`."""
  lo, hi = 0, n
  for _ in range(steps):
    if lo < hi:
      mid = (lo + hi) // 2
      lo, hi = (mid + 1, hi) if mid < index else (lo, mid)
  return lo == index


def _class_regex(k: int) -> str:
  """A class of exactly 2^k bytes ('0' onwards, one range), then 'z'."""
  return f"[0-{chr(ord('0') + 2 ** k - 1)}]z"


@pytest.fixture(scope="module")
def exact_compiler(byte_vocab, tmp_path_factory):
  """Buckets of 1: the bound is the largest group's, with no floor."""
  return cd.Compiler(byte_vocab, cd.CompileOptions(
      min_bucket=1, cache_dir=str(tmp_path_factory.mktemp("search"))))


def _first_tokens(tables, tokens, *, constraint: int = 0, steps="keep") -> np.ndarray:
  """Per token, whether `advance` from the start of `constraint` takes it (one row each);
  `steps` replaces the tables' bound (device arrays: kept as given)."""
  tables = jax.device_put(tables)
  if steps != "keep":
    tables = dataclasses.replace(tables, edge_search_steps=steps)
  state = cd.init_state(tables, len(tokens), constraint_ids=[constraint] * len(tokens))
  after = jax.jit(cd.advance)(tables, state, jnp.asarray(tokens, jnp.int32))
  return ~np.asarray(after.error)


def test_the_bound_is_the_fewest_halvings_that_find_every_edge_of_a_group():
  for n in range(0, 300):
    fewest = next(s for s in range(12) if all(_found(n, i, s) for i in range(n)))
    edge_start = np.array([0, 3, 3, 3 + n, 3 + n], np.int32)  # groups of 3, 0, n, 0
    assert _tables.edge_search_steps(edge_start) == max(fewest, 2), n  # 3 needs 2
    assert _tables.edge_search_steps(edge_start, min_bucket=64) == max(fewest, 7), n
  assert _tables.edge_search_steps(np.zeros(1, np.int32), min_bucket=0) == 0  # no edges


@pytest.mark.parametrize("k", range(1, 7))
def test_a_group_of_exactly_2_to_the_k_edges_takes_k_plus_1_halvings(k, exact_compiler):
  tables = exact_compiler.compile(cd.Regex(_class_regex(k)))
  sizes = np.diff(np.asarray(tables.edge_start))
  assert sizes.max() == 2 ** k and tables.edge_search_steps == k + 1
  assert tables.edge_tokens.shape[0].bit_length() > k + 1  # fewer than before
  members = [ord("0") + i for i in range(2 ** k)]
  others = [ord("0") - 1, ord("0") + 2 ** k, ord("z"), 0, 255]
  taken = _first_tokens(tables, members + others)
  assert taken[:len(members)].all() and not taken[len(members):].any()
  # One halving fewer misses an edge of the group (the second: its last step moves lo).
  short = _first_tokens(tables, members, steps=k)
  assert not short.all() and not short[1]
  np.testing.assert_array_equal(_first_tokens(tables, members + others, steps=None), taken)


def test_stacked_tables_search_as_deep_as_their_largest_part(exact_compiler):
  small = exact_compiler.compile(cd.Regex("(yes|no)"))
  large = exact_compiler.compile(cd.Regex(_class_regex(6)))
  assert (small.edge_search_steps, large.edge_search_steps) == (2, 7)
  members = [ord("0") + i for i in range(64)]
  for parts, at in (([small, large], 1), ([large, small], 0)):
    stacked = cd.stack_tables(parts, min_bucket=1)
    assert stacked.edge_search_steps == 7
    assert _first_tokens(stacked, members, constraint=at).all()
    assert list(_first_tokens(stacked, [ord("y"), ord("n"), ord("0")],
                              constraint=1 - at)) == [True, True, False]


def test_one_bucket_for_all_gives_one_bound_and_one_shape_key(exact_compiler):
  """`generate(table_bucket=)` pads through `stack_tables(min_bucket=)`: constraints
  that fit the bucket must share a compiled step, so the bound is the bucket's."""
  small = exact_compiler.compile(cd.Regex("(yes|no)"))
  large = exact_compiler.compile(cd.Regex(_class_regex(5)))
  a, b = (cd.stack_tables([t], min_bucket=64) for t in (small, large))
  assert a.edge_search_steps == b.edge_search_steps == 7
  assert a.shape_key == b.shape_key
  # Without the bucket, the bound is part of the key: equal keys share one step.
  assert small.shape_key[-1] == small.edge_search_steps == 2


def test_host_tables_never_keep_a_bound_below_what_their_edges_need(exact_compiler):
  tables = exact_compiler.compile(cd.Regex(_class_regex(4)))
  assert dataclasses.replace(tables, edge_search_steps=1).edge_search_steps == 5
  assert dataclasses.replace(tables, edge_search_steps=None).edge_search_steps == 5
  assert dataclasses.replace(tables, edge_search_steps=9).edge_search_steps == 9
  leaves, tree = jax.tree.flatten(tables)
  assert jax.tree.unflatten(tree, leaves).edge_search_steps == 5
  assert jax.device_put(tables).edge_search_steps == 5  # static: kept on the device


def _rewrite_header(path, change) -> None:
  """Rewrites the header of the tables file at `path` with `change(header dict)`."""
  with np.load(path) as archive:
    arrays = {name: archive[name] for name in archive.files}
  header = json.loads(bytes(arrays["__header__"]).decode())
  change(header)
  arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
  with open(path, "wb") as f:
    np.savez_compressed(f, **arrays)


def test_saved_tables_keep_the_bound_and_files_without_it_get_what_they_need(
    byte_vocab, exact_compiler, tmp_path):
  tables = cd.stack_tables([exact_compiler.compile(cd.Regex(_class_regex(3)))],
                           min_bucket=64)  # a floor above the arrays' need: kept
  path = str(tmp_path / "t.cdt")
  tables.save(path, vocab=byte_vocab)
  assert cd.read_tables_header(path).edge_search_steps == 7
  loaded = cd.load_tables(path, vocab=byte_vocab)
  assert loaded.edge_search_steps == 7 and loaded.shape_key == tables.shape_key
  _rewrite_header(path, lambda h: h.pop("edge_search_steps"))  # written before the field
  assert cd.read_tables_header(path).edge_search_steps is None
  old = cd.load_tables(path, vocab=byte_vocab)
  assert old.edge_search_steps == 4  # the class of 8: ceil(log2(9))
  members = [ord("0") + i for i in range(8)]
  assert _first_tokens(old, members).all()
  _rewrite_header(path, lambda h: h.update(edge_search_steps=1))  # too small: raised
  assert cd.load_tables(path, vocab=byte_vocab).edge_search_steps == 4
  for bad in ("7", -1, 2.5, True):
    _rewrite_header(path, lambda h, bad=bad: h.update(edge_search_steps=bad))
    with pytest.raises(TablesFileError, match="edge_search_steps"):
      cd.load_tables(path, vocab=byte_vocab)
  assert zipfile.is_zipfile(path)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_register_tables_step_as_with_the_full_search_on_random_walks(name):
  """Masks, states and registers bit-equal to the search over all E edges, at batch 8,
  on walks of random allowed tokens (and random tokens, allowed or not, now and then)."""
  tables = jax.device_put(cd.Compiler(VOCAB).compile(cd.JsonSchema(SCHEMAS[name])))
  assert tables.edge_search_steps < tables.edge_tokens.shape[0].bit_length()
  full = dataclasses.replace(tables, edge_search_steps=None)
  allowed_bits, advance = jax.jit(cd.allowed_bits), jax.jit(cd.advance)
  rng = random.Random(name)
  state = cd.init_state(tables, 8)
  for _ in range(60):
    bits = np.asarray(allowed_bits(tables, state))
    np.testing.assert_array_equal(bits, np.asarray(allowed_bits(full, state)))
    allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
    tokens = [rng.choice(np.flatnonzero(row[:tables.vocab_size]).tolist() or [0])
              if rng.random() < 0.9 else rng.randrange(tables.vocab_size) for row in allowed]
    tokens = jnp.asarray(tokens, jnp.int32)
    after = advance(tables, state, tokens)
    expected = advance(full, state, tokens)
    for field in ("state", "stack", "depth", "registers", "done", "error"):
      np.testing.assert_array_equal(np.asarray(getattr(after, field)),
                                    np.asarray(getattr(expected, field)), err_msg=field)
    state = after.replace(done=jnp.zeros_like(after.done), error=jnp.zeros_like(after.error))
