"""Disk cache of whole `LexedTables` (`_lexed_cache.py`): a second compiler reads the
tables the first wrote (identical arrays, no compile), every input of the tables is in
the key, damaged or foreign files are recompiled and rewritten, `cache_dir=None` writes
nothing."""

import os
import struct
import zipfile

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import _cache
from constrained_decoding import _lexed_cache
from constrained_decoding import lexed_tables
from constrained_decoding.constraints import _lexed_grammar

_TEXT = ('start: (_NEWLINE | stmt)*\nalt: _NEWLINE (_NEWLINE | stmt)*\n'
         'stmt: NAME ":" _NEWLINE _INDENT stmt+ _DEDENT | NAME _NEWLINE\n_NEWLINE: /\\r?\\n[\\t ]*/+\nNAME: /[a-z]+/\n'
         "%declare _INDENT _DEDENT\n")
_GRAMMAR = cd.Grammar(_TEXT, syntax="lark", lexer=True, indentation=cd.Indentation(),
                      start="start")


def _vocab(extra=(b"if", b"x:", b"\n  ")):
  """Bytes, a few multi-byte tokens and an end-of-sequence token (small: fast)."""
  return cd.Vocabulary.from_token_bytes(
      [bytes([b]) for b in range(256)] + list(extra) + [None], eos_ids=[256 + len(extra)])


@pytest.fixture
def compiles(spy):
  """The `LexedArrays` every real (uncached) compile returned, in order."""
  return spy(_lexed_grammar, "compile_lexed_grammar")


def _compile(vocab, cache_dir, spec=_GRAMMAR, **options):
  compiler = cd.Compiler(vocab, cd.CompileOptions(cache_dir=cache_dir, **options))
  return compiler.compile_with_info(spec)


def _files(cache_dir) -> list:
  return sorted(n for n in os.listdir(cache_dir) if n.startswith("lexed-v"))


def _assert_same(a: cd.LexedTables, b: cd.LexedTables) -> None:
  for field in lexed_tables._ARRAY_FIELDS:  # pylint: disable=protected-access
    x, y = np.asarray(getattr(a, field)), np.asarray(getattr(b, field))
    assert x.dtype == y.dtype and x.shape == y.shape, field
    np.testing.assert_array_equal(x, y, err_msg=field)
  for field in lexed_tables._META_FIELDS:  # pylint: disable=protected-access
    assert getattr(a, field) == getattr(b, field), field


def test_second_compile_reads_identical_tables(tmp_path, compiles):
  vocab = _vocab()
  first, info1 = _compile(vocab, str(tmp_path))
  assert len(compiles) == 1 and len(_files(tmp_path)) == 1
  second, info2 = _compile(vocab, str(tmp_path))  # A new Compiler: no memo.
  assert len(compiles) == 1, "the second compile did not read the cache"
  _assert_same(first, second)
  # What CompileInfo reports of the tables is the same whether compiled or read.
  for field in ("byte_states", "token_states", "token_edges", "num_terminals",
                "num_masks", "nbytes"):
    assert getattr(info1, field) == getattr(info2, field), field
  # And the cached tables are those of an uncached compile.
  _assert_same(_compile(vocab, None)[0], second)


@pytest.mark.parametrize("change", [
    "text", "start", "stack_depth", "indent_width", "indent_depth", "vocab", "eos"])
def test_every_input_is_in_the_key(tmp_path, compiles, change):
  vocab, spec, options = _vocab(), _GRAMMAR, {}
  _compile(vocab, str(tmp_path))
  if change == "text":  # Same language, other text.
    spec = cd.Grammar(_TEXT.replace("[a-z]+", "[a-z][a-z]*"), syntax="lark", lexer=True,
                      indentation=cd.Indentation(), start="start")
  elif change == "start":
    spec = cd.Grammar(_TEXT, syntax="lark", lexer=True, indentation=cd.Indentation(),
                      start="alt")
  elif change == "stack_depth":
    options = {"stack_depth": 32}
  elif change in ("indent_width", "indent_depth"):
    field = "max_width" if change == "indent_width" else "max_depth"
    indentation = cd.Indentation(**{field: getattr(cd.Indentation(), field) - 1})
    spec = cd.Grammar(_TEXT, syntax="lark", lexer=True, indentation=indentation,
                      start="start")
  elif change == "vocab":
    vocab = _vocab(extra=(b"if", b"x:", b"\n   "))
  else:  # Same tokens, other end-of-sequence id.
    vocab = cd.Vocabulary.from_token_bytes(
        [bytes([b]) for b in range(256)] + [b"if", b"x:", b"\n  ", None], eos_ids=[0])
  tables, _ = _compile(vocab, str(tmp_path), spec, **options)
  assert len(compiles) == 2, f"changing the {change} read the old tables"
  assert len(_files(tmp_path)) == 2
  _assert_same(_compile(vocab, None, spec, **options)[0], tables)


