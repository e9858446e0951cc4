"""The compile cache's one pruning policy (`_cache.prune_cache`) over every file kind:
dead formats deleted, then least recently used files past `max_cache_bytes`, the file
just written kept; hits refresh their file; a pruned cache only costs a recompute."""

import os
import random

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import _cache
from constrained_decoding import lexed_tables
from constrained_decoding import tables as _tables
from constrained_decoding.automata import _counting
from constrained_decoding.automata import _detokenizer

_TEXT = ('start: (_NEWLINE | stmt)*\n'
         'stmt: NAME ":" _NEWLINE _INDENT stmt+ _DEDENT | NAME _NEWLINE\n'
         '_NEWLINE: /\\r?\\n[\\t ]*/+\nNAME: /[a-z]+/\n%declare _INDENT _DEDENT\n')
# Together these write every kind but tv-v* (trie, class counts with their -subtrie- and
# -inner- siblings, wide, lexer, lexed).
_SPECS = (
    cd.Regex(r"[a-z]{3,40}"),
    cd.JsonSchema({"type": "object", "properties": {"a": {"type": "string", "maxLength": 30},
                                                    "b": {"type": "string"}}}),
    cd.Regex(r'"[^"\\]*"'),
    cd.Grammar(_TEXT, syntax="lark", lexer=True, indentation=cd.Indentation(), start="start"),
)


@pytest.fixture(scope="module")
def vocab():
  """Bytes, a few multi-byte tokens and an end-of-sequence token (small: fast)."""
  extra = [b"if", b"x:", b"\n  ", b'ab"', b"abc"]
  return cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + extra + [None],
                                        eos_ids=[256 + len(extra)])


def _current(kind: str, rest: str = "x") -> str:
  fmt = _cache.FORMATS[kind]
  return f"{kind}-v{fmt.version}-{rest}{fmt.suffix}"


def _write(path, size: int, mtime: float) -> None:
  path.write_bytes(b"x" * size)
  os.utime(path, (mtime, mtime))


def _sizes(cache_dir) -> dict:
  return {n: os.path.getsize(os.path.join(cache_dir, n)) for n in os.listdir(cache_dir)
          if _cache._is_current(n)}  # pylint: disable=protected-access


def _compile_all(vocab, cache_dir, **options) -> list:
  _counting._CLASS_CACHE.clear()  # pylint: disable=protected-access  (as a new process)
  compiler = cd.Compiler(vocab, cd.CompileOptions(cache_dir=cache_dir, memoize=False,
                                                  **options))
  return [compiler.compile(spec) for spec in _SPECS]


def _assert_same(a, b) -> None:
  fields = (lexed_tables._ARRAY_FIELDS if isinstance(a, cd.LexedTables)  # pylint: disable=protected-access
            else _tables._ARRAY_FIELDS)  # pylint: disable=protected-access
  for field in fields:
    x, y = getattr(a, field), getattr(b, field)
    if x is None or y is None:
      assert x is None and y is None, field
      continue
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape, field
    np.testing.assert_array_equal(x, y, err_msg=field)


def test_every_writer_uses_the_table_versions():
  from constrained_decoding import _lexed_cache  # pylint: disable=g-import-not-at-top
  from constrained_decoding.automata import _token_table, _wide  # pylint: disable=g-import-not-at-top
  assert _detokenizer.TRIE_FORMAT_VERSION == _cache.FORMATS["trie"].version
  assert _counting._COUNTS_FORMAT == _cache.FORMATS["class-counts"].version  # pylint: disable=protected-access
  assert _token_table.TOKEN_TABLE_FORMAT_VERSION == _cache.FORMATS["lexer"].version
  assert _lexed_cache.LEXED_CACHE_VERSION == _cache.FORMATS["lexed"].version
  assert _wide.WIDE_FORMAT_VERSION == _cache.FORMATS["wide"].version


