"""The vocabulary trie and the detokenizing FST T_V (Alg. 1) against the vocabulary."""

import random
import time

import numpy as np
import pynini
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _array_file
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _loops
from constrained_decoding.automata import _wide


def _token_string_fst(ids) -> pynini.Fst:
  f = pynini.Fst()
  f.add_states(len(ids) + 1)
  f.set_start(0)
  f.set_final(len(ids))
  one = pynini.Weight.one("tropical")
  for k, i in enumerate(ids):
    f.add_arc(k, pynini.Arc(i + 1, i + 1, one, k + 1))
  return f


def _byte_string_fst(data: bytes) -> pynini.Fst:
  return _token_string_fst([b for b in data])  # byte b is label b + 1, like token ids


def test_trie_spells_every_token(gemma_vocab, gemma_compiler):
  trie = gemma_compiler.trie
  rng = random.Random(0)
  for token in rng.sample(range(gemma_vocab.num_tokens), 2000):
    data = gemma_vocab.token_bytes[token]
    node = 0
    for b in data or b"":
      lo, hi = trie.child_start[node], trie.child_start[node + 1]
      slot = lo + np.searchsorted(trie.child_byte[lo:hi], b)
      assert trie.child_byte[slot] == b
      node = trie.child_node[slot]
    if data is None:
      assert token not in trie.token_ids
    else:
      assert trie.node_depth[node] == len(data)
      assert token in trie.token_ids[trie.token_start[node]:trie.token_start[node + 1]]
  assert len(trie.token_ids) == sum(b is not None for b in gemma_vocab.token_bytes)


def test_detokenizing_fst_transduces_tokens_to_bytes(gemma_vocab, gemma_compiler):
  started = time.perf_counter()
  fst = _detokenizer.detokenizing_fst(gemma_compiler.trie)
  assert time.perf_counter() - started < 5  # generous here; benchmarked separately
  # Composing on the output side explores only paths spelling the given bytes (the
  # input side would walk the whole trie through its epsilon-input arcs).
  fst.arcsort("olabel")
  rng = random.Random(1)
  texted = [i for i, b in enumerate(gemma_vocab.token_bytes) if b is not None]
  for _ in range(20):
    ids = rng.sample(texted, rng.randint(1, 6)) + [238]  # 238 is <0x00>
    data = gemma_vocab.decode(ids)
    tokenizations = pynini.compose(fst, _byte_string_fst(data)).project("input")
    assert pynini.compose(_token_string_fst(ids), tokenizations).num_states() > 0
    other = ids[:-1] + [239]  # <0x01> instead of <0x00>: different bytes
    assert pynini.connect(pynini.compose(_token_string_fst(other), tokenizations)).num_states() == 0


def test_trie_disk_cache_round_trip(byte_vocab, tmp_path):
  built = _detokenizer.load_or_build_trie(byte_vocab, str(tmp_path))
  loaded = _detokenizer.load_or_build_trie(byte_vocab, str(tmp_path))
  for name in ("child_start", "child_byte", "child_node", "node_depth", "token_start",
               "token_ids"):
    np.testing.assert_array_equal(getattr(built, name), getattr(loaded, name))
  assert len(list(tmp_path.iterdir())) == 1


def test_duplicate_token_bytes_share_a_node():
  vocab = cd.Vocabulary.from_token_bytes([b"ab", b"a", b"ab", None, b"\x00"], eos_ids=[3])
  trie = _detokenizer.build_trie(vocab)
  assert trie.num_nodes == 4  # root, "\0", "a", "ab"
  node_ab = int(np.nonzero(trie.node_depth == 2)[0][0])
  assert sorted(trie.token_ids[trie.token_start[node_ab]:trie.token_start[node_ab + 1]]) == [0, 2]


def test_detokenizing_fst_disk_cache(byte_vocab, tmp_path):
  import pynini  # pylint: disable=g-import-not-at-top,redefined-outer-name,reimported

  built = _detokenizer.load_or_build_detokenizing_fst(byte_vocab, str(tmp_path))
  loaded = _detokenizer.load_or_build_detokenizing_fst(byte_vocab, str(tmp_path))
  assert pynini.equal(built, loaded)
  assert built.num_states() == 1  # bytes only: every token is one arc from the root
  assert sum(1 for _ in built.arcs(0)) == 256


