"""A SentencePiece tokenizer rebuilt from the vocabulary stored in a GGUF file.

GGUF files of SentencePiece models (`tokenizer.ggml.model == "llama"`) keep the pieces,
scores and token types but not the `.model` file. This module rebuilds the ModelProto so
that `sentencepiece` tokenizes exactly as llama.cpp does (checked on Gemma 3: identical
ids on 4,000 fuzz strings; see shared/notes/gemma3-gguf.md, section 1).

Public functions:
  sentencepiece_from_gguf(gguf) -> SentencePieceProcessor
"""

import os

import numpy as np
import sentencepiece
from sentencepiece import sentencepiece_model_pb2

from constrained_decoding import errors
from constrained_decoding.vocab import _gguf_file

# Token types; GGUF (llama.cpp's `llama_token_type`) uses SentencePiece's numbering.
_NORMAL = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL
_UNKNOWN = sentencepiece_model_pb2.ModelProto.SentencePiece.UNKNOWN
_CONTROL = sentencepiece_model_pb2.ModelProto.SentencePiece.CONTROL
_USER_DEFINED = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
_BYTE = sentencepiece_model_pb2.ModelProto.SentencePiece.BYTE

_SPACE = "\u2581"  # "▁", SentencePiece's escaped space.


def sentencepiece_from_gguf(
    gguf: "_gguf_file.GgufFile | str | os.PathLike",
) -> sentencepiece.SentencePieceProcessor:
  """Builds a SentencePiece processor from the tokenizer stored in a GGUF file.

  ```python
  sp = sentencepiece_from_gguf(default_gguf_path())
  [2] + sp.EncodeAsIds("The capital of France is")  # BOS is not added for you.
  ```

  The proto is BPE with byte fallback and split digits, no normalization and no dummy
  prefix unless the file asks for one. Three fixes make it match llama.cpp:
  * the unknown token becomes UNKNOWN (GGUF marks it CONTROL);
  * CONTROL tokens other than pad/bos/eos (`<start_of_turn>`, `<unusedN>`, ...) become
    USER_DEFINED, so that they are matched in text instead of split into ~30 pieces;
  * spaces in USER_DEFINED pieces become "▁" (llama.cpp's converter stores runs of
    spaces with real spaces, which SentencePiece would never match).
  NORMAL pieces keep their GGUF score (the BPE merge rank); all others get 0.

  Args:
    gguf: A parsed `GgufFile`, or the path of a `.gguf` file.

  Returns:
    A loaded `sentencepiece.SentencePieceProcessor`.

  Raises:
    VocabularyError: If the file holds no SentencePiece ("llama") tokenizer, or its
      tokenizer arrays are missing or inconsistent.
  """
  if not isinstance(gguf, _gguf_file.GgufFile):
    gguf = _gguf_file.read_gguf(gguf)
  proto = _model_proto(gguf)
  processor = sentencepiece.SentencePieceProcessor()
  try:
    processor.LoadFromSerializedProto(proto.SerializeToString())
  except RuntimeError as e:
    raise errors.VocabularyError(
        f"SentencePiece rejected the tokenizer rebuilt from {gguf.path!r}: {e}. Expected "
        "a vocabulary with unique pieces; the GGUF tokenizer may be corrupt."
    ) from e
  return processor