def test_dead_formats_and_stale_temporaries_are_deleted(tmp_path):
  keep = [_current(kind) for kind in _cache.FORMATS]
  keep += [_current("class-counts", "x-subtrie-y"), "notes.txt", "triex-v1-a.npz",
           "tmpfresh.npz"]
  dead = [f"{kind}-v{fmt.version + 1}-x{fmt.suffix}" for kind, fmt in _cache.FORMATS.items()]
  dead += [f"{kind}-v0-x{fmt.suffix}" for kind, fmt in _cache.FORMATS.items()]
  dead += [f"wide-v{_cache.FORMATS['wide'].version}-x.npz",  # The current version, old suffix.
           "class-counts-v1-x-subtrie-y.npz", "tmpold.npz", "tmpold.tmp", "tmpold.fst"]
  for name in keep + dead:
    (tmp_path / name).write_bytes(b"x")
  for name in ("tmpold.npz", "tmpold.tmp", "tmpold.fst"):
    os.utime(tmp_path / name, (1000, 1000))  # Left by a writer that died long ago.
  (tmp_path / "models").mkdir()
  (tmp_path / "models" / "trie-v0-weights.npz").write_bytes(b"x")
  _cache.prune_cache(str(tmp_path), max_bytes=1 << 20)
  assert sorted(os.listdir(tmp_path)) == sorted(keep + ["models"])
  assert os.listdir(tmp_path / "models") == ["trie-v0-weights.npz"]  # Not looked into.


def test_least_recently_used_go_first_across_kinds(tmp_path):
  rng = random.Random(0)
  kinds = list(_cache.FORMATS)
  names = [_current(rng.choice(kinds), str(i)) for i in range(30)]
  times = rng.sample(range(1000, 100000), len(names))
  for name, t in zip(names, times):
    _write(tmp_path / name, 100, t)
  _write(tmp_path / "unrelated.bin", 5000, 1)  # Not the cache's: neither counted nor deleted.
  _cache.prune_cache(str(tmp_path), max_bytes=3000)  # 3000 bytes: at the limit, kept.
  assert len(os.listdir(tmp_path)) == 31
  _cache.prune_cache(str(tmp_path), max_bytes=2000)  # Down to 3/4 of it: 15 newest.
  by_age = [n for _, n in sorted(zip(times, names))]
  assert sorted(_sizes(tmp_path)) == sorted(by_age[-15:])
  assert (tmp_path / "unrelated.bin").exists()


def test_a_write_keeps_the_total_within_the_limit(tmp_path):
  for i, kind in enumerate(_cache.FORMATS):
    _write(tmp_path / _current(kind), 400, 1000 + i)
  path = str(tmp_path / _current("trie", "new"))
  assert _detokenizer.write_cache_file(str(tmp_path), path, {"a": np.zeros(10, np.uint8)},
                                       max_bytes=1500)
  sizes = _sizes(tmp_path)
  assert os.path.basename(path) in sizes and sum(sizes.values()) <= 1500
  # The limit a Compiler set for the directory applies to writers given none.
  _cache.set_max_bytes(str(tmp_path), 700)
  path2 = str(tmp_path / _current("lexer", "new"))
  assert _detokenizer.write_cache_file(str(tmp_path), path2, {"a": np.zeros(10, np.uint8)})
  sizes = _sizes(tmp_path)
  assert os.path.basename(path2) in sizes and sum(sizes.values()) <= 700


def test_writes_stay_within_the_limit_with_few_scans(tmp_path, spy):
  """A process prunes on its first write, then once per 1/16 of the limit written, to
  15/16 of it: every write in between still fits."""
  scans = spy(_cache, "prune_cache")
  cache = str(tmp_path)
  _cache.set_max_bytes(cache, 16000)

  def raw(f, arrays):
    f.write(arrays["data"])

  for i in range(60):
    path = str(tmp_path / _current(list(_cache.FORMATS)[i % 6], str(i)))
    assert _detokenizer.write_cache_file(cache, path, {"data": b"x" * 400}, raw)
    assert os.path.exists(path) and sum(_sizes(cache).values()) <= 16000, i
  assert 5 <= len(scans) <= 60 // 2  # First write, then one in every 1000 bytes (3 files).
  assert sum(_sizes(cache).values()) > 8000  # Kept what fits.


