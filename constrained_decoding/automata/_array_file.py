"""A flat file of named numpy arrays, read in one system call: the per-vocabulary cache's
format for terminals and fragments (`_wide.WideStates`), the token trie and the class
counts (`_detokenizer.read_cache_file` reads a path ending in `.arrays` with it).

`.npz` costs ~0.6 ms to read a terminal's nine arrays (a zip directory, a header parsed
per array with `ast.literal_eval`, a CRC per member), and a compile reads tens to
hundreds of them; this format reads the same arrays in ~0.07 ms. Layout:

  MAGIC, header length (8 bytes, little endian), header (JSON: [[name, dtype, shape,
  offset], ...], space padded to a multiple of 64 bytes in all), then each array's bytes
  in C order at its offset (a multiple of 64) after the header.

Arrays come back writable (as from `np.load`), sharing one private copy-on-write
mapping of the file (`mmap.ACCESS_COPY`): pages are read in as touched and never written
back. Reading a file into memory instead cost 4x more CPU (zero-filled, then copied: ~30
ms for the 94 MB of terminals with sub-tries that a first compile of the corpus's
`config_package_json` reads, against ~9 ms mapped with every page touched). Writers must
replace files (`write_cache_file` renames a new file over the old), never truncate one in
place: a mapped file cut short faults on access. A damaged or truncated file raises
ValueError, like `np.load`'s, so callers treat it as a miss.
"""

import json
import math
import mmap
import os

import numpy as np

MAGIC = b"CDARRAYS1\n"
_ALIGN = 64  # Offsets of array data, so that every dtype is aligned in the buffer.


def write(f, arrays: dict) -> None:
  """Writes `arrays` (name -> array-like) to the binary file object `f`."""
  meta, blobs, offset = [], [], 0
  for name, value in arrays.items():
    value = np.asarray(value)  # `tobytes` writes C order (ascontiguousarray makes 0-d 1-d).
    if value.dtype.hasobject:
      raise ValueError(f"Array {name!r} has dtype object. Expected plain numbers.")
    offset = -(-offset // _ALIGN) * _ALIGN
    meta.append([name, value.dtype.str, list(value.shape), offset])
    blobs.append((offset, value.tobytes()))
    offset += value.nbytes
  header = json.dumps(meta).encode()
  # Spaces pad the header so that the data starts aligned too (numpy arrays on an
  # unaligned buffer are slower, and their memoryviews cannot be indexed).
  header += b" " * (-(len(MAGIC) + 8 + len(header)) % _ALIGN)
  f.write(MAGIC + len(header).to_bytes(8, "little") + header)
  position = 0
  for at, blob in blobs:
    f.write(b"\0" * (at - position) + blob)
    position = at + len(blob)


def read(path: str) -> dict[str, np.ndarray]:
  """The arrays `write` stored in the file at `path`.

  Raises:
    OSError: The file cannot be read.
    ValueError: It is not such a file, or is damaged or truncated.
  """
  with open(path, "rb") as f:
    size = os.fstat(f.fileno()).st_size
    if size < len(MAGIC) + 8:  # Also what mmap cannot map (an empty file).
      raise ValueError(f"{path} is not an array file (size {size}).")
    # Writable like np.load's arrays, private (writes stay in this process); the
    # mapping outlives the file object (and the file's deletion by pruning).
    data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
  start = len(MAGIC) + 8
  if data[:len(MAGIC)] != MAGIC:
    raise ValueError(f"{path} is not an array file (bad magic).")
  size = int.from_bytes(data[len(MAGIC):start], "little")
  try:
    meta = json.loads(data[start:start + size])
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path} has a damaged header ({e}).") from e
  base = start + size
  if base % _ALIGN:
    raise ValueError(f"{path} has unaligned data (written by an older version).")
  out = {}
  try:
    for name, dtype, shape, offset in meta:
      dtype = np.dtype(dtype)
      count = math.prod(shape)
      if base + offset + count * dtype.itemsize > len(data):
        raise ValueError(f"{path} is truncated (array {name!r}).")
      out[name] = np.frombuffer(data, dtype, count, base + offset).reshape(tuple(shape))
  except (TypeError, ValueError) as e:
    raise ValueError(f"{path} is damaged ({e}).") from e
  return out
