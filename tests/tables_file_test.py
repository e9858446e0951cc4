"""Saved tables: save -> load -> step equals the compiled tables; typed errors on mismatch;
loading and stepping in a process where pynini cannot be imported."""

import json
import subprocess
import sys

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import _tables_file
from constrained_decoding import tables as tables_lib

_SPECS = {
    "date": cd.Regex(r"\d{4}-\d{2}-\d{2}"),
    "colors": cd.Regex(r"(Red|Orange|Yellow)( and (Red|Orange|Yellow))*"),
    "quoted": cd.Regex(r'"[^"]{0,12}"'),
    "nested": cd.Grammar('root ::= "[" (root ("," root)*)? "]"'),
}


@pytest.fixture(scope="module")
def saved(gemma_compiler, gemma_vocab, tmp_path_factory):
  """name -> (compiled tables, the same tables after save and load)."""
  out = {}
  folder = tmp_path_factory.mktemp("tables")
  for name, spec in _SPECS.items():
    tables = gemma_compiler.compile(spec)
    path = folder / f"{name}.cdt"
    tables.save(path, vocab=gemma_vocab, description=spec.describe())
    out[name] = (tables, cd.load_tables(path, vocab=gemma_vocab))
  stacked = cd.stack_tables([out["date"][0], out["nested"][0]])
  stacked.save(folder / "stacked.cdt", vocab=gemma_vocab)
  out["stacked"] = (stacked, cd.load_tables(folder / "stacked.cdt", vocab=gemma_vocab))
  return out


_allowed = jax.jit(cd.allowed_bits)
_advance = jax.jit(cd.advance)


@pytest.mark.parametrize("name", [*_SPECS, "stacked"])
def test_arrays_and_static_fields_round_trip(saved, name):
  original, loaded = saved[name]
  assert loaded.shape_key == original.shape_key
  assert (loaded.vocab_size, loaded.stack_depth) == (original.vocab_size, original.stack_depth)
  for field in tables_lib._ARRAY_FIELDS:  # pylint: disable=protected-access
    a, b = np.asarray(getattr(original, field)), getattr(loaded, field)
    assert isinstance(b, np.ndarray) and b.dtype == a.dtype, field
    np.testing.assert_array_equal(a, b, err_msg=field)


def _assert_same_state(a, b):
  for field in ("state", "stack", "depth", "done", "error"):
    np.testing.assert_array_equal(np.asarray(getattr(a, field)),
                                  np.asarray(getattr(b, field)), err_msg=field)


@pytest.mark.parametrize("name", [*_SPECS, "stacked"])
@hypothesis.settings(max_examples=8, deadline=None, derandomize=True)
@hypothesis.given(data=st.data())
def test_loaded_tables_step_like_the_compiled_ones(saved, name, gemma_vocab, data):
  """A random walk (mostly allowed tokens, sometimes a forbidden one) gives the same
  allowed sets and states on both."""
  original, loaded = saved[name]
  row = data.draw(st.integers(0, original.num_constraints - 1), label="constraint")
  ids = jnp.array([row], jnp.int32)
  a = cd.init_state(original, constraint_ids=ids)
  b = cd.init_state(loaded, constraint_ids=ids)
  for _ in range(data.draw(st.integers(1, 10), label="steps")):
    bits_a, bits_b = np.asarray(_allowed(original, a)), np.asarray(_allowed(loaded, b))
    np.testing.assert_array_equal(bits_a, bits_b)
    allowed = np.flatnonzero(np.unpackbits(bits_a[0].view(np.uint8), bitorder="little"))
    allowed = allowed[allowed < gemma_vocab.vocab_size]
    if data.draw(st.booleans(), label="forbidden") and len(allowed) < gemma_vocab.vocab_size:
      token = int(np.setdiff1d(np.arange(gemma_vocab.vocab_size), allowed)[0])
    else:
      token = int(allowed[data.draw(st.integers(0, len(allowed) - 1), label="token")])
    a = _advance(original, a, jnp.array([token], jnp.int32))
    b = _advance(loaded, b, jnp.array([token], jnp.int32))
    _assert_same_state(a, b)


