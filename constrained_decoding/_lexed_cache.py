"""Disk cache of whole compiled grammars with a lexer (`LexedTables`, issue 18).

Compiling `Grammar.builtin("python")` for Gemma 3 takes ~1.8 s of CPU, of which the
lexer-state x token table (cached on its own, `automata/_token_table.py`) is only part:
the Lark parse, the terminal automata and the canonical LR(1) closures (~1 s) were
redone by every process. This caches the finished tables, so that a second process
compiling the same grammar for the same vocabulary reads one file instead.

A file is `<cache_dir>/lexed-v<LEXED_CACHE_VERSION>-<key>.npz`, uncompressed (loading
is a read, not an inflate; its zip CRCs still catch damage), written atomically. The
key is the SHA-256 of everything the tables depend on: the grammar text and every
keyword argument given to `compile_lexed_grammar` but the cache location (start rule,
stack depth, `Indentation` / `Semicolons` and their fields; a new argument joins the key
by itself), the vocabulary's fingerprint and size, `LEXED_CACHE_VERSION`, the library
version, numpy's and pynini's versions, and a digest of the library's host-compiler
sources (so an edited compiler in a development checkout never reads tables that its
old self wrote). The full key text is
stored in the file and compared on load: a hash-prefix collision or a damaged, stale
or foreign file is a miss, never an error; the tables are then compiled and the file
rewritten. Files are pruned with the rest of the compile cache, least recently used
first, past `max_cache_bytes` (a hit touches its file; `_cache.prune_cache`).

Measured (Python grammar, Gemma 3, fresh processes, load ~7): a hit costs 0.05-0.06 s
CPU (0.13-0.16 s wall) against 1.7 s cold and 0.7-0.85 s with only the token table
cached; the file is 71 MB (68 MiB of tables). Compressed it would be 10.6 MB but cost
0.14-0.22 s of CPU to inflate, so it is stored.

Public (to the compiler):
  LEXED_CACHE_VERSION
  CompiledLexed                      tables + the counts `CompileInfo` reports.
  load_or_compile(text, vocab, kwargs, cache_dir, build, max_cache_bytes)
  cache_key, cache_path
"""

import dataclasses
import functools
import hashlib
import json
import logging
import os

import numpy as np

from constrained_decoding import _cache
from constrained_decoding import _version
from constrained_decoding import lexed_tables as _lexed_tables
from constrained_decoding.automata._detokenizer import write_cache_file

_log = logging.getLogger(__name__)

# Bumped (in `_cache.FORMATS`) whenever what a file holds, or how it is read, changes.
LEXED_CACHE_VERSION = _cache.FORMATS["lexed"].version
_PREFIX = "lexed-v"
_KEY = "__key__"
_COUNTS = "__counts__"  # lexer states, number of terminals (for CompileInfo)
# Host-side sources whose edits can change the tables (relative to the package).
_SOURCE_DIRS = ("automata", "constraints", "vocab")
_SOURCE_FILES = ("lexed_tables.py", "_lexed_cache.py")


@dataclasses.dataclass(frozen=True)
class CompiledLexed:
  """Compiled (or cached) tables and what `CompileInfo` reports of them."""
  tables: _lexed_tables.LexedTables
  lexer_states: int
  num_terminals: int
  from_cache: bool


@functools.cache
def _source_digest() -> str:
  """SHA-256 of the host compiler's .py files (read once per process; "" if unreadable,
  e.g. from a zip import: the library version still keys the files)."""
  root = os.path.dirname(os.path.abspath(__file__))
  paths = [os.path.join(root, f) for f in _SOURCE_FILES]
  for d in _SOURCE_DIRS:
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, d)):
      dirnames.sort()
      paths += [os.path.join(dirpath, f) for f in sorted(filenames)
                if f.endswith((".py", ".lark"))]
  h = hashlib.sha256()
  try:
    for p in paths:
      h.update(os.path.relpath(p, root).encode() + b"\0")
      with open(p, "rb") as f:
        h.update(f.read())
  except OSError:
    return ""
  return h.hexdigest()