def _model_proto(gguf: _gguf_file.GgufFile) -> sentencepiece_model_pb2.ModelProto:
  """The SentencePiece ModelProto equivalent to the GGUF tokenizer metadata."""
  metadata = gguf.metadata
  model = metadata.get("tokenizer.ggml.model")
  if model != "llama":
    raise errors.VocabularyError(
        f"GGUF file {gguf.path!r} has tokenizer.ggml.model={model!r}. Expected 'llama' "
        "(a SentencePiece tokenizer); other tokenizer kinds (e.g. 'gpt2' BPE) cannot "
        "be rebuilt as SentencePiece. Load that vocabulary another way."
    )
  pieces, scores, types = _tokenizer_arrays(gguf)
  special = {name: _special_id(gguf, name, len(pieces))
             for name in ("unknown", "bos", "eos", "padding")}  # padding may be -1

  proto = sentencepiece_model_pb2.ModelProto()
  trainer = proto.trainer_spec
  trainer.model_type = sentencepiece_model_pb2.TrainerSpec.BPE
  trainer.vocab_size = len(pieces)
  trainer.byte_fallback = bool(np.any(types == _BYTE))
  trainer.split_digits = True
  trainer.allow_whitespace_only_pieces = True
  trainer.unk_id = special["unknown"]
  trainer.bos_id = special["bos"]
  trainer.eos_id = special["eos"]
  trainer.pad_id = special["padding"]
  # SentencePiece finds special ids by piece (`bos_id()` looks up `bos_piece`), and the
  # defaults ("<s>", "</s>") are not Gemma's.
  trainer.unk_piece = _piece_text(pieces[special["unknown"]])
  trainer.bos_piece = _piece_text(pieces[special["bos"]])
  trainer.eos_piece = _piece_text(pieces[special["eos"]])
  if special["padding"] >= 0:
    trainer.pad_piece = _piece_text(pieces[special["padding"]])

  normalizer = proto.normalizer_spec
  normalizer.name = "identity"
  normalizer.add_dummy_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
  normalizer.remove_extra_whitespaces = False
  normalizer.escape_whitespaces = True
  normalizer.precompiled_charsmap = b""

  kept_control = {special["bos"], special["eos"], special["padding"]}
  for token_id, (raw, score, token_type) in enumerate(zip(pieces, scores, types)):
    piece = proto.pieces.add()
    text = _piece_text(raw)
    token_type = int(token_type)
    if token_id == special["unknown"]:
      token_type = _UNKNOWN
    elif token_type == _CONTROL and token_id not in kept_control:
      token_type = _USER_DEFINED
    if token_type == _USER_DEFINED:
      text = text.replace(" ", _SPACE)
    piece.piece = text
    piece.type = token_type
    piece.score = float(score) if token_type == _NORMAL else 0.0
  return proto


def _piece_text(raw: bytes) -> str:
  # Proto strings must be UTF-8; SentencePiece pieces always are.
  return raw.decode("utf-8", errors="replace")


def _tokenizer_arrays(gguf: _gguf_file.GgufFile
                      ) -> tuple[list[bytes], np.ndarray, np.ndarray]:
  """The pieces, scores and token types, checked to have one entry per token."""
  arrays = []
  for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
    if key not in gguf.metadata:
      raise errors.VocabularyError(
          f"GGUF file {gguf.path!r} lacks {key!r}. Expected the tokens, scores and "
          "token types of a SentencePiece vocabulary."
      )
    arrays.append(gguf.metadata[key])
  pieces, scores, types = arrays
  if not len(pieces) == len(scores) == len(types):
    raise errors.VocabularyError(
        f"GGUF file {gguf.path!r} has {len(pieces)} tokens, {len(scores)} scores and "
        f"{len(types)} token types. Expected one of each per token."
    )
  return list(pieces), np.asarray(scores), np.asarray(types)


def _special_id(gguf: _gguf_file.GgufFile, name: str, vocab_size: int) -> int:
  """The id of a special token (`tokenizer.ggml.<name>_token_id`), checked in range.

  A missing padding id gives -1 (SentencePiece's "none"); the others are required.
  """
  key = f"tokenizer.ggml.{name}_token_id"
  if key not in gguf.metadata and name == "padding":
    return -1
  if key not in gguf.metadata:
    raise errors.VocabularyError(
        f"GGUF file {gguf.path!r} lacks {key!r}. Expected the ids of the unknown, bos, "
        "eos and padding tokens."
    )
  token_id = int(gguf.metadata[key])
  if not 0 <= token_id < vocab_size:
    raise errors.VocabularyError(
        f"GGUF file {gguf.path!r} has {key}={token_id}. Expected an id in "
        f"[0, {vocab_size})."
    )
  return token_id