def test_header_keeps_fingerprint_and_description(saved, gemma_vocab, tmp_path):
  tables = saved["date"][0]
  tables.save(tmp_path / "t.cdt", vocab=gemma_vocab, description="dates")
  header = cd.read_tables_header(tmp_path / "t.cdt")
  assert header == cd.TablesHeader(format_version=_tables_file.TABLES_FILE_VERSION,
                                   vocab_fingerprint=gemma_vocab.fingerprint,
                                   vocab_size=gemma_vocab.vocab_size, stack_depth=0,
                                   description="dates",
                                   edge_search_steps=tables.edge_search_steps)
  # The file name is kept as given (np.savez alone would append ".npz").
  assert sorted(p.name for p in tmp_path.iterdir()) == ["t.cdt"]


def test_other_vocabulary_is_refused_naming_both_fingerprints(saved, gemma_vocab, tmp_path):
  tables = saved["date"][0]
  tables.save(tmp_path / "t.cdt", vocab=gemma_vocab)
  # Same size and end-of-sequence ids, one token's bytes changed.
  token_bytes = list(gemma_vocab.token_bytes)
  token_bytes[1000] = b"changed"
  other = cd.Vocabulary(tuple(token_bytes), gemma_vocab.vocab_size, gemma_vocab.eos_ids)
  with pytest.raises(cd.TablesVocabularyMismatchError,
                     match=f"{gemma_vocab.fingerprint}, not {other.fingerprint}"):
    cd.load_tables(tmp_path / "t.cdt", vocab=other)
  assert isinstance(cd.load_tables(tmp_path / "t.cdt", vocab=None), cd.ConstraintTables)
  assert cd.load_tables(tmp_path / "t.cdt", vocab=gemma_vocab.fingerprint).vocab_size == (
      gemma_vocab.vocab_size)


def test_saving_with_another_vocabulary_is_refused(saved, byte_vocab, tmp_path):
  with pytest.raises(cd.VocabularyMismatchError, match="vocab_size 262144"):
    saved["date"][0].save(tmp_path / "t.cdt", vocab=byte_vocab)
  assert not (tmp_path / "t.cdt").exists()


def _rewrite(source, target, *, header_update=None, drop=None, cast=None):
  """Copies a tables file with its header or arrays changed (a file from elsewhere)."""
  with np.load(source) as archive:
    arrays = {k: archive[k] for k in archive.files if k != drop}
  header = json.loads(bytes(arrays["__header__"]).decode())
  header.update(header_update or {})
  arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
  if cast:
    arrays[cast] = arrays[cast].astype(np.int64)
  with open(target, "wb") as f:
    np.savez(f, **arrays)


def test_other_format_version_is_refused(saved, gemma_vocab, tmp_path):
  saved["date"][0].save(tmp_path / "t.cdt", vocab=gemma_vocab)
  current = _tables_file.TABLES_FILE_VERSION
  _rewrite(tmp_path / "t.cdt", tmp_path / "v99.cdt", header_update={"format_version": 99})
  with pytest.raises(cd.TablesVersionError,
                     match=rf"format version 99\. Expected version {current}"):
    cd.load_tables(tmp_path / "v99.cdt", vocab=gemma_vocab)


