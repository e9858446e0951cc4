"""Where the library keeps its on-disk caches: one setting, the `CONSTRAINED_DECODING_CACHE`
environment variable.

Two caches live under the root, both safe to delete at any time (they are rebuilt):

  <root>/          per-vocabulary compilation work: the token trie (`trie-v*.arrays`, and
                   `tv-v*.fst`), the token bitmaps of wide states (`wide-v*.arrays`),
                   counted classes' character counts (`class-counts-v*`), and grammars
                   with a lexer: their lexer-state x token tables (`lexer-v*.npz`) and
                   whole compiled tables (`lexed-v*.npz`, ~71 MB for Python with Gemma 3;
                   `_lexed_cache.py`); all pruned together past
                   `CompileOptions.max_cache_bytes` (below); `CompileOptions.cache_dir`.
  <root>/models/   dequantized GGUF weights (about 1 GiB in float32 for Gemma 3 270M);
                   `models.default_cache_dir()`, `load_gguf_params(cache_dir=...)`.

The root is `$CONSTRAINED_DECODING_CACHE` when set (`~` is expanded), else
`$XDG_CACHE_HOME/constrained_decoding`, else `~/.cache/constrained_decoding`. It is read
each time a default is needed (a `CompileOptions()` or a weight load), not only at
import, so setting it in a notebook before compiling is enough. Passing an explicit
`cache_dir` (or `cache_dir=None`: no disk cache) still overrides it per call; this is a
location, not a behaviour switch.

Pruning (`prune_cache`, one policy for every kind in `FORMATS`), after a write to a
compile cache directory (`after_write`: a process's first write there, then once every
1/16 of the limit written, as a scan stats every file: ~16 ms CPU for 3,200 files): the
files of format versions other than the current one are deleted, then the least
recently used ones (by mtime: a hit touches its file, `touch`) until what is left of all
kinds takes at most 3/4 of 15/16 of the limit, when it exceeds 15/16 (so the writes
until the next prune stay within the limit). The file just written is never deleted,
even alone over the limit. The limit is the `CompileOptions.max_cache_bytes` of the
last `Compiler` over that directory (`set_max_bytes`), else `DEFAULT_MAX_CACHE_BYTES`.
Files of other names (the models/ folder among them) are neither counted nor deleted.
Another process may delete a file while this one reads it: every reader treats a
missing or damaged file (`READ_ERRORS`) as a miss and rebuilds it.

Imports only the standard library (used by host and device modules alike).
"""

import os
import re
import time
import typing
import zipfile

CACHE_ENV = "CONSTRAINED_DECODING_CACHE"
# The compile cache is pruned, least recently used first, past this size (default of
# `CompileOptions.max_cache_bytes`).
DEFAULT_MAX_CACHE_BYTES = 1 << 30


class Format(typing.NamedTuple):
  version: int  # Files `<kind>-v<version>-...`; bump when what a file holds changes.
  suffix: str   # The current version's file name ending.


# Every kind of compile-cache file and its current format (the writers read their
# version here, so that pruning knows which files are dead).
FORMATS = {
    "trie": Format(2, ".arrays"),       # automata/_detokenizer.py: the token trie (v1: .npz)
    "tv": Format(1, ".fst"),            # automata/_detokenizer.py: T_V as an OpenFst file
    # automata/_counting*.py (+ -subtrie-, -inner-); v<3: .npz.
    "class-counts": Format(3, ".arrays"),
    "lexer": Format(1, ".npz"),         # automata/_token_table.py: lexer x token tables
    "lexed": Format(1, ".npz"),         # _lexed_cache.py: whole lexed-grammar tables
    "wide": Format(8, ".arrays"),       # automata/_wide.py: terminal bitmaps (v<8: .npz)
}
_NAME = re.compile(r"([a-z]+(?:-[a-z]+)*)-v(\d+)-")
# `tempfile.mkstemp` leftovers of writers that died mid-write are deleted past this age.
_STALE_TMP_SECONDS = 3600
# What reading a missing, truncated or damaged cache file raises (np.load's zip reader
# raises BadZipFile, neither OSError nor ValueError).
READ_ERRORS = (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile)
_MAX_BYTES: dict[str, int] = {}  # Directory -> the limit a `Compiler` set for it.
# Directory -> bytes this process wrote there since it last pruned it (absent: never).
_UNPRUNED: dict[str, int] = {}