def test_the_file_just_written_survives_alone_over_the_limit(tmp_path):
  for i in range(3):
    _write(tmp_path / _current("wide", str(i)), 10, 5000 + i)  # Newer than...
  path = str(tmp_path / _current("class-counts", "big"))
  assert _detokenizer.write_cache_file(str(tmp_path), path, {"a": np.zeros(4096, np.uint8)},
                                       max_bytes=100)
  os.utime(path, (1000, 1000))  # ...this one, even as the oldest: kept while written.
  _cache.prune_cache(str(tmp_path), max_bytes=100, keep=path)
  assert list(_sizes(tmp_path)) == [os.path.basename(path)]


def test_hits_refresh_their_files(vocab, tmp_path):
  cache = str(tmp_path)
  _compile_all(vocab, cache)
  kinds = {n.split("-v")[0] for n in _sizes(cache)}
  assert kinds == set(_cache.FORMATS) - {"tv"}

  def refreshed(names):
    return {n.split("-v")[0] for n in names if os.path.getmtime(os.path.join(cache, n)) > 1000}

  def age():
    for n in os.listdir(cache):
      os.utime(os.path.join(cache, n), (1000, 1000))
    return sorted(os.listdir(cache))

  names = age()
  _compile_all(vocab, cache)
  assert sorted(os.listdir(cache)) == names  # All hits: nothing written, nothing pruned.
  assert refreshed(names) == kinds - {"lexer"}  # The lexed tables hit: no lexer table read.
  for sibling in ("-subtrie-", "-inner-"):  # The counts' sub-tries, inner tokens.
    assert any(os.path.getmtime(os.path.join(cache, n)) > 1000 for n in names
               if sibling in n), sibling
  for n in names:
    if n.startswith("lexed-"):
      os.remove(os.path.join(cache, n))
  names = age()
  _compile_all(vocab, cache)
  assert "lexer" in refreshed(names)
  # The detokenizing FST (not used by a compile).
  pytest.importorskip("pynini")
  _detokenizer.load_or_build_detokenizing_fst(vocab, cache)
  names = age()
  _detokenizer.load_or_build_detokenizing_fst(vocab, cache)
  assert "tv" in refreshed(names)


def test_a_pruned_or_damaged_cache_gives_identical_tables(vocab, tmp_path):
  expected = _compile_all(vocab, None)
  cache = str(tmp_path)
  # Pruned during the compile itself: every write leaves only the file just written.
  for got, want in zip(_compile_all(vocab, cache, max_cache_bytes=1), expected):
    _assert_same(got, want)
  assert len(_sizes(cache)) == 1
  _cache.set_max_bytes(cache, 1 << 30)
  _compile_all(vocab, cache)
  # Half the files pruned (by another process, say), the rest truncated or damaged.
  names = sorted(_sizes(cache))
  random.Random(1).shuffle(names)
  for i, n in enumerate(names):
    path = os.path.join(cache, n)
    if i % 2:
      os.remove(path)
    else:
      with open(path, "rb") as f:
        data = f.read()
      with open(path + ".damaged", "wb") as f:  # Replaced, not cut in place: the cache
        f.write(data[:len(data) // 2] if i % 4 else b"damaged")  # maps its files.
      os.replace(path + ".damaged", path)
  for got, want in zip(_compile_all(vocab, cache), expected):
    _assert_same(got, want)
  for got, want in zip(_compile_all(vocab, cache), expected):  # Rewritten: hits.
    _assert_same(got, want)
