"""Gemma 3 weights from a GGUF file: dequantize once, then load from a disk cache.

Public functions:
  load_gguf_params(path, ...) -> Params   dequantized weights in the `forward` layout.
  default_cache_dir() -> str              where dequantized weights are cached.

Tensors are dequantized one at a time with `gguf.quants.dequantize`, straight from a
memory map of the file (`gguf.GGUFReader` is avoided: it builds Python objects for all
262k token strings and takes ~10 s). Dequantizing Gemma 3 270M takes a few seconds, so
the result is written to a cache directory as one `.npy` file per parameter, which later
loads read back at disk speed.
"""

import hashlib
import json
import math
import os
import shutil
import sys
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from constrained_decoding import _cache
from constrained_decoding.models import _config
from constrained_decoding.models import _gemma3
from constrained_decoding.vocab import _gguf_file

# Bump whenever the params layout or the dequantization changes: old caches are then
# ignored rather than misread.
_CACHE_FORMAT_VERSION = 1
_MANIFEST = "manifest.json"
# Rows are dequantized in chunks of about this many values, which bounds the temporary
# memory of `gguf.quants` (several times the chunk) on the 168M-value embedding.
_CHUNK_VALUES = 1 << 22
# Bytes sampled from the tensor data for the cache key (see `_cache_key`).
_NUM_SAMPLES = 64
_SAMPLE_BYTES = 1 << 14

# For each per-layer parameter, the GGUF tensors (`blk.{i}.<name>.weight`) whose
# (out, in) matrices are stacked along `out` to build it.
_LAYER_TENSORS = {
    "pre_attention_norm": ("attn_norm",),
    "qkv": ("attn_q", "attn_k", "attn_v"),
    "query_norm": ("attn_q_norm",),
    "key_norm": ("attn_k_norm",),
    "attention_output": ("attn_output",),
    "post_attention_norm": ("post_attention_norm",),
    "pre_ffw_norm": ("ffn_norm",),
    "gate_up": ("ffn_gate", "ffn_up"),
    "down": ("ffn_down",),
    "post_ffw_norm": ("post_ffw_norm",),
}


def default_cache_dir() -> str:
  """Where dequantized weights are kept: `models/` under the cache root
  (`$CONSTRAINED_DECODING_CACHE`, else `~/.cache/constrained_decoding`)."""
  return _cache.models_cache_dir()


def load_gguf_params(
    path: str | os.PathLike,
    *,
    dtype: Any = jnp.float32,
    progress: bool = True,
    cache: bool = True,
    cache_dir: str | os.PathLike | None = None,
) -> _gemma3.Params:
  """Loads a Gemma 3 GGUF file's weights in the layout `forward` expects.

  ```python
  path = default_gguf_path()
  config = Gemma3Config.from_gguf(path)
  params = load_gguf_params(path)
  ```

  The first load dequantizes every tensor (about 5 s for Gemma 3 270M) and, with
  `cache=True`, writes the result under `cache_dir/<key>/` (1 GiB in float32); the key
  hashes the file's header, size and samples of its tensor data, so a different file
  never hits another's cache. Later loads read that directory instead.

  Conventions handled here: dequantized GGUF matrices are already (out, in); norm
  weights already include Gemma's `1 + scale`; q/k/v and gate/up are fused (see
  `constrained_decoding.models` for the layout).

  Args:
    path: A Gemma 3 `.gguf` file.
    dtype: dtype of the returned params (float32, or bfloat16 to halve memory).
    progress: Whether to show progress on stderr.
    cache: Whether to read and write the on-disk cache.
    cache_dir: Cache root; `None` means `default_cache_dir()`.

  Returns:
    The params pytree, as jax arrays of `dtype`.

  Raises:
    ModelFormatError: If the file is not a Gemma 3 GGUF or a tensor has the wrong shape.
  """
  gguf_file = _gguf_file.read_gguf(path)
  config = _config.Gemma3Config.from_gguf(gguf_file)
  np_dtype = np.dtype(jnp.dtype(dtype))
  expected = _gemma3.param_shapes(config)
  if not cache:
    return _dequantize_params(gguf_file, config, expected, np_dtype, progress, None)
  directory = os.path.join(os.fspath(cache_dir or default_cache_dir()),
                           _cache_key(gguf_file, np_dtype))
  params = _read_cache(directory, expected, np_dtype, progress)
  if params is not None:
    return params
  return _dequantize_params(gguf_file, config, expected, np_dtype, progress, directory)