@pytest.mark.parametrize("change, message", [
    (dict(drop="edge_targets"), "lacks the array 'edge_targets'"),
    (dict(cast="mask_bits"), "'mask_bits' has dtype int64. Expected uint32"),
    (dict(header_update={"format": "something else"}), "is not a tables file"),
    (dict(drop="__header__"), "no readable tables header"),
])
def test_damaged_files_are_refused(saved, gemma_vocab, tmp_path, change, message):
  saved["date"][0].save(tmp_path / "t.cdt", vocab=gemma_vocab)
  if change.get("drop") == "__header__":
    with np.load(tmp_path / "t.cdt") as archive:
      arrays = {k: archive[k] for k in archive.files if k != "__header__"}
    with open(tmp_path / "bad.cdt", "wb") as f:
      np.savez(f, **arrays)
  else:
    _rewrite(tmp_path / "t.cdt", tmp_path / "bad.cdt", **change)
  with pytest.raises(cd.TablesFileError, match=message):
    cd.load_tables(tmp_path / "bad.cdt", vocab=gemma_vocab)


def test_a_text_file_is_not_tables(tmp_path):
  (tmp_path / "t.cdt").write_text("hello")
  with pytest.raises(cd.TablesFileError, match="is not a tables file"):
    cd.load_tables(tmp_path / "t.cdt", vocab=None)


# Loads and steps saved tables with every import of pynini failing, and prints what it
# saw: whether pynini could be imported, then the allowed-set sums and states per step.
_NO_PYNINI_SCRIPT = """
import importlib.abc, json, sys

class _NoPynini(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name == "pynini" or name.startswith("pynini."):
      raise ImportError("pynini is not installed here")
    return None

sys.meta_path.insert(0, _NoPynini())
import numpy as np
import jax.numpy as jnp
import constrained_decoding as cd
vocab = cd.Vocabulary.from_gguf(cd.models.default_gguf_path())
tables = cd.load_tables(sys.argv[1], vocab=vocab)
state = cd.init_state(tables, batch_size=1)
steps = []
for token in json.loads(sys.argv[2]):
  steps.append([np.asarray(cd.allowed_bits(tables, state)).tolist(), int(state.state[0])])
  state = cd.advance(tables, state, jnp.array([token], jnp.int32))
try:
  cd.Compiler(vocab).compile(cd.Regex("a"))
  blocked = False
except ImportError:
  blocked = True
print(json.dumps({"blocked": blocked, "pynini_loaded": "pynini" in sys.modules,
                  "steps": steps, "final": [int(state.state[0]), bool(state.done[0]),
                                            bool(state.error[0])]}))
"""


def test_load_and_step_without_pynini(saved, gemma_vocab, tmp_path):
  from constrained_decoding.testing import TokenIndex  # pylint: disable=g-import-not-at-top

  tables = saved["date"][0]
  tables.save(tmp_path / "t.cdt", vocab=gemma_vocab)
  tokens = TokenIndex(gemma_vocab).longest_tokenization(b"2024-11-05") + [gemma_vocab.eos_ids[0]]
  out = subprocess.run([sys.executable, "-c", _NO_PYNINI_SCRIPT, str(tmp_path / "t.cdt"),
                        json.dumps(tokens)], capture_output=True, text=True, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  seen = json.loads(out.stdout)
  assert seen["blocked"] and not seen["pynini_loaded"]
  state = cd.init_state(tables, batch_size=1)
  for token, (bits, q) in zip(tokens, seen["steps"]):
    np.testing.assert_array_equal(np.asarray(cd.allowed_bits(tables, state)),
                                  np.asarray(bits, np.uint32))
    assert q == int(state.state[0])
    state = cd.advance(tables, state, jnp.array([token], jnp.int32))
  assert seen["final"] == [int(state.state[0]), True, False]


def test_device_kit_runs_its_imports_without_pynini():
  """`benchmarks/device_kit.py run` is for accelerators without pynini: importing it (and
  the decode and step benchmarks it reuses) must not import the compiler."""
  repo = __file__.rsplit("/tests/", 1)[0]
  blocker = _NO_PYNINI_SCRIPT.split("import numpy as np")[0]
  script = blocker + (f"sys.path.insert(0, {repo!r})\n"
                      "import benchmarks.device_kit\n"
                      "print('pynini' in sys.modules)\n")
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip() == "False"
