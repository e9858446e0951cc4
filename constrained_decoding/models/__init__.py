"""Gemma 3 (text) in JAX, loaded from GGUF files: the library's default model.

```python
from constrained_decoding import models

path = models.default_gguf_path()
config = models.Gemma3Config.from_gguf(path)
params = models.load_gguf_params(path)
cache = models.init_cache(config, batch_size=1, cache_len=512)
logits, cache = models.forward(params, config, tokens, positions, cache)
```

The decode loops (`generate`, `evaluate`, ...) take any `LanguageModel`: a static
`Network` (`init_cache`, `apply`, `logits_width`), its `params`, a `Vocabulary` and
`encode(text)`. `Gemma3` is one; see `docs/models.md` to wrap your own.

Device code: imports jax, never pynini.
"""

from constrained_decoding.models._config import Gemma3Config
from constrained_decoding.models._config import ModelFormatError
from constrained_decoding.models._gemma3 import Gemma3Network
from constrained_decoding.models._gemma3 import KVCache
from constrained_decoding.models._gemma3 import Params
from constrained_decoding.models._gemma3 import forward
from constrained_decoding.models._gemma3 import init_cache
from constrained_decoding.models._gemma3 import param_shapes
from constrained_decoding.models._gemma3 import random_params
from constrained_decoding.models._gguf_weights import default_cache_dir
from constrained_decoding.models._gguf_weights import load_gguf_params
from constrained_decoding.models._model import Gemma3
from constrained_decoding.models._paths import default_gguf_path
from constrained_decoding.models._protocol import LanguageModel
from constrained_decoding.models._protocol import ModelProtocolError
from constrained_decoding.models._protocol import Network
from constrained_decoding.models._protocol import check_model

__all__ = [
    "Gemma3",
    "Gemma3Config",
    "Gemma3Network",
    "KVCache",
    "LanguageModel",
    "ModelFormatError",
    "ModelProtocolError",
    "Network",
    "Params",
    "check_model",
    "default_cache_dir",
    "default_gguf_path",
    "forward",
    "init_cache",
    "load_gguf_params",
    "param_shapes",
    "random_params",
]
