"""A small, fast reader for GGUF files (metadata, tensor directory, memory-mapped data).

`gguf.GGUFReader` builds Python objects for every token string and takes ~10 s and
~700 MB on the Gemma 3 vocabulary; this reader parses the header with `struct` and maps
tensor data with `np.memmap`, which takes a fraction of a second.

Public functions:
  read_gguf(path) -> GgufFile   parse the header; tensors stay on disk until asked for.
"""

import dataclasses
import os
import struct
from typing import Any

import numpy as np

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

# GGUF metadata value types -> struct format (scalars only).
_SCALAR_FORMATS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}
_NUMPY_DTYPES = {
    0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
    6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64,
}
_STRING = 8
_ARRAY = 9


class GgufFormatError(ValueError):
  """The file is not a GGUF file this reader understands."""


@dataclasses.dataclass(frozen=True)
class GgufTensorInfo:
  """Where one tensor lives in the file.

  Attributes:
    name: Tensor name, e.g. `blk.0.attn_q.weight`.
    shape: GGUF dimension order (`ne0` first, i.e. the fastest-varying axis first).
    ggml_type: The ggml quantization type id.
    offset: Absolute byte offset of the tensor data in the file.
  """

  name: str
  shape: tuple[int, ...]
  ggml_type: int
  offset: int


@dataclasses.dataclass(frozen=True)
class GgufFile:
  """Parsed header of a GGUF file.

  Attributes:
    path: The file's path.
    version: GGUF format version.
    metadata: Key -> value; strings are `str`, arrays of numbers are numpy arrays, arrays
      of strings are lists of `bytes` (undecoded: token pieces need not be valid UTF-8).
    tensors: Tensor name -> `GgufTensorInfo`, in file order.
  """

  path: str
  version: int
  metadata: dict[str, Any]
  tensors: dict[str, GgufTensorInfo]

  def raw_tensor_bytes(self, name: str, num_bytes: int) -> np.ndarray:
    """Memory-maps `num_bytes` bytes of tensor `name` as a uint8 array."""
    info = self.tensors[name]
    return np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(num_bytes,))


class _Cursor:
  """Sequential little-endian reader over a bytes buffer."""

  def __init__(self, buffer: bytes, path: str):
    self.buffer = buffer
    self.pos = 0
    self.path = path

  def scalar(self, fmt: str):
    try:
      (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
    except struct.error as e:
      raise GgufFormatError(f"GGUF file {self.path!r} is truncated at byte {self.pos}.") from e
    self.pos += struct.calcsize(fmt)
    return value

  def string(self) -> bytes:
    length = self.scalar("<Q")
    end = self.pos + length
    if end > len(self.buffer):
      raise GgufFormatError(f"GGUF file {self.path!r} is truncated at byte {self.pos}.")
    value = self.buffer[self.pos:end]
    self.pos = end
    return value

  def value(self, value_type: int):
    if value_type in _SCALAR_FORMATS:
      return self.scalar(_SCALAR_FORMATS[value_type])
    if value_type == _STRING:
      return self.string().decode("utf-8", errors="replace")
    if value_type == _ARRAY:
      item_type = self.scalar("<I")
      count = self.scalar("<Q")
      if item_type in _NUMPY_DTYPES:
        dtype = np.dtype(_NUMPY_DTYPES[item_type]).newbyteorder("<")
        end = self.pos + count * dtype.itemsize
        array = np.frombuffer(self.buffer, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos = end
        return array
      if item_type == _STRING:
        return self.string_array(count)
      return [self.value(item_type) for _ in range(count)]
    raise GgufFormatError(
        f"GGUF file {self.path!r} has unknown metadata value type {value_type} at byte "
        f"{self.pos}. Expected a type id in 0..12."
    )

  def string_array(self, count: int) -> list[bytes]:
    # The hot loop of vocabulary loading: keep it free of method calls.
    buffer, pos, unpack = self.buffer, self.pos, struct.unpack_from
    out = []
    append = out.append
    for _ in range(count):
      (length,) = unpack("<Q", buffer, pos)
      pos += 8
      append(buffer[pos:pos + length])
      pos += length
    if pos > len(buffer):
      raise GgufFormatError(f"GGUF file {self.path!r} is truncated inside a string array.")
    self.pos = pos
    return out


def read_gguf(path: str | os.PathLike) -> GgufFile:
  """Parses the header (metadata and tensor directory) of a GGUF file.

  Args:
    path: Path of a `.gguf` file (versions 2 and 3).

  Returns:
    A `GgufFile`; tensor data is not read.

  Raises:
    FileNotFoundError: If `path` does not exist.
    GgufFormatError: If the file is not GGUF or is truncated.
  """
  path = os.fspath(path)
  with open(path, "rb") as f:
    head = f.read(4)
    if head != _MAGIC:
      raise GgufFormatError(
          f"File {path!r} starts with {head!r}, not {_MAGIC!r}. Expected a GGUF model file."
      )
    # The header of a model with a 262k vocabulary is ~6 MB; read in growing chunks.
    buffer = head + f.read(1 << 23)
    while True:
      try:
        return _parse(buffer, path)
      except GgufFormatError:
        more = f.read(len(buffer))
        if not more:
          raise
        buffer += more


def _parse(buffer: bytes, path: str) -> GgufFile:
  cur = _Cursor(buffer, path)
  cur.pos = 4
  version = cur.scalar("<I")
  if version not in (2, 3):
    raise GgufFormatError(f"GGUF file {path!r} has version {version}. Expected 2 or 3.")
  num_tensors = cur.scalar("<Q")
  num_kv = cur.scalar("<Q")
  metadata: dict[str, Any] = {}
  for _ in range(num_kv):
    key = cur.string().decode("utf-8")
    metadata[key] = cur.value(cur.scalar("<I"))
  infos = []
  for _ in range(num_tensors):
    name = cur.string().decode("utf-8")
    num_dims = cur.scalar("<I")
    shape = tuple(cur.scalar("<Q") for _ in range(num_dims))
    ggml_type = cur.scalar("<I")
    offset = cur.scalar("<Q")
    infos.append((name, shape, ggml_type, offset))
  alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
  data_start = -(-cur.pos // alignment) * alignment
  tensors = {
      name: GgufTensorInfo(name, shape, ggml_type, data_start + offset)
      for name, shape, ggml_type, offset in infos
  }
  return GgufFile(path=path, version=version, metadata=metadata, tensors=tensors)
