"""One file per compiled constraint: compile once on a host with pynini, decode anywhere.

The file is a zip archive of `.npy` arrays (numpy's `.npz`, read with
`allow_pickle=False`, so loading never runs code from the file): one array per field of
the tables, plus `__header__`, the UTF-8 bytes of a small JSON object:

  format            which tables: "constrained_decoding.ConstraintTables", or
                    "constrained_decoding.LexedTables" (a grammar with a lexer)
  format_version    TABLES_FILE_VERSION (LEXED_FILE_VERSION for LexedTables); bumped
                    whenever the arrays' layout or meaning changes, so an old file is
                    refused instead of misread
  vocab_fingerprint `Vocabulary.fingerprint` of the vocabulary the tables were built for
  vocab_size, stack_depth   the static fields of the tables (LexedTables: and
                    indent_depth)
  edge_search_steps the static search bound (`tables.edge_search_steps`); optional:
                    files without it (written before it existed) get the bound their
                    arrays need, computed on load, so the version stays
  description       what the tables constrain, e.g. `Regex('\\d+')` (free text)

Loading needs numpy and jax only: this module, like the rest of the device side, never
imports pynini, so a worker without pynini can decode with tables compiled elsewhere.

Public names (re-exported as `cd.load_tables`, `cd.read_tables_header`, and the methods
`ConstraintTables.save`, `LexedTables.save`):
  save_tables(tables, path, *, vocab, description)
  load_tables(path, *, vocab)        -> ConstraintTables or LexedTables (as saved)
  read_tables_header(path)           -> TablesHeader
"""

import dataclasses
import json
import os
import typing
import zipfile

import numpy as np

from constrained_decoding import lexed_tables as _lexed
from constrained_decoding import tables as _tables
from constrained_decoding.errors import TablesFileError
from constrained_decoding.errors import TablesVersionError
from constrained_decoding.errors import TablesVocabularyMismatchError
from constrained_decoding.errors import VocabularyMismatchError
from constrained_decoding.vocab._vocabulary import Vocabulary

# 2: stack-aware masks (capped_*); 3: register guards, and counted chains' counting
# entries folded into the mask rows (the device no longer ORs them in); 4: counting guards
# (COUNT, ATLEAST: arrays whose items are counted in a register); 5: distinct strings
# (UCLOSE, UHASH, FAIL guards, hash_consts, state_hashing, token_hash); 6: counting
# bounds (filters AT_MOST - r) and rows excluded near counted chains' ends
# (group_excluded, excluded_bits)
TABLES_FILE_VERSION = 6
# The layout of `LexedTables` (its fields, `lexed_tables._ARRAY_FIELDS`), versioned apart.
LEXED_FILE_VERSION = 1
_FORMAT = "constrained_decoding.ConstraintTables"
_LEXED_FORMAT = "constrained_decoding.LexedTables"
_VERSIONS = {_FORMAT: TABLES_FILE_VERSION, _LEXED_FORMAT: LEXED_FILE_VERSION}
_HEADER = "__header__"
# The dtype of every array field (see the layout in `tables.py`).
_DTYPES = {name: np.dtype(np.int32) for name in _tables._ARRAY_FIELDS}  # pylint: disable=protected-access
_DTYPES.update(accepting=np.dtype(bool), mask_bits=np.dtype(np.uint32),
               eos_bits=np.dtype(np.uint32), terminal_bits=np.dtype(np.uint32),
               capped_bits=np.dtype(np.uint32), excluded_bits=np.dtype(np.uint32),
               token_counts=np.dtype(np.int8))
# LexedTables: the dtype kind of each array (ints may be int16 or int32, as compiled).
_LEXED_KINDS = {name: "i" for name in _lexed._ARRAY_FIELDS}  # pylint: disable=protected-access
_LEXED_KINDS.update({name: "b" for name in ("state_free", "state_nl_any", "state_nl_width",
                                            "nl_needs_indent")})
_LEXED_KINDS.update({name: "u" for name in ("set_bits", "state_viable", "eos_bits",
                                            "action_bits")})