def cache_root() -> str:
  """The root of every on-disk cache (see the module docstring for the order)."""
  root = os.environ.get(CACHE_ENV)
  if root:
    return os.path.abspath(os.path.expanduser(root))
  xdg = os.environ.get("XDG_CACHE_HOME")
  if xdg and os.path.isabs(xdg):  # The XDG spec says to ignore relative paths.
    return os.path.join(xdg, "constrained_decoding")
  return os.path.join(os.path.expanduser("~"), ".cache", "constrained_decoding")


def compiler_cache_dir() -> str:
  """Default `CompileOptions.cache_dir`: the token trie and wide-state bitmaps."""
  return cache_root()


def models_cache_dir() -> str:
  """Default cache of dequantized model weights."""
  return os.path.join(cache_root(), "models")


def set_max_bytes(cache_dir: str | None, max_bytes: int) -> None:
  """Makes `max_bytes` the limit of `cache_dir` for the writers that are not given one
  (the trie, class counts, lexer tables: `CompileOptions.max_cache_bytes`)."""
  if cache_dir is not None:
    _MAX_BYTES[os.path.abspath(cache_dir)] = max_bytes
    _UNPRUNED.pop(os.path.abspath(cache_dir), None)  # The next write prunes.


def max_bytes_of(cache_dir: str) -> int:
  return _MAX_BYTES.get(os.path.abspath(cache_dir), DEFAULT_MAX_CACHE_BYTES)


def touch(path: str) -> None:
  """Marks a cache file recently used (on a hit): pruned last. Best effort (a read-only
  cache still serves; the file may have been pruned by another process meanwhile)."""
  try:
    os.utime(path)
  except OSError:
    pass


def _is_current(name: str) -> bool | None:
  """Whether `name` is a compile-cache file of its kind's current format; None if it
  is no such file (not counted, never deleted)."""
  m = _NAME.match(name)
  fmt = FORMATS.get(m.group(1)) if m else None
  if fmt is None:
    return None
  return int(m.group(2)) == fmt.version and name.endswith(fmt.suffix)


def after_write(cache_dir: str, path: str, max_bytes: int | None = None) -> None:
  """Prunes `cache_dir` after `path` was written to it, now and then (see the module
  docstring): the files stay within `max_bytes` (`max_bytes_of(cache_dir)` when None)."""
  if max_bytes is None:
    max_bytes = max_bytes_of(cache_dir)
  key = os.path.abspath(cache_dir)
  try:
    written = os.stat(path).st_size
  except OSError:
    written = 0
  unpruned = _UNPRUNED.get(key, max_bytes) + written
  if unpruned * 16 >= max_bytes:
    prune_cache(cache_dir, max_bytes - max_bytes // 16, keep=path)
    unpruned = 0
  _UNPRUNED[key] = unpruned


def prune_cache(cache_dir: str, max_bytes: int | None = None, keep: str | None = None
                ) -> None:
  """Deletes `cache_dir`'s files of dead formats and stale temporary files, then the
  least recently used files of every kind until those left take at most 3/4 of
  `max_bytes` (`max_bytes_of(cache_dir)` when None), when they exceed it. `keep` (the
  file just written) is never deleted. One directory scan; tolerates files vanishing
  meanwhile (compilers in other processes share the cache)."""
  if max_bytes is None:
    max_bytes = max_bytes_of(cache_dir)
  keep = None if keep is None else os.path.abspath(keep)
  files, total = [], 0
  old_tmp = time.time() - _STALE_TMP_SECONDS
  try:
    entries = list(os.scandir(cache_dir))
  except OSError:
    return
  for entry in entries:
    try:
      current = _is_current(entry.name)
      if current is None:
        if (entry.name.startswith("tmp") and entry.name.endswith((".npz", ".tmp", ".fst"))
            and entry.is_file() and entry.stat().st_mtime < old_tmp):
          os.remove(entry.path)
      elif not current:
        os.remove(entry.path)
      elif entry.is_file():
        stat = entry.stat()
        total += stat.st_size
        if os.path.abspath(entry.path) != keep:
          files.append((stat.st_mtime, stat.st_size, entry.path))
    except OSError:
      pass
  if total <= max_bytes:
    return
  for _, size, path in sorted(files):
    if total <= max_bytes * 3 // 4:
      break
    try:
      os.remove(path)
    except OSError:
      pass
    total -= size