def _only_file(cache_dir) -> str:
  (name,) = _files(cache_dir)
  return os.path.join(cache_dir, name)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped", "empty"])
def test_damaged_file_is_recompiled_and_rewritten(tmp_path, compiles, damage):
  vocab = _vocab()
  first, _ = _compile(vocab, str(tmp_path))
  path = _only_file(tmp_path)
  data = open(path, "rb").read()
  if damage == "garbage":
    data = b"not a zip file" * 100
  elif damage == "truncated":
    data = data[:len(data) // 2]
  elif damage == "flipped":  # The last byte of an array's data: the zip CRC catches it.
    with zipfile.ZipFile(path) as archive:
      member = archive.getinfo("state_small_tokens.npy")
    start = member.header_offset  # Local header: 30 bytes, the name, the extra field.
    name_len, extra_len = struct.unpack("<HH", data[start + 26:start + 30])
    i = start + 30 + name_len + extra_len + member.compress_size - 1
    data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
  else:
    data = b""
  with open(path, "wb") as f:
    f.write(data)
  second, _ = _compile(vocab, str(tmp_path))
  assert len(compiles) == 2
  _assert_same(first, second)
  _compile(vocab, str(tmp_path))  # Rewritten: read again.
  assert len(compiles) == 2


def test_file_of_other_inputs_under_the_name_is_a_miss(tmp_path, compiles):
  """A file whose stored key differs (a hash-prefix collision, a hand-copied file) is
  not used: the full key is compared."""
  vocab = _vocab()
  other = cd.Grammar(_TEXT.replace("[a-z]+", "[a-y]+"), syntax="lark", lexer=True,
                     indentation=cd.Indentation(), start="start")
  _compile(vocab, str(tmp_path / "a"), other)
  first, _ = _compile(vocab, str(tmp_path / "b"))
  os.replace(_only_file(tmp_path / "a"), _only_file(tmp_path / "b"))
  second, _ = _compile(vocab, str(tmp_path / "b"))
  assert len(compiles) == 3
  _assert_same(first, second)


def test_no_cache_dir_reads_and_writes_nothing(tmp_path, compiles, monkeypatch):
  monkeypatch.setenv("CONSTRAINED_DECODING_CACHE", str(tmp_path))
  _compile(_vocab(), None)
  _compile(_vocab(), None)
  assert len(compiles) == 2 and os.listdir(tmp_path) == []


def test_prune_drops_other_versions_then_least_recently_used(tmp_path):
  names = [f"lexed-v{_lexed_cache.LEXED_CACHE_VERSION}-{i}.npz" for i in range(4)]
  for t, name in enumerate(names):
    (tmp_path / name).write_bytes(b"x" * 100)
    os.utime(tmp_path / name, (1000 + t, 1000 + t))
  (tmp_path / "lexed-v0-old.npz").write_bytes(b"x")
  (tmp_path / "lexer-v1-keep.npz").write_bytes(b"x")  # Another cache's file.
  _cache.prune_cache(str(tmp_path), max_bytes=1000)
  assert sorted(os.listdir(tmp_path)) == sorted(names + ["lexer-v1-keep.npz"])
  _cache.prune_cache(str(tmp_path), max_bytes=300)  # Keeps <= 225 bytes.
  assert sorted(os.listdir(tmp_path)) == sorted(names[2:] + ["lexer-v1-keep.npz"])


def test_key_names_every_argument_and_the_sources(monkeypatch):
  vocab = _vocab()
  base = dict(start="start", stack_depth=64, indentation=cd.Indentation(), semicolons=None)
  key = _lexed_cache.cache_key(_TEXT, vocab, base)
  assert _lexed_cache.cache_key(_TEXT, vocab, dict(base)) == key
  assert _lexed_cache.cache_key(_TEXT, vocab, {**base, "new_option": 1}) != key
  assert _lexed_cache.cache_key(
      _TEXT, vocab, {**base, "indentation": None,
                     "semicolons": _lexed_grammar.Semicolons()}) != key
  monkeypatch.setattr(_lexed_cache._version, "__version__", "9.9.9")  # pylint: disable=protected-access
  assert _lexed_cache.cache_key(_TEXT, vocab, base) != key
  assert len(_lexed_cache._source_digest()) == 64  # pylint: disable=protected-access
