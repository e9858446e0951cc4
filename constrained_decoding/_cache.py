"""Where the library keeps its on-disk caches: one setting, the `CONSTRAINED_DECODING_CACHE`
environment variable.

Two caches live under the root, both safe to delete at any time (they are rebuilt):

  <root>/          per-vocabulary compilation work: the token trie (`trie-v*.npz`), the
                   token bitmaps of wide states (`wide-v*.arrays`, pruned past
                   `CompileOptions.max_cache_bytes`), counted classes' character counts
                   (`class-counts-v*`), and grammars with a lexer: their lexer-state x
                   token tables (`lexer-v*.npz`) and whole compiled tables
                   (`lexed-v*.npz`, ~71 MB for Python with Gemma 3, pruned past the same
                   limit; `_lexed_cache.py`); `CompileOptions.cache_dir`.
  <root>/models/   dequantized GGUF weights (about 1 GiB in float32 for Gemma 3 270M);
                   `models.default_cache_dir()`, `load_gguf_params(cache_dir=...)`.

The root is `$CONSTRAINED_DECODING_CACHE` when set (`~` is expanded), else
`$XDG_CACHE_HOME/constrained_decoding`, else `~/.cache/constrained_decoding`. It is read
each time a default is needed (a `CompileOptions()` or a weight load), not only at
import, so setting it in a notebook before compiling is enough. Passing an explicit
`cache_dir` (or `cache_dir=None`: no disk cache) still overrides it per call; this is a
location, not a behaviour switch.

Imports only the standard library (used by host and device modules alike).
"""

import os

CACHE_ENV = "CONSTRAINED_DECODING_CACHE"


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