def test_unwritable_cache_dir_warns_once_and_compiles(tmp_path, monkeypatch):
  """The disk cache is best effort: a directory that cannot be created (here a path
  under a regular file) gives one warning, and compiles still succeed and agree."""
  monkeypatch.setattr(_loops, "MIN_TERMINAL_TOKENS", 8)  # Wide states in a tiny vocabulary.
  writes = []
  original = _wide.write_cache_file
  monkeypatch.setattr(_wide, "write_cache_file",
                      lambda *a, **k: writes.append(a) or original(*a, **k))
  blocker = tmp_path / "not_a_directory"
  blocker.write_bytes(b"")
  vocab = cd.Vocabulary.from_token_bytes(
      [bytes([b]) for b in range(256)] + [b"ab", b"abc", None], eos_ids=[258])
  spec = cd.Regex(r'"([^"\\]|\\.)*"|ab+c')
  with pytest.warns(RuntimeWarning, match="cannot write its cache") as caught:
    compiler = cd.Compiler(vocab, cd.CompileOptions(cache_dir=str(blocker / "cache")))
    tables = compiler.compile(spec)
    compiler.compile(cd.Regex(r"[^\n]*x"))  # More terminals to cache: no second warning.
  assert sum("cannot write its cache" in str(w.message) for w in caught) == 1
  assert len(writes) > 1 and tables.terminal_bits.any()  # Terminals tried to be cached.
  reference = cd.Compiler(vocab, cd.CompileOptions(cache_dir=None)).compile(spec)
  for name in ("mask_bits", "edge_tokens", "edge_targets", "terminal_bits"):
    np.testing.assert_array_equal(getattr(tables, name), getattr(reference, name))


def _trie_fields(trie) -> list:
  return [getattr(trie, name) for name in _detokenizer._FIELDS]  # pylint: disable=protected-access


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "other_arrays"])
def test_a_damaged_trie_cache_file_is_rebuilt(byte_vocab, tmp_path, damage):
  expected = _trie_fields(_detokenizer.build_trie(byte_vocab))
  _detokenizer.load_or_build_trie(byte_vocab, str(tmp_path))
  (path,) = tmp_path.iterdir()
  assert path.name.endswith(_detokenizer.ARRAYS_SUFFIX)  # An `_array_file`, not .npz.
  data = path.read_bytes()
  if damage == "other_arrays":  # Readable, but without the trie's arrays.
    with open(path, "wb") as f:
      _array_file.write(f, {"child_start": np.zeros(3, np.int32)})
  else:
    path.write_bytes({"truncated": data[:len(data) - 100], "garbage": b"x" * len(data),
                      "empty": b""}[damage])
  assert _detokenizer.read_cache_file(str(path), _detokenizer._FIELDS) is None  # pylint: disable=protected-access
  for got, want in zip(_trie_fields(_detokenizer.load_or_build_trie(byte_vocab,
                                                                      str(tmp_path))),
                       expected):
    np.testing.assert_array_equal(got, want)
  assert path.read_bytes() == data  # Rewritten whole.


def test_a_trie_cache_of_an_older_format_is_ignored(byte_vocab, tmp_path):
  """A v1 file (.npz) under the same fingerprint, even a readable one holding another
  trie, is never read: the current version's name differs."""
  expected = _trie_fields(_detokenizer.build_trie(byte_vocab))
  old = tmp_path / f"trie-v1-{byte_vocab.fingerprint}.npz"
  np.savez(old, **{name: np.zeros(2, np.int32) for name in _detokenizer._FIELDS})  # pylint: disable=protected-access
  for got, want in zip(_trie_fields(_detokenizer.load_or_build_trie(byte_vocab,
                                                                      str(tmp_path))),
                       expected):
    np.testing.assert_array_equal(got, want)
  (path,) = tmp_path.iterdir()  # The dead format pruned on write.
  assert path.name == f"trie-v2-{byte_vocab.fingerprint}{_detokenizer.ARRAYS_SUFFIX}"


def test_cache_files_by_suffix_round_trip(tmp_path):
  arrays = {"a": np.arange(5, dtype=np.int16), "b": np.ones((2, 3), np.uint8)}
  for suffix in (_detokenizer.ARRAYS_SUFFIX, ".npz"):
    path = str(tmp_path / f"x{suffix}")
    assert _detokenizer.write_cache_file(str(tmp_path), path, arrays)
    with open(path, "rb") as f:
      assert (f.read(len(_array_file.MAGIC)) == _array_file.MAGIC) == (suffix != ".npz")
    got = _detokenizer.read_cache_file(path)
    assert sorted(got) == ["a", "b"]
    for name, value in arrays.items():
      np.testing.assert_array_equal(got[name], value)
      assert got[name].dtype == value.dtype
    assert list(_detokenizer.read_cache_file(path, ["b"])) == ["b"]
    assert _detokenizer.read_cache_file(path, ["b", "missing"]) is None