@dataclasses.dataclass(frozen=True)
class TablesHeader:
  """What a tables file says about itself (read without loading the arrays).

  Attributes:
    format_version: Layout version of the file (`TABLES_FILE_VERSION` when written).
    vocab_fingerprint: `Vocabulary.fingerprint` of the vocabulary the tables are for.
    vocab_size: Width of the model's logits the tables expect.
    stack_depth: Stack capacity per row (0 for regular constraints).
    description: What the tables constrain, as given to `save`.
    kind: "ConstraintTables", or "LexedTables" (a grammar with a lexer).
    indent_depth: LexedTables: indentation levels per row (0 for ConstraintTables).
    edge_search_steps: ConstraintTables: the saved search bound, None when the file
      has none (the bound is then computed from the arrays on load).
  """

  format_version: int
  vocab_fingerprint: str
  vocab_size: int
  stack_depth: int
  description: str = ""
  kind: str = "ConstraintTables"
  indent_depth: int = 0
  edge_search_steps: int | None = None


def _fingerprint_of(vocab: Vocabulary | str) -> str:
  return vocab if isinstance(vocab, str) else vocab.fingerprint


def save_tables(tables: _tables.ConstraintTables | _lexed.LexedTables,
                path: str | os.PathLike, *, vocab: Vocabulary,
                description: str = "") -> None:
  """Writes `tables` to `path` (any name; `.cdt` by convention), replacing it atomically.

  Args:
    tables: Compiled (possibly stacked) tables, numpy or device arrays:
      `ConstraintTables` or `LexedTables`.
    path: The file to write.
    vocab: The vocabulary the tables were compiled for; its fingerprint is stored so
      that `load_tables` can refuse tables meant for another tokenizer.
    description: Free text kept in the header, e.g. `spec.describe()`.

  Raises:
    VocabularyMismatchError: If `vocab`'s logits width or end-of-sequence ids differ
      from those the tables were built with.
  """
  if (vocab.vocab_size != tables.vocab_size or not np.array_equal(
      np.asarray(tables.eos_bits), _tables.bitmask(np.asarray(vocab.eos_ids),
                                                   vocab.vocab_size))):
    raise VocabularyMismatchError(
        f"The tables were built for vocab_size {tables.vocab_size} and other "
        f"end-of-sequence ids than {vocab!r}. Expected the Vocabulary the tables were "
        f"compiled with.")
  if tables.vocab_fingerprint and tables.vocab_fingerprint != vocab.fingerprint:
    raise VocabularyMismatchError(
        f"The tables were compiled for the vocabulary with fingerprint "
        f"{tables.vocab_fingerprint}, not {vocab.fingerprint} ({vocab!r}). Expected the "
        f"Vocabulary the tables were compiled with.")
  lexed = isinstance(tables, _lexed.LexedTables)
  kind = _LEXED_FORMAT if lexed else _FORMAT
  header = dict(format=kind, format_version=_VERSIONS[kind],
                vocab_fingerprint=vocab.fingerprint, vocab_size=int(tables.vocab_size),
                stack_depth=int(tables.stack_depth), description=str(description))
  if lexed:  # Arrays as compiled (`load_tables` checks their dtype kinds and shapes).
    header["indent_depth"] = int(tables.indent_depth)
    arrays = {name: np.asarray(getattr(tables, name))
              for name in _lexed._ARRAY_FIELDS}  # pylint: disable=protected-access
  else:
    arrays = {name: np.asarray(getattr(tables, name), _DTYPES[name])
              for name in _tables._ARRAY_FIELDS}  # pylint: disable=protected-access
    if tables.edge_search_steps is not None:
      header["edge_search_steps"] = int(tables.edge_search_steps)
  arrays[_HEADER] = np.frombuffer(json.dumps(header).encode("utf-8"), np.uint8)
  # Written beside the target, then renamed: a reader never sees half a file. A file
  # object, not a name: `np.savez` would append ".npz" to a name.
  partial = f"{os.fspath(path)}.partial"
  try:
    with open(partial, "wb") as f:
      np.savez_compressed(f, **arrays)
    os.replace(partial, path)
  finally:
    if os.path.exists(partial):
      os.remove(partial)


