"""`Gemma3`: weights, config, tokenizer and vocabulary of one model, bundled.

It implements the `models.LanguageModel` protocol (`network`, `params`, `vocab`,
`encode`) that `generate`, `evaluate` and the other decode loops take; the functional
API (`forward`, `init_cache`) stays the way to use the model inside your own jitted code.
"""

import dataclasses
import os
from typing import Any

import jax.numpy as jnp

from constrained_decoding.models import _config
from constrained_decoding.models import _gemma3
from constrained_decoding.models import _gguf_weights
from constrained_decoding.models import _paths
from constrained_decoding.vocab._gguf_file import read_gguf
from constrained_decoding.vocab._spm_from_gguf import sentencepiece_from_gguf
from constrained_decoding.vocab._vocabulary import Vocabulary

# Gemma's chat turn markup (instruction-tuned weights only).
_CHAT_TEMPLATE = "<start_of_turn>user\n{message}<end_of_turn>\n<start_of_turn>model\n"


@dataclasses.dataclass(frozen=True, eq=False)
class Gemma3:
  """A Gemma 3 model ready for `generate` (a `models.LanguageModel`).

  ```python
  model = Gemma3.from_gguf()                   # the default Gemma 3 270M
  ids = model.encode("The capital of France is")
  ```

  Attributes:
    config: Hyper-parameters (static under jit).
    params: Weights pytree.
    tokenizer: SentencePiece processor rebuilt from the GGUF (for prompts).
    vocab: The vocabulary constraints are compiled for (token bytes, eos ids).
    bos_id: Token prepended to every prompt.
  """

  config: _config.Gemma3Config
  params: Any
  tokenizer: Any
  vocab: Vocabulary
  bos_id: int

  @classmethod
  def from_gguf(cls, path: str | os.PathLike | None = None, *, dtype: Any = jnp.float32,
                progress: bool = True) -> "Gemma3":
    """Loads a Gemma 3 GGUF (default: the packaged Gemma 3 270M); weights are cached."""
    path = os.fspath(path) if path is not None else _paths.default_gguf_path()
    gguf = read_gguf(path)
    tokenizer = sentencepiece_from_gguf(gguf)
    return cls(
        config=_config.Gemma3Config.from_gguf(gguf),
        params=_gguf_weights.load_gguf_params(path, dtype=dtype, progress=progress),
        tokenizer=tokenizer,
        vocab=Vocabulary.from_gguf(path),
        bos_id=int(gguf.metadata.get("tokenizer.ggml.bos_token_id", tokenizer.bos_id())),
    )

  @classmethod
  def random(cls, config: _config.Gemma3Config, *, tokenizer: Any, vocab: Vocabulary,
             bos_id: int, seed: int = 0) -> "Gemma3":
    """Random weights of the given architecture (for tests), with a real tokenizer."""
    return cls(config=config, params=_gemma3.random_params(config, seed), tokenizer=tokenizer,
               vocab=vocab, bos_id=bos_id)

  @property
  def network(self) -> _gemma3.Gemma3Network:
    """The model's pure functions (static under jit; compared by `config`)."""
    return _gemma3.Gemma3Network(self.config)

  def encode(self, text: str) -> list[int]:
    """Token ids of a prompt, with BOS prepended."""
    return [self.bos_id, *self.tokenizer.EncodeAsIds(text)]

  @staticmethod
  def chat_prompt(message: str) -> str:
    """`message` as one user turn of Gemma's chat template, ready for the model's answer."""
    return _CHAT_TEMPLATE.format(message=message)
