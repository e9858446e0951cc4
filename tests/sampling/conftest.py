"""Tiny random Gemma 3 models shared by the sampling tests (same seeds, same weights)."""

import pytest

from constrained_decoding import models


class _ByteTokenizer:
  """Text -> its UTF-8 bytes, the token ids of the byte vocabulary."""

  def EncodeAsIds(self, text: str) -> list[int]:  # pylint: disable=invalid-name
    return list(text.encode())


@pytest.fixture(scope="module")
def byte_model(byte_vocab):
  """A tiny random Gemma 3 over the byte vocabulary, prompts encoded byte by byte."""
  config = models.Gemma3Config.tiny(vocab_size=byte_vocab.vocab_size)
  return models.Gemma3.random(config, tokenizer=_ByteTokenizer(), vocab=byte_vocab, bos_id=0,
                              seed=1)


@pytest.fixture(scope="module")
def random_model(gemma_vocab):
  """A tiny random Gemma 3 with the real Gemma 3 vocabulary and tokenizer."""
  from constrained_decoding.vocab._spm_from_gguf import sentencepiece_from_gguf  # pylint: disable=g-import-not-at-top

  tokenizer = sentencepiece_from_gguf(models.default_gguf_path())
  config = models.Gemma3Config.tiny(vocab_size=gemma_vocab.vocab_size)
  return models.Gemma3.random(config, tokenizer=tokenizer, vocab=gemma_vocab, bos_id=2, seed=3)