def _dequantize_params(gguf_file: _gguf_file.GgufFile, config: _config.Gemma3Config,
                       expected: _gemma3.Params, np_dtype: np.dtype, progress: bool,
                       directory: str | None) -> _gemma3.Params:
  """Dequantizes every parameter, optionally saving each into a new cache directory."""
  builders = _leaf_builders(gguf_file, config)
  paths_specs, treedef = jax.tree_util.tree_flatten_with_path(expected)
  writer = None if directory is None else _CacheWriter(directory)
  leaves = []
  try:
    for key_path, spec in _progress(paths_specs, progress,
                                    "Dequantizing GGUF weights (cached afterwards)"):
      name = jax.tree_util.keystr(key_path)
      value = builders[name]().astype(np_dtype, copy=False)
      if value.shape != spec.shape:
        raise _config.ModelFormatError(
            f"GGUF file {gguf_file.path!r} gives parameter {name} shape {value.shape}. "
            f"Expected {spec.shape} from the file's own hyper-parameters; the file is "
            "inconsistent or not a Gemma 3 model."
        )
      if writer is not None:
        writer.save(name, value)
      leaves.append(jnp.asarray(value))
      del value  # Keep at most one numpy copy alive next to the jax arrays.
    if writer is not None:
      writer.finish(np_dtype, gguf_file.path)
  finally:
    if writer is not None:
      writer.discard_temporary()
  return jax.tree.unflatten(treedef, leaves)


class _CacheWriter:
  """Fills a temporary directory, then moves it into place in one rename.

  The cache is only an optimization: an OS error (read-only or full disk) warns once
  and turns caching off instead of failing the load.
  """

  def __init__(self, directory: str):
    self._directory = directory
    self._tmp = f"{directory}.tmp-{os.getpid()}"
    self._entries: list[dict[str, Any]] = []
    self._enabled = True
    self._attempt(lambda: (shutil.rmtree(self._tmp, ignore_errors=True),
                           os.makedirs(self._tmp)))

  def save(self, name: str, value: np.ndarray) -> None:
    file_name = f"{len(self._entries):03d}.npy"
    self._attempt(lambda: np.save(os.path.join(self._tmp, file_name), _storable(value)))
    self._entries.append({"name": name, "file": file_name, "shape": list(value.shape)})

  def finish(self, np_dtype: np.dtype, source: str) -> None:
    """Writes the manifest last, so that a directory with one is always complete."""

    def write():
      with open(os.path.join(self._tmp, _MANIFEST), "w") as f:
        json.dump({"format_version": _CACHE_FORMAT_VERSION, "dtype": np_dtype.name,
                   "source": source, "params": self._entries}, f, indent=1)
      shutil.rmtree(self._directory, ignore_errors=True)
      try:
        os.replace(self._tmp, self._directory)
      except OSError:
        if not os.path.exists(os.path.join(self._directory, _MANIFEST)):
          raise
        # Otherwise another process finished the same cache first; its copy is as good.

    self._attempt(write)

  def discard_temporary(self) -> None:
    shutil.rmtree(self._tmp, ignore_errors=True)

  def _attempt(self, action: Callable[[], Any]) -> None:
    if not self._enabled:
      return
    try:
      action()
    except OSError as e:
      self._enabled = False
      warnings.warn(
          f"Could not write the weight cache {self._directory!r}: {e}. The weights "
          "load fine but will be dequantized again next time; pass cache_dir= a "
          "writable directory, or cache=False to silence this.", stacklevel=4)


def _leaf_builders(gguf_file: _gguf_file.GgufFile, config: _config.Gemma3Config
                   ) -> dict[str, Callable[[], np.ndarray]]:
  """Maps each params key path (`jax.tree_util.keystr`) to a function building it."""

  def stacked(*names: str) -> Callable[[], np.ndarray]:
    return lambda: np.concatenate([_dequantize(gguf_file, n) for n in names], axis=0)

  builders = {
      "['embedding']": stacked("token_embd.weight"),
      "['final_norm']": stacked("output_norm.weight"),
  }
  for i in range(config.num_layers):
    for leaf, tensors in _LAYER_TENSORS.items():
      names = [f"blk.{i}.{t}.weight" for t in tensors]
      builders[f"['layers'][{i}]['{leaf}']"] = stacked(*names)
  return builders