def _open(path: str | os.PathLike):
  """The npz archive of `path`; `TablesFileError` when it is not one."""
  try:
    return np.load(os.fspath(path), allow_pickle=False)
  except (ValueError, zipfile.BadZipFile, EOFError) as e:
    raise TablesFileError(
        f"{os.fspath(path)!r} is not a tables file ({e}). Expected a file written by "
        f"ConstraintTables.save or `constrained-decoding compile`.") from None


def _header(archive, path) -> TablesHeader:
  """The parsed header of an open archive; typed errors for a foreign or newer file."""
  where = os.fspath(path)
  try:
    raw = json.loads(bytes(archive[_HEADER]).decode("utf-8"))
  except (KeyError, ValueError) as e:
    raise TablesFileError(
        f"{where!r} has no readable tables header ({type(e).__name__}: {e}). Expected a "
        f"file written by ConstraintTables.save.") from None
  if not isinstance(raw, dict) or raw.get("format") not in _VERSIONS:
    raise TablesFileError(f"{where!r} is not a tables file (format "
                          f"{raw.get('format') if isinstance(raw, dict) else raw!r}). "
                          f"Expected format {_FORMAT!r} or {_LEXED_FORMAT!r}.")
  kind = raw["format"]
  version = raw.get("format_version")
  if version != _VERSIONS[kind]:
    raise TablesVersionError(
        f"{where!r} has tables format version {version!r}. Expected version "
        f"{_VERSIONS[kind]} (this library's {kind.rsplit('.', 1)[1]} files). Recompile "
        f"the constraint with this version (`constrained-decoding compile ... -o FILE`).")
  try:
    return TablesHeader(format_version=int(version),
                        vocab_fingerprint=str(raw["vocab_fingerprint"]),
                        vocab_size=int(raw["vocab_size"]), stack_depth=int(raw["stack_depth"]),
                        description=str(raw.get("description", "")),
                        kind=kind.rsplit(".", 1)[1],
                        indent_depth=int(raw["indent_depth"]) if kind == _LEXED_FORMAT else 0,
                        edge_search_steps=_optional_int(raw.get("edge_search_steps")))
  except (KeyError, TypeError, ValueError) as e:
    raise TablesFileError(f"{where!r} has an incomplete header ({e!r}). Expected the "
                          f"fields of TablesHeader.") from None


def _optional_int(value) -> int | None:
  """`value` as an int >= 0, or None; ValueError otherwise (a damaged header)."""
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise ValueError(f"edge_search_steps {value!r} is not an int >= 0")
  return value


def read_tables_header(path: str | os.PathLike) -> TablesHeader:
  """The header of a tables file: version, vocabulary fingerprint, description."""
  with _open(path) as archive:
    return _header(archive, path)


def _array(archive, name: str, where: str, kind: str = "ConstraintTables") -> np.ndarray:
  """Field `name` of the archive, checked against the layout's dtype."""
  if name not in archive.files:
    raise TablesFileError(f"{where!r} lacks the array {name!r}. Expected every field of "
                          f"{kind}; the file is damaged.")
  array = archive[name]
  if kind == "LexedTables":
    expected = {"i": "int16 or int32", "u": "uint32", "b": "bool"}[_LEXED_KINDS[name]]
    fits = array.dtype in ((np.int16, np.int32) if _LEXED_KINDS[name] == "i" else
                           (np.uint32,) if _LEXED_KINDS[name] == "u" else (np.bool_,))
  else:
    expected, fits = _DTYPES[name], array.dtype == _DTYPES[name]
  if not fits:
    raise TablesFileError(f"{where!r}: array {name!r} has dtype {array.dtype}. Expected "
                          f"{expected}; the file is damaged.")
  return array


