"""Vocabulary loaders against the tokenizers' own decoders."""

import json
import random

import numpy as np
import pytest
import sentencepiece as spm

import constrained_decoding as cd
from constrained_decoding.vocab._vocabulary import _byte_level_decoder

_TEXTS = [
    "The capital of France is Paris.",
    "  leading spaces and\ttabs\n\nnew lines",
    "café é naïve 中文测试，你好世界 emoji 😀🎉👍🏽 ok",
    '{"a": 1, "b": [true, null, "x\\"y"]}',
    "12345 3.14159 \x00\x01 control",
]


def test_gemma_vocabulary_shape(gemma_vocab):
  assert gemma_vocab.vocab_size == 262_144
  assert gemma_vocab.num_tokens == 262_144
  assert gemma_vocab.eos_ids == (1, 106)  # <eos>, <end_of_turn>
  assert gemma_vocab.is_byte_complete  # incl. 0x00 (<0x00> is id 238)
  assert gemma_vocab.token_bytes[238] == b"\x00"
  assert gemma_vocab.token_bytes[493] == b"\xff"
  for control in (0, 1, 2, 3, 105, 106):
    assert gemma_vocab.token_bytes[control] is None


def test_gemma_vocabulary_matches_sentencepiece_decode(gemma_vocab):
  from constrained_decoding.vocab._spm_from_gguf import sentencepiece_from_gguf  # pylint: disable=g-import-not-at-top
  from constrained_decoding.models import default_gguf_path  # pylint: disable=g-import-not-at-top

  sp = sentencepiece_from_gguf(default_gguf_path())
  for text in _TEXTS:
    ids = sp.EncodeAsIds(text)
    assert gemma_vocab.decode(ids) == text.encode("utf-8")
  # Canonical ids for a known prompt (measured with llama.cpp, shared/notes).
  assert gemma_vocab.decode([818, 5279, 529, 7001, 563]) == b"The capital of France is"


def _train_spm(tmp_path, **kwargs) -> spm.SentencePieceProcessor:
  rng = random.Random(0)
  words = ["alpha", "beta", "gamma", "delta", "naïve", "café", "über", "x=1", "{y}", "中文"]
  lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)]
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(lines), encoding="utf-8")
  spm.SentencePieceTrainer.Train(
      input=str(corpus), model_prefix=str(tmp_path / "m"), vocab_size=340,
      model_type="bpe", byte_fallback=True, character_coverage=1.0, minloglevel=2,
      num_threads=1, **kwargs)
  return spm.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))


def test_from_sentencepiece_trained_model(tmp_path):
  sp = _train_spm(tmp_path, add_dummy_prefix=False)
  vocab = cd.Vocabulary.from_sentencepiece(str(tmp_path / "m.model"), vocab_size=512)
  assert vocab.vocab_size == 512 and vocab.num_tokens == sp.GetPieceSize()
  assert vocab.is_byte_complete
  assert vocab.eos_ids == (sp.eos_id(),)
  same = cd.Vocabulary.from_sentencepiece(sp.serialized_model_proto(), vocab_size=512)
  assert same.fingerprint == vocab.fingerprint
  for text in ["alpha beta", "naïve café 中文 ☃ 😀", "x=1 {y}\tz"]:
    ids = sp.EncodeAsIds(text)
    assert vocab.decode(ids).decode("utf-8") == sp.DecodeIds(ids)


def test_from_tokenizer_json_metaspace_matches_gguf(gemma_vocab):
  # A metaspace/byte-fallback tokenizer.json holding Gemma's pieces decodes identically.
  from constrained_decoding.vocab._gguf_file import read_gguf  # pylint: disable=g-import-not-at-top
  from constrained_decoding.models import default_gguf_path  # pylint: disable=g-import-not-at-top

  meta = read_gguf(default_gguf_path()).metadata
  pieces = [p.decode("utf-8") for p in meta["tokenizer.ggml.tokens"]]
  types = meta["tokenizer.ggml.token_type"]
  spec = {
      "model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>",
                "vocab": {p.replace(" ", "\u2581"): i for i, p in enumerate(pieces)
                          if types[i] in (1, 2, 6)}},
      "added_tokens": [{"id": i, "content": p, "special": bool(types[i] == 3)}
                       for i, p in enumerate(pieces) if types[i] in (3, 4)],
      "decoder": {"type": "Sequence", "decoders": [
          {"type": "Replace"}, {"type": "ByteFallback"}, {"type": "Fuse"}]},
  }
  vocab = cd.Vocabulary.from_tokenizer_json(json.dumps(spec), eos_ids=[1, 106])
  assert vocab.token_bytes == gemma_vocab.token_bytes
  assert vocab.fingerprint == gemma_vocab.fingerprint