def _dequantize(gguf_file: _gguf_file.GgufFile, name: str) -> np.ndarray:
  """One GGUF tensor as float32 numpy, in (out, in) order (GGUF's dims reversed)."""
  # Imported here, not at the top: a machine that only runs saved tables (an accelerator
  # lent without the GGUF, see benchmarks/device_kit.py) can import the models package.
  import gguf.constants  # pylint: disable=g-import-not-at-top
  import gguf.quants  # pylint: disable=g-import-not-at-top
  info = gguf_file.tensors.get(name)
  if info is None:
    raise _config.ModelFormatError(
        f"GGUF file {gguf_file.path!r} has no tensor {name!r}. Expected every tensor of "
        "a Gemma 3 text model, as written by llama.cpp's converter."
    )
  try:
    qtype = gguf.constants.GGMLQuantizationType(info.ggml_type)
    block_size, type_size = gguf.constants.GGML_QUANT_SIZES[qtype]
  except (ValueError, KeyError) as e:
    raise _config.ModelFormatError(
        f"Tensor {name!r} of {gguf_file.path!r} has ggml type {info.ggml_type}, which "
        "the installed gguf package does not know. Expected a type that "
        "`gguf.quants.dequantize` supports; upgrade the gguf package."
    ) from e
  row_len = info.shape[0]
  num_rows = math.prod(info.shape[1:])
  row_bytes = row_len // block_size * type_size
  raw = gguf_file.raw_tensor_bytes(name, num_rows * row_bytes).reshape(num_rows, row_bytes)
  out = np.empty((num_rows, row_len), np.float32)
  chunk = max(1, _CHUNK_VALUES // row_len)
  for start in range(0, num_rows, chunk):
    out[start:start + chunk] = gguf.quants.dequantize(raw[start:start + chunk], qtype)
  return out.reshape(info.shape[::-1])


def _cache_key(gguf_file: _gguf_file.GgufFile, np_dtype: np.dtype) -> str:
  """A name for the cache directory of this file's weights in `np_dtype`.

  Hashes the whole header (metadata and tensor directory), the file size and
  `_NUM_SAMPLES` evenly spaced samples of the tensor data: about 7 MB read for the 270M
  model instead of the whole 253 MB, yet a re-quantized or fine-tuned file with the
  same header still changes the sampled bytes.
  """
  size = os.path.getsize(gguf_file.path)
  data_start = min((t.offset for t in gguf_file.tensors.values()), default=size)
  digest = hashlib.sha256(
      f"v{_CACHE_FORMAT_VERSION}:{np_dtype.name}:{size}:".encode())
  with open(gguf_file.path, "rb") as f:
    digest.update(f.read(data_start))
    span = max(0, size - data_start - _SAMPLE_BYTES)
    for i in range(_NUM_SAMPLES):
      f.seek(data_start + span * i // max(1, _NUM_SAMPLES - 1))
      digest.update(f.read(_SAMPLE_BYTES))
  stem = os.path.splitext(os.path.basename(gguf_file.path))[0]
  return f"{stem}-{np_dtype.name}-{digest.hexdigest()[:16]}"


def _storable(value: np.ndarray) -> np.ndarray:
  """`value` as a dtype `np.save` round-trips (bfloat16 is stored as its bits)."""
  if value.dtype.name == "bfloat16":
    return value.view(f"u{value.dtype.itemsize}")
  return value


def _read_cache(directory: str, expected: _gemma3.Params, np_dtype: np.dtype,
                progress: bool) -> _gemma3.Params | None:
  """Loads params from a cache directory; None if it is missing or does not match."""
  try:
    with open(os.path.join(directory, _MANIFEST)) as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    return None
  paths_specs, treedef = jax.tree_util.tree_flatten_with_path(expected)
  entries = manifest.get("params", [])
  names = [jax.tree_util.keystr(p) for p, _ in paths_specs]
  if (manifest.get("format_version") != _CACHE_FORMAT_VERSION
      or manifest.get("dtype") != np_dtype.name
      or [e["name"] for e in entries] != names):
    return None
  leaves = []
  for entry, (_, spec) in _progress(list(zip(entries, paths_specs)), progress,
                                    "Loading cached weights"):
    try:
      # Through a (private) memory map, jax copies each array once, straight from the
      # page cache; `np.load` into memory and then copying was 4x slower (3.2 s).
      value = np.load(os.path.join(directory, entry["file"]), mmap_mode="c")
      value = value.view(np_dtype)
    except (OSError, ValueError):
      return None
    if value.shape != spec.shape:
      return None
    leaves.append(jnp.asarray(value))
  return jax.tree.unflatten(treedef, leaves)


def _progress(items: list[Any], enabled: bool, description: str):
  return tqdm.tqdm(items, desc=description, file=sys.stderr, disable=not enabled,
                   leave=False, unit="param")