def _lexed_from(arrays: dict, header: TablesHeader, where: str) -> _lexed.LexedTables:
  """`LexedTables` of a file's arrays, after the checks that catch a damaged file: each
  array's rank, the bitmaps' words for the vocabulary, and row counts that must agree."""
  for name, array in arrays.items():
    # The field's annotation, e.g. Int[numpy or jax array, "S K"]: its axes.
    rank = len(typing.get_args(_lexed.LexedTables.__annotations__[name])[0].dim_str.split())
    if array.ndim != rank:
      raise TablesFileError(f"{where!r}: array {name!r} has shape {array.shape}. Expected "
                            f"{rank} axes; the file is damaged.")
  words = _tables.num_words(header.vocab_size)
  agree = {  # what must be equal -> (array, axis) pairs
      "words": [("set_bits", 1), ("eos_bits", 0)],
      "lexer states": [(f, 0) for f in ("state_outcomes", "state_seq_lanes", "state_free",
                                        "state_small_tokens", "state_viable")],
      "parser states": [(f, 0) for f in ("action", "action_bits", "goto_id",
                                         "nl_needs_indent")],
      "grammars": [("lex_start", 0), ("lr_start", 0)],
  }
  for what, pairs in agree.items():
    sizes = {f"{name} axis {axis}": arrays[name].shape[axis] for name, axis in pairs}
    if what == "words":
      sizes[f"vocab_size {header.vocab_size}"] = words
    if len(set(sizes.values())) != 1:
      raise TablesFileError(f"{where!r}: the arrays disagree on the number of {what} "
                            f"({sizes}). Expected equal sizes; the file is damaged.")
  return _lexed.LexedTables(**arrays, vocab_size=header.vocab_size,
                            stack_depth=header.stack_depth,
                            indent_depth=header.indent_depth,
                            vocab_fingerprint=header.vocab_fingerprint)


def load_tables(path: str | os.PathLike, *, vocab: Vocabulary | str | None
                ) -> _tables.ConstraintTables | _lexed.LexedTables:
  """Reads tables written by `ConstraintTables.save` or `LexedTables.save` (numpy arrays;
  no pynini needed), as the kind that was saved.

  ```python
  tables = cd.load_tables("answer.cdt", vocab=model.vocab)
  state = cd.init_state(tables, batch_size=8)
  ```

  Args:
    path: The file.
    vocab: The vocabulary (or its fingerprint) the tables must have been compiled
      for; None skips the check (see `read_tables_header` for what the file says).

  Raises:
    TablesVocabularyMismatchError: The file was written for another vocabulary; the
      message names both fingerprints.
    TablesVersionError: The file has another format version.
    TablesFileError: The file is not a tables file or is damaged.
  """
  where = os.fspath(path)
  with _open(path) as archive:
    header = _header(archive, path)
    if vocab is not None and header.vocab_fingerprint != _fingerprint_of(vocab):
      raise TablesVocabularyMismatchError(
          f"{where!r} holds tables for the vocabulary with fingerprint "
          f"{header.vocab_fingerprint}, not {_fingerprint_of(vocab)}. Expected tables "
          f"compiled for this vocabulary: recompile the constraint with it.")
    if header.kind == "LexedTables":
      return _lexed_from({name: _array(archive, name, where, header.kind)
                          for name in _lexed._ARRAY_FIELDS},  # pylint: disable=protected-access
                         header, where)
    arrays = {name: _array(archive, name, where)
              for name in _tables._ARRAY_FIELDS}  # pylint: disable=protected-access
  if arrays["mask_bits"].shape[-1] != _tables.num_words(header.vocab_size):
    raise TablesFileError(
        f"{where!r}: mask rows have {arrays['mask_bits'].shape[-1]} words. Expected "
        f"{_tables.num_words(header.vocab_size)} for vocab_size {header.vocab_size}; the "
        f"file is damaged.")
  return _tables.ConstraintTables(**arrays, vocab_size=header.vocab_size,
                                  stack_depth=header.stack_depth,
                                  vocab_fingerprint=header.vocab_fingerprint,
                                  edge_search_steps=header.edge_search_steps)