def test_from_tokenizer_json_byte_level(tmp_path):
  tokenizers = pytest.importorskip("tokenizers")
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=340, special_tokens=["<|endoftext|>"],
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["hello world café 中文 😀 x=1"] * 50, trainer=trainer)
  path = tmp_path / "tokenizer.json"
  tok.save(str(path))
  vocab = cd.Vocabulary.from_tokenizer_json(str(path))
  assert vocab.eos_ids == (tok.token_to_id("<|endoftext|>"),)
  assert vocab.is_byte_complete
  for text in ["hello café", "中文 😀 world", "x=1\n\ty"]:
    ids = tok.encode(text).ids
    assert vocab.decode(ids).decode("utf-8") == tok.decode(ids)


def test_byte_level_decoder_is_a_bijection():
  decoder = _byte_level_decoder()
  assert sorted(decoder.values()) == list(range(256))


def test_fingerprint_depends_on_content():
  a = cd.Vocabulary.from_token_bytes([b"a", b"b", None], eos_ids=[2])
  b = cd.Vocabulary.from_token_bytes([b"a", b"c", None], eos_ids=[2])
  c = cd.Vocabulary.from_token_bytes([b"a", b"b", None], eos_ids=[2], vocab_size=8)
  assert len({a.fingerprint, b.fingerprint, c.fingerprint}) == 3
  assert a == cd.Vocabulary.from_token_bytes([b"a", b"b", None], eos_ids=[2])


@pytest.mark.parametrize("kwargs, message", [
    (dict(token_bytes=[b"a", None], eos_ids=[1], vocab_size=1),
     r"vocab_size 1 is smaller than the tokenizer's 2 tokens"),
    (dict(token_bytes=[b"a", None], eos_ids=[]), r"eos_ids is empty"),
    (dict(token_bytes=[b"a", None], eos_ids=[5]), r"End-of-sequence id 5 is outside"),
])
def test_from_token_bytes_errors(kwargs, message):
  with pytest.raises(cd.VocabularyError, match=message):
    cd.Vocabulary.from_token_bytes(kwargs.pop("token_bytes"), **kwargs)


def test_loader_errors(tmp_path):
  bad = tmp_path / "x.gguf"
  bad.write_bytes(b"NOPE" + bytes(100))
  with pytest.raises(ValueError, match=r"starts with b'NOPE', not b'GGUF'"):
    cd.Vocabulary.from_gguf(bad)
  with pytest.raises(cd.VocabularyError, match=r"model type 'WordPiece' is not supported"):
    cd.Vocabulary.from_tokenizer_json({"model": {"type": "WordPiece", "vocab": {}}})
  with pytest.raises(cd.VocabularyError, match=r"is not valid JSON"):
    cd.Vocabulary.from_tokenizer_json("{not json")
  with pytest.raises(cd.VocabularyError, match=r"names no end-of-sequence token"):
    cd.Vocabulary.from_tokenizer_json({"model": {"type": "BPE", "vocab": {"a": 0}}})
  with pytest.raises(cd.VocabularyError, match=r"Could not load SentencePiece model"):
    cd.Vocabulary.from_sentencepiece(str(tmp_path / "missing.model"))


def test_control_ids_and_decode():
  vocab = cd.Vocabulary.from_token_bytes([b"ab", None, b"", b"c"], eos_ids=[1])
  assert vocab.control_ids == (1, 2)
  assert vocab.decode(np.array([0, 1, 3, 2, 99])) == b"abc"


def test_gguf_reader_errors(tmp_path):
  import struct  # pylint: disable=g-import-not-at-top

  from constrained_decoding.vocab._gguf_file import GgufFormatError, read_gguf  # pylint: disable=g-import-not-at-top

  old = tmp_path / "old.gguf"
  old.write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
  with pytest.raises(GgufFormatError, match=r"has version 1. Expected 2 or 3"):
    read_gguf(old)
  truncated = tmp_path / "short.gguf"
  truncated.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 50) + b"k")
  with pytest.raises(GgufFormatError, match=r"is truncated"):
    read_gguf(truncated)