@functools.cache
def _dependency_versions() -> dict:
  """Versions of the libraries the host compiler builds with (pynini's automata and
  numpy's sorts shape the state numbering)."""
  try:
    import pynini  # pylint: disable=g-import-not-at-top  (loaded by the compiler anyway)
    pynini_version = getattr(pynini, "__version__", "?")
  except ImportError:
    pynini_version = None
  return {"numpy": np.__version__, "pynini": pynini_version}


def _plain(value):
  """A JSON-able form of a compile argument, naming dataclasses by type and fields."""
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {"__type__": type(value).__qualname__,
            **{f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if isinstance(value, dict):
    return {str(k): _plain(v) for k, v in sorted(value.items())}
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  return repr(value)


def cache_key(text: str, vocab, kwargs: dict) -> str:
  """The text every input of the tables is spelled in (its SHA-256 names the file)."""
  return json.dumps({
      "format": LEXED_CACHE_VERSION, "library": _version.__version__,
      "sources": _source_digest(), "deps": _dependency_versions(),
      "vocab": vocab.fingerprint,
      "vocab_size": int(vocab.vocab_size), "text": text, "kwargs": _plain(kwargs),
  }, sort_keys=True)


def cache_path(cache_dir: str, key: str) -> str:
  digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
  return os.path.join(cache_dir, f"{_PREFIX}{LEXED_CACHE_VERSION}-{digest}.npz")


def _load(path: str, key: str, vocab) -> CompiledLexed | None:
  """The cached tables at `path` if it holds `key`'s, else None (missing or bad file)."""
  try:
    with np.load(path, allow_pickle=False) as data:
      if bytes(data[_KEY]).decode("utf-8") != key:
        return None
      counts = data[_COUNTS]
      meta = {f: int(counts[i + 2]) for i, f in
              enumerate(("vocab_size", "stack_depth", "indent_depth"))}
      tables = _lexed_tables.LexedTables(
          **{f: data[f] for f in _lexed_tables._ARRAY_FIELDS},  # pylint: disable=protected-access
          **meta, vocab_fingerprint=vocab.fingerprint)
    return CompiledLexed(tables, lexer_states=int(counts[0]), num_terminals=int(counts[1]),
                         from_cache=True)
  except FileNotFoundError:
    return None
  except Exception as e:  # pylint: disable=broad-except  (a cache never fails a compile)
    _log.warning("Ignoring the damaged lexed-grammar cache file %s (%s: %s); recompiling.",
                 path, type(e).__name__, e)
    return None


def _save(cache_dir: str, path: str, key: str, compiled: CompiledLexed,
          max_cache_bytes: int) -> None:
  t = compiled.tables
  arrays = {f: np.asarray(getattr(t, f)) for f in _lexed_tables._ARRAY_FIELDS}  # pylint: disable=protected-access
  arrays[_KEY] = np.frombuffer(key.encode("utf-8"), np.uint8)
  arrays[_COUNTS] = np.array([compiled.lexer_states, compiled.num_terminals, t.vocab_size,
                              t.stack_depth, t.indent_depth], np.int64)
  write_cache_file(cache_dir, path, arrays, max_bytes=max_cache_bytes)


def load_or_compile(text: str, vocab, kwargs: dict, cache_dir: str | None, build,
                    max_cache_bytes: int) -> CompiledLexed:
  """The tables of `compile_lexed_grammar(text, vocab, **kwargs, ...)`: read from
  `cache_dir` when a file holds them, else `build()` (-> `LexedArrays`) and written
  there. `kwargs` are the arguments that shape the tables (not the cache location);
  `cache_dir` None: no disk cache, nothing read or written."""
  if cache_dir is not None:
    key = cache_key(text, vocab, kwargs)
    path = cache_path(cache_dir, key)
    cached = _load(path, key, vocab)
    if cached is not None:
      _cache.touch(path)  # Recently used: pruned last.
      return cached
  arrays = build()
  compiled = CompiledLexed(
      _lexed_tables.lexed_tables_from_arrays(arrays, vocab_fingerprint=vocab.fingerprint),
      lexer_states=int(arrays.lexer.num_states), num_terminals=len(arrays.lr.terminals),
      from_cache=False)
  if cache_dir is not None:
    _save(cache_dir, path, key, compiled, max_cache_bytes)
  return compiled
