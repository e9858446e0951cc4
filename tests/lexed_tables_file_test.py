"""Saved tables of grammars with a lexer: save -> load gives `LexedTables` with identical
arrays that step like the compiled ones; typed errors for damaged or mismatched files;
loading needs no pynini."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import _tables_file
from constrained_decoding import lexed_tables

_INDENTED = cd.Grammar(  # A small Python-like grammar with INDENT/DEDENT.
    'start: (_NEWLINE | stmt)*\nstmt: NAME ":" _NEWLINE _INDENT stmt+ _DEDENT | NAME _NEWLINE\n'
    "_NEWLINE: /\\r?\\n[\\t ]*/+\nNAME: /[a-z]+/\n%declare _INDENT _DEDENT\n",
    syntax="lark", lexer=True, indentation=cd.Indentation(), start="start")


@pytest.fixture(scope="module")
def saved(byte_compiler, byte_vocab, tmp_path_factory):
  """(compiled tables, path of their file, the tables loaded from it)."""
  tables = byte_compiler.compile(_INDENTED)
  path = tmp_path_factory.mktemp("lexed") / "indented.cdt"
  tables.save(path, vocab=byte_vocab, description=_INDENTED.describe())
  return tables, path, cd.load_tables(path, vocab=byte_vocab)


def test_arrays_and_static_fields_round_trip(saved):
  original, _, loaded = saved
  assert isinstance(loaded, cd.LexedTables)
  assert loaded.shape_key == original.shape_key
  assert (loaded.vocab_size, loaded.stack_depth, loaded.indent_depth,
          loaded.vocab_fingerprint) == (original.vocab_size, original.stack_depth,
                                        original.indent_depth, original.vocab_fingerprint)
  for field in lexed_tables._ARRAY_FIELDS:  # pylint: disable=protected-access
    a, b = np.asarray(getattr(original, field)), getattr(loaded, field)
    assert isinstance(b, np.ndarray) and b.dtype == a.dtype, field
    np.testing.assert_array_equal(a, b, err_msg=field)
  assert loaded.indent_depth > 1


_allowed = jax.jit(cd.allowed_bits)
_advance = jax.jit(cd.advance)


def test_loaded_tables_step_like_the_compiled_ones(saved, byte_vocab):
  """Random walks (allowed bytes, sometimes a forbidden one): same masks and states."""
  original, _, loaded = saved
  rng = np.random.default_rng(0)
  a, b = cd.init_state(original, batch_size=4), cd.init_state(loaded, batch_size=4)
  for step in range(16):
    bits = np.asarray(_allowed(original, a))
    np.testing.assert_array_equal(bits, np.asarray(_allowed(loaded, b)))
    allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
    tokens = [int(rng.choice(np.flatnonzero(row[:byte_vocab.vocab_size])))
              if step != 9 or r else int(np.flatnonzero(row == 0)[0])
              for r, row in enumerate(allowed)]
    a = _advance(original, a, jnp.array(tokens, jnp.int32))
    b = _advance(loaded, b, jnp.array(tokens, jnp.int32))
    for field in ("state", "stack", "depth", "registers", "done", "error"):
      np.testing.assert_array_equal(np.asarray(getattr(a, field)),
                                    np.asarray(getattr(b, field)), err_msg=field)
  assert bool(a.error[0]) and not bool(a.error[1:].any())


def test_header_says_lexed_tables(saved, byte_vocab):
  original, path, _ = saved
  header = cd.read_tables_header(path)
  assert header == cd.TablesHeader(
      format_version=_tables_file.LEXED_FILE_VERSION,
      vocab_fingerprint=byte_vocab.fingerprint, vocab_size=byte_vocab.vocab_size,
      stack_depth=original.stack_depth, description=_INDENTED.describe(),
      kind="LexedTables", indent_depth=original.indent_depth)


def test_other_vocabulary_is_refused(saved, byte_vocab, tmp_path):
  original, path, _ = saved
  # Same size and end-of-sequence id, one token's bytes changed.
  token_bytes = list(byte_vocab.token_bytes)
  token_bytes[65] = b"changed"
  other = cd.Vocabulary(tuple(token_bytes), byte_vocab.vocab_size, byte_vocab.eos_ids)
  with pytest.raises(cd.TablesVocabularyMismatchError,
                     match=f"{byte_vocab.fingerprint}, not {other.fingerprint}"):
    cd.load_tables(path, vocab=other)
  with pytest.raises(cd.VocabularyMismatchError, match="fingerprint"):
    original.save(tmp_path / "t.cdt", vocab=other)
  smaller = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(128)] + [None],
                                           eos_ids=[128])
  with pytest.raises(cd.VocabularyMismatchError, match="vocab_size 257"):
    original.save(tmp_path / "t.cdt", vocab=smaller)
  assert not (tmp_path / "t.cdt").exists()


def _rewrite(source, target, *, header=None, drop=None, change=None):
  """Copies a tables file with its header or arrays changed (a file from elsewhere)."""
  with np.load(source) as archive:
    arrays = {k: archive[k] for k in archive.files if k != drop}
  fields = json.loads(bytes(arrays["__header__"]).decode())
  fields.update(header or {})
  arrays["__header__"] = np.frombuffer(json.dumps(fields).encode(), np.uint8)
  for name, fn in (change or {}).items():
    arrays[name] = fn(arrays[name])
  with open(target, "wb") as f:
    np.savez(f, **arrays)


@pytest.mark.parametrize("damage, error, message", [
    (dict(header={"format_version": 99}), cd.TablesVersionError,
     r"version 99\. Expected version 1 \(this library's LexedTables files\)"),
    (dict(header={"format": "x"}), cd.TablesFileError, "is not a tables file"),
    (dict(drop="goto_chain"), cd.TablesFileError, "lacks the array 'goto_chain'"),
    (dict(change={"state_free": lambda a: a.astype(np.int64)}), cd.TablesFileError,
     "'state_free' has dtype int64. Expected bool"),
    (dict(change={"action": lambda a: a.astype(np.float32)}), cd.TablesFileError,
     "'action' has dtype float32. Expected int16 or int32"),
    (dict(change={"rule_len": lambda a: a[:, None]}), cd.TablesFileError,
     r"'rule_len' has shape \(\d+, 1\)\. Expected 1 axes"),
    (dict(change={"state_free": lambda a: a[:-1]}), cd.TablesFileError,
     "disagree on the number of lexer states"),
    (dict(change={"eos_bits": lambda a: a[:-1]}), cd.TablesFileError,
     "disagree on the number of words"),
    (dict(header={"vocab_size": 4096}), cd.TablesFileError,
     "disagree on the number of words"),
])
def test_damaged_files_are_refused(saved, tmp_path, damage, error, message):
  _rewrite(saved[1], tmp_path / "bad.cdt", **damage)
  with pytest.raises(error, match=message):
    cd.load_tables(tmp_path / "bad.cdt", vocab=None)


def test_load_without_pynini(saved):
  """A process where pynini cannot be imported loads the file as LexedTables."""
  blocker = (
      "import importlib.abc, sys\n"
      "class _NoPynini(importlib.abc.MetaPathFinder):\n"
      "  def find_spec(self, name, path=None, target=None):\n"
      "    if name == 'pynini' or name.startswith('pynini.'):\n"
      "      raise ImportError('pynini is not installed here')\n"
      "sys.meta_path.insert(0, _NoPynini())\n"
      "import constrained_decoding as cd\n"
      "t = cd.load_tables(sys.argv[1], vocab=None)\n"
      "print(type(t).__name__, int(t.action.sum()), 'pynini' in sys.modules)\n")
  original, path, _ = saved
  out = subprocess.run([sys.executable, "-c", blocker, str(path)], capture_output=True,
                       text=True, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split() == ["LexedTables", str(int(np.asarray(original.action).sum())),
                                "False"]
