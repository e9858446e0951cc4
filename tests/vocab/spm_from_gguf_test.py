"""The SentencePiece tokenizer rebuilt from the Gemma 3 GGUF.

Expected ids are llama.cpp's own tokenization of the same file (shared/notes/gemma3-gguf.md,
section 1), so these tests pin the rebuilt tokenizer to the reference implementation.
"""

import random

import pytest

from constrained_decoding import errors
from constrained_decoding.models import default_gguf_path
from constrained_decoding.vocab import _gguf_file
from constrained_decoding.vocab import _spm_from_gguf


@pytest.fixture(scope="module")
def gguf_file():
  return _gguf_file.read_gguf(default_gguf_path())


@pytest.fixture(scope="module")
def sp(gguf_file):
  return _spm_from_gguf.sentencepiece_from_gguf(gguf_file)


_CASES = [
    ("The capital of France is", [818, 5279, 529, 7001, 563]),
    ("Hello world!", [9259, 1902, 236888]),
    ("  leading", [138, 26016]),  # A run of two spaces is one user-defined piece.
    ("café é naïve", [123125, 236859, 1559, 120362]),
    ("中文测试，你好世界", [55041, 30203, 236900, 144626, 12811]),
    ("emoji 😀🎉👍🏽 ok", [67906, 163543, 242061, 240493, 242713, 7546]),
    ("line1\nline2\n\n\tTabbed", [1257, 236770, 107, 1257, 236778, 108, 255968, 7874, 4250]),
    ("<start_of_turn>user\nWhat is 2+3?<end_of_turn>\n<start_of_turn>model\n",
     [105, 2364, 107, 3689, 563, 236743, 236778, 236862, 236800, 236881, 106, 107, 105,
      4368, 107]),
    ("\U0001FAE8", [478, 397, 409, 406]),  # Byte fallback: <0xF0><0x9F><0xAB><0xA8>.
]


@pytest.mark.parametrize("text, ids", _CASES)
def test_ids_match_llama_cpp(sp, text, ids):
  assert sp.EncodeAsIds(text) == ids
  assert sp.DecodeIds(ids) == text


def test_digits_are_split(sp):
  ids = sp.EncodeAsIds("12345 3.14159")
  assert ids[:3] == [236770, 236778, 236800]  # "1", "2", "3"
  assert 236743 in ids  # "▁", the space before "3.14159"
  assert len(ids) == 13  # One token per character.


def test_json_round_trips(sp):
  text = '{"a": 1, "b": [true, null, "x\\"y"], "c": {"d": -2.5e3}}'
  ids = sp.EncodeAsIds(text)
  assert len(ids) == 32
  assert sp.DecodeIds(ids) == text


def test_a_lone_byte_token_decodes_to_a_replacement_character(sp):
  # Streaming detokenization must buffer until a UTF-8 sequence is complete.
  assert sp.DecodeIds([478]) == "\ufffd"


def test_random_unicode_round_trips(sp):
  rng = random.Random(0)
  alphabet = ("abcdefghijklmnopqrstuvwxyz ABC   \n\n\t\t0123456789.,;:!?\"'{}[]()<>/\\-_"
              "éèàüßçñ中文字日本語한국어😀🎉👍🏽\U0001FAE8\u200b\u00a0")
  specials = ["<start_of_turn>", "<end_of_turn>", "<b>", "  ", "\n\n\n"]
  for _ in range(300):
    parts = [rng.choice(specials) if rng.random() < 0.1 else rng.choice(alphabet)
             for _ in range(rng.randint(0, 40))]
    text = "".join(parts)
    assert sp.DecodeIds(sp.EncodeAsIds(text)) == text, repr(text)


def test_special_token_kinds(sp, gguf_file):
  assert sp.GetPieceSize() == len(gguf_file.metadata["tokenizer.ggml.tokens"])
  assert (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()) == (0, 1, 2, 3)
  assert all(sp.IsControl(i) for i in (0, 1, 2))
  assert sp.IsUnknown(3)
  # Control in GGUF, user-defined here, so that they are matched in text.
  assert sp.EncodeAsIds("<start_of_turn>") == [105]
  assert sp.EncodeAsIds("<end_of_turn>") == [106]
  assert sp.IdToPiece(138) == "▁▁"
  assert sp.EncodeAsIds("<bos>") != [2]  # Control tokens are never produced from text.


def test_accepts_a_path(gguf_file):
  sp = _spm_from_gguf.sentencepiece_from_gguf(gguf_file.path)
  assert sp.EncodeAsIds("Hello world!") == [9259, 1902, 236888]


def _fake_gguf(metadata):
  return _gguf_file.GgufFile(path="fake.gguf", version=3, metadata=metadata, tensors={})


def test_non_sentencepiece_tokenizer_is_rejected():
  with pytest.raises(errors.VocabularyError,
                     match=r"tokenizer.ggml.model='gpt2'. Expected 'llama'"):
    _spm_from_gguf.sentencepiece_from_gguf(_fake_gguf({"tokenizer.ggml.model": "gpt2"}))


def test_missing_tokenizer_arrays_are_reported():
  with pytest.raises(errors.VocabularyError, match=r"lacks 'tokenizer.ggml.tokens'"):
    _spm_from_gguf.sentencepiece_from_gguf(_fake_gguf({"tokenizer.ggml.model": "llama"}))
