"""`Vocabulary`: token id -> bytes, the model's logits width, and end-of-sequence ids.

Loaders, one per tokenizer source:
  Vocabulary.from_token_bytes   explicit list of byte strings (None = no text).
  Vocabulary.from_gguf          the `tokenizer.ggml.*` fields of a GGUF model file.
  Vocabulary.from_sentencepiece a SentencePiece model file, serialized proto or processor.
  Vocabulary.from_tokenizer_json a Hugging Face `tokenizer.json` (byte-level BPE, or
                                metaspace pieces with byte fallback), or a
                                `tokenizers.Tokenizer`.
  Vocabulary.from_huggingface   a Hugging Face tokenizer object or model directory, with
                                the logits width and end-of-sequence ids of its config files.
"""

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from constrained_decoding.errors import VocabularyError
from constrained_decoding.vocab import _joined

FORMAT_VERSION = 1

# Piece conventions shared by SentencePiece-style vocabularies.
_METASPACE = "\u2581"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Control tokens that end a turn in common chat formats; they count as end of sequence.
_END_OF_TURN_PIECES = (
    "<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "</s>", "<eos>",
)

# GGUF `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type).
_GGUF_NORMAL, _GGUF_UNKNOWN, _GGUF_CONTROL, _GGUF_USER_DEFINED, _GGUF_UNUSED, _GGUF_BYTE = (
    1, 2, 3, 4, 5, 6)


@dataclasses.dataclass(frozen=True, eq=False)
class Vocabulary:
  """The bytes of every token, and how the model's logits are laid out.

  ```python
  vocab = Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                      eos_ids=[256])
  ```

  Attributes:
    token_bytes: For each token id below the tokenizer's size, the bytes it adds to the
      text, or None for tokens without text (control and special tokens, `<unk>`, unused
      slots). Byte-fallback pieces `<0xNN>` are the single byte 0xNN; SentencePiece's `▁`
      is a space. A token that decodes to b"" is treated like None: it can never be
      produced under a constraint, since it would not advance the text.
    vocab_size: Width of the model's logits; may exceed `len(token_bytes)` (padded
      embedding tables). Ids in `[len(token_bytes), vocab_size)` are never allowed.
    eos_ids: Tokens that end the sequence; allowed exactly where the constraint accepts.
    fingerprint: Hex digest identifying `token_bytes`, `vocab_size` and `eos_ids`; keys
      on-disk caches and guards against mixing tables of different vocabularies.
  """

  token_bytes: tuple[bytes | None, ...]
  vocab_size: int
  eos_ids: tuple[int, ...]
  fingerprint: str = dataclasses.field(init=False)

  def __post_init__(self):
    token_bytes = tuple(None if not b else bytes(b) for b in self.token_bytes)
    object.__setattr__(self, "token_bytes", token_bytes)
    if self.vocab_size < len(token_bytes):
      raise VocabularyError(
          f"vocab_size {self.vocab_size} is smaller than the tokenizer's "
          f"{len(token_bytes)} tokens. Expected the model's logits width, which is at "
          f"least the tokenizer size; pass vocab_size=None to use the tokenizer size."
      )
    eos_ids = tuple(sorted(set(int(i) for i in self.eos_ids)))
    if not eos_ids:
      raise VocabularyError(
          "eos_ids is empty. Expected at least one end-of-sequence token id; pass "
          "eos_ids=[...] explicitly."
      )
    for i in eos_ids:
      if not 0 <= i < self.vocab_size:
        raise VocabularyError(
            f"End-of-sequence id {i} is outside the vocabulary [0, {self.vocab_size}). "
            f"Expected ids of the model's tokens."
        )
    object.__setattr__(self, "eos_ids", eos_ids)
    object.__setattr__(self, "fingerprint", _fingerprint(token_bytes, self.vocab_size, eos_ids))

  def __repr__(self) -> str:
    return (f"Vocabulary(num_tokens={len(self.token_bytes)}, vocab_size={self.vocab_size}, "
            f"eos_ids={self.eos_ids}, fingerprint={self.fingerprint[:12]})")

  def __eq__(self, other) -> bool:
    return isinstance(other, Vocabulary) and other.fingerprint == self.fingerprint

  def __hash__(self) -> int:
    return hash(self.fingerprint)

  @property
  def num_tokens(self) -> int:
    """Number of token ids the tokenizer defines (`len(token_bytes)`)."""
    return len(self.token_bytes)

  @property
  def control_ids(self) -> tuple[int, ...]:
    """Token ids without text (control, special, unknown and unused tokens)."""
    return tuple(i for i, b in enumerate(self.token_bytes) if b is None)

  @property
  def is_byte_complete(self) -> bool:
    """Whether every single byte 0x00..0xFF is a token by itself."""
    singles = {b for b in self.token_bytes if b is not None and len(b) == 1}
    return len(singles) == 256

  def decode(self, token_ids: Iterable[int] | np.ndarray) -> bytes:
    """Concatenates the bytes of `token_ids` (tokens without text add nothing)."""
    out = []
    for t in token_ids:
      t = int(t)
      if 0 <= t < len(self.token_bytes) and self.token_bytes[t] is not None:
        out.append(self.token_bytes[t])
    return b"".join(out)

  # ---------------------------------------------------------------- loaders

  @classmethod
  def from_token_bytes(
      cls,
      token_bytes: Sequence[bytes | None],
      *,
      eos_ids: Iterable[int],
      vocab_size: int | None = None,
  ) -> "Vocabulary":
    """A vocabulary from explicit byte strings (None or b"" for tokens without text)."""
    token_bytes = tuple(token_bytes)
    return cls(token_bytes, len(token_bytes) if vocab_size is None else vocab_size,
               tuple(eos_ids))

  @classmethod
  def from_gguf(
      cls,
      path: str | os.PathLike,
      *,
      vocab_size: int | None = None,
      eos_ids: Iterable[int] | None = None,
  ) -> "Vocabulary":
    """Reads the `tokenizer.ggml.*` fields of a GGUF model file.

    Supports `tokenizer.ggml.model` "llama" (SentencePiece pieces) and "gpt2" (byte-level
    BPE). The logits width defaults to the rows of `token_embd.weight` (or `output.weight`)
    and the end-of-sequence ids to `eos_token_id`, `eot_token_id` and the control tokens
    that end a chat turn (e.g. Gemma's `<end_of_turn>`).
    """
    from constrained_decoding.vocab._gguf_file import read_gguf  # pylint: disable=g-import-not-at-top

    gguf = read_gguf(path)
    meta = gguf.metadata
    model = meta.get("tokenizer.ggml.model")
    pieces = meta.get("tokenizer.ggml.tokens")
    if model is None or pieces is None:
      raise VocabularyError(
          f"GGUF file {os.fspath(path)!r} has no tokenizer (tokenizer.ggml.model/tokens). "
          f"Expected a model file with an embedded tokenizer."
      )
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
      types = np.full(len(pieces), _GGUF_NORMAL, np.int32)
    if model == "llama":
      token_bytes = [_spm_piece_bytes(p.decode("utf-8", "replace"), int(t)) for p, t in
                     zip(pieces, types)]
    elif model == "gpt2":
      decoder = _byte_level_decoder()
      token_bytes = [
          _byte_level_bytes(p.decode("utf-8", "replace"), decoder)
          if t in (_GGUF_NORMAL, _GGUF_BYTE) else
          (p if t == _GGUF_USER_DEFINED else None)
          for p, t in zip(pieces, types)
      ]
    else:
      raise VocabularyError(
          f"GGUF tokenizer model {model!r} is not supported. Expected 'llama' "
          f"(SentencePiece) or 'gpt2' (byte-level BPE)."
      )
    if vocab_size is None:
      vocab_size = len(pieces)
      for name in ("token_embd.weight", "output.weight"):
        if name in gguf.tensors and len(gguf.tensors[name].shape) == 2:
          vocab_size = max(vocab_size, int(gguf.tensors[name].shape[1]))
          break
    if eos_ids is None:
      eos_ids = {int(meta[k]) for k in ("tokenizer.ggml.eos_token_id",
                                        "tokenizer.ggml.eot_token_id") if k in meta}
      eos_ids |= _end_of_turn_ids(
          (i, p.decode("utf-8", "replace")) for i, (p, t) in enumerate(zip(pieces, types))
          if t == _GGUF_CONTROL)
    return cls(tuple(token_bytes), vocab_size, tuple(eos_ids))

  @classmethod
  def from_sentencepiece(
      cls,
      model: Any,
      *,
      vocab_size: int | None = None,
      eos_ids: Iterable[int] | None = None,
  ) -> "Vocabulary":
    """Reads a SentencePiece model: a `.model` path, serialized proto bytes, or a processor.

    Control, unknown and unused pieces have no bytes; `<0xNN>` byte pieces are single
    bytes; `▁` is a space.
    """
    sp = _load_sentencepiece(model)
    token_bytes, guessed = _sentencepiece_token_bytes(sp)
    if eos_ids is None:
      eos_ids = guessed
    return cls(tuple(token_bytes), len(token_bytes) if vocab_size is None else vocab_size,
               tuple(eos_ids))

  @classmethod
  def from_tokenizer_json(
      cls,
      source: Any,
      *,
      vocab_size: int | None = None,
      eos_ids: Iterable[int] | None = None,
  ) -> "Vocabulary":
    """Reads a Hugging Face `tokenizer.json`: a path, JSON text, the parsed dict, or a
    `tokenizers.Tokenizer` object.

    Supported: BPE or Unigram models whose pieces are byte-level (GPT-2 style byte to
    Unicode mapping, detected by a `ByteLevel` decoder or pre-tokenizer) or metaspace
    pieces (`▁` for space, `<0xNN>` byte fallback). Special added tokens have no bytes;
    other added tokens are their literal content. End-of-sequence ids, unless given, are
    guessed from the names of the special tokens (`</s>`, `<|endoftext|>`, ...); use
    `from_huggingface` on a model directory to read them from its config files instead.
    """
    parsed = _parse_tokenizer_json(_load_json(source))
    if eos_ids is None:
      eos_ids = _guess_eos_ids(parsed)
    return cls(parsed.token_bytes, parsed.size if vocab_size is None else vocab_size,
               tuple(eos_ids))

  @classmethod
  def from_huggingface(
      cls,
      tokenizer_or_path: Any,
      *,
      vocab_size: int | None = None,
      eos_ids: Iterable[int] | None = None,
  ) -> "Vocabulary":
    """Reads a Hugging Face tokenizer: a `tokenizers.Tokenizer` (or a wrapper such as
    `ByteLevelBPETokenizer`), a `transformers` tokenizer object, or a local model
    directory (or a `tokenizer.json` inside one).

    ```python
    vocab = Vocabulary.from_huggingface("path/to/Llama-3.1-8B-Instruct")
    vocab = Vocabulary.from_huggingface(AutoTokenizer.from_pretrained(...))
    ```

    A directory needs `tokenizer.json` (or, failing that, a SentencePiece
    `tokenizer.model`); it may hold `tokenizer_config.json`, `generation_config.json`
    and `config.json`, which supply what the tokenizer itself does not know:

    * End-of-sequence ids: the union of `generation_config.json`'s and `config.json`'s
      `eos_token_id` (an int or a list: Llama 3 instruct lists `<|end_of_text|>`,
      `<|eom_id|>` and `<|eot_id|>`) and `tokenizer_config.json`'s `eos_token`. Only
      when none of these is present are they guessed from special-token names.
    * The logits width: `config.json`'s `vocab_size` (or `text_config.vocab_size`),
      which often exceeds the tokenizer's size (padded embeddings).

    A `transformers` tokenizer (duck-typed, so `transformers` is not a dependency) is
    read through its `backend_tokenizer` (fast tokenizers) or `sp_model` (SentencePiece
    ones); its `eos_token_id` is an end-of-sequence id, and when its `name_or_path` is a
    local directory the config files there are read too. `vocab_size` and `eos_ids`,
    when given, override all of this.

    Raises:
      VocabularyError: the argument is none of the above, a directory has no
        tokenizer file, or a config file is malformed.
    """
    config_dir = None
    object_eos: set[int] = set()
    if isinstance(tokenizer_or_path, (str, os.PathLike)):
      path = os.fspath(tokenizer_or_path)
      if os.path.isdir(path):
        config_dir = path
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
          source = os.path.join(path, "tokenizer.json")
        elif os.path.isfile(os.path.join(path, "tokenizer.model")):
          source = _SentencePiece(os.path.join(path, "tokenizer.model"))
        else:
          raise VocabularyError(
              f"Directory {path!r} has neither tokenizer.json nor tokenizer.model. "
              f"Expected a Hugging Face model directory (as saved by save_pretrained)."
          )
      elif os.path.isfile(path):
        config_dir = os.path.dirname(os.path.abspath(path))
        source = path
      else:
        raise VocabularyError(
            f"{path!r} is not a file or directory. Expected a local Hugging Face model "
            f"directory or tokenizer.json; download the model first (this library never "
            f"downloads)."
        )
    elif _is_tokenizers_tokenizer(tokenizer_or_path):
      source = tokenizer_or_path
    elif hasattr(tokenizer_or_path, "backend_tokenizer") or hasattr(
        tokenizer_or_path, "sp_model"):
      tok = tokenizer_or_path
      backend = getattr(tok, "backend_tokenizer", None)
      source = (backend if backend is not None else
                _SentencePiece(tok.sp_model, _added_tokens(tok)))
      if getattr(tok, "eos_token_id", None) is not None:
        object_eos = set(_int_ids(tok.eos_token_id, "the tokenizer's eos_token_id"))
      name = getattr(tok, "name_or_path", None)
      if isinstance(name, (str, os.PathLike)) and name and os.path.isdir(name):
        config_dir = os.fspath(name)
    else:
      raise VocabularyError(
          f"Cannot read a tokenizer from {type(tokenizer_or_path).__name__} "
          f"{repr(tokenizer_or_path)[:80]}. Expected a tokenizers.Tokenizer, a "
          f"transformers tokenizer, or a local model directory path."
      )

    configs = _read_hf_configs(config_dir) if config_dir is not None else {}
    if isinstance(source, _SentencePiece):
      parsed = _parse_sentencepiece(_load_sentencepiece(source.model), source.added)
    else:
      parsed = _parse_tokenizer_json(_load_json(source))
    if eos_ids is None:
      eos_ids = _config_eos_ids(configs, parsed) | object_eos
      if not eos_ids:
        eos_ids = _guess_eos_ids(parsed)
    if vocab_size is None:
      vocab_size = _config_vocab_size(configs)
      if vocab_size is not None and vocab_size < parsed.size:
        raise VocabularyError(
            f"config.json's vocab_size {vocab_size} is smaller than the tokenizer's "
            f"{parsed.size} "
            f"tokens. Expected the model's logits width; pass vocab_size=... explicitly."
        )
    return cls(parsed.token_bytes, parsed.size if vocab_size is None else vocab_size,
               tuple(eos_ids))


# ------------------------------------------------------------------ helpers


@dataclasses.dataclass(frozen=True)
class _ParsedTokenizer:
  """A tokenizer's bytes per id, its special tokens, and content -> id for config lookups."""

  token_bytes: tuple[bytes | None, ...]
  specials: tuple[tuple[int, str], ...]
  token_to_id: dict[str, int]
  # The tokenizer's own end-of-sequence ids, if it has a notion of one (SentencePiece).
  own_eos_ids: tuple[int, ...] = ()

  @property
  def size(self) -> int:
    return len(self.token_bytes)


@dataclasses.dataclass(frozen=True)
class _SentencePiece:
  """A SentencePiece model (path or processor) plus added tokens `(id, content, special)`."""

  model: Any
  added: tuple[tuple[int, str, bool], ...] = ()


def _parse_tokenizer_json(spec: dict) -> _ParsedTokenizer:
  model = spec.get("model") or {}
  model_type = model.get("type")
  if model_type == "BPE":
    pieces = dict(model.get("vocab") or {})
  elif model_type == "Unigram":
    pieces = {p[0]: i for i, p in enumerate(model.get("vocab") or [])}
  else:
    raise VocabularyError(
        f"tokenizer.json model type {model_type!r} is not supported. Expected 'BPE' or "
        f"'Unigram' (WordPiece vocabularies do not map tokens to exact text)."
    )
  added = spec.get("added_tokens") or []
  size = max([*pieces.values(), *(a["id"] for a in added), -1]) + 1
  token_bytes: list[bytes | None] = [None] * size
  if _uses_byte_level(spec):
    decoder = _byte_level_decoder()
    for piece, i in pieces.items():
      token_bytes[i] = _byte_level_bytes(piece, decoder)
  else:
    for piece, i in pieces.items():
      match = _BYTE_PIECE.fullmatch(piece)
      token_bytes[i] = (bytes([int(match.group(1), 16)]) if match and model.get("byte_fallback", True)
                        else piece.replace(_METASPACE, " ").encode("utf-8"))
  specials = []
  for a in added:
    if a.get("special", False):
      token_bytes[a["id"]] = None
      specials.append((a["id"], a["content"]))
    else:
      token_bytes[a["id"]] = a["content"].encode("utf-8")
  unk = model.get("unk_token")
  if unk is not None and unk in pieces:
    token_bytes[pieces[unk]] = None
  token_to_id = {**pieces, **{a["content"]: a["id"] for a in added}}
  return _ParsedTokenizer(tuple(token_bytes), tuple(specials), token_to_id)


def _load_sentencepiece(model: Any):
  """A `SentencePieceProcessor` from a processor, a `.model` path or serialized proto."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  if isinstance(model, spm.SentencePieceProcessor):
    return model
  sp = spm.SentencePieceProcessor()
  try:
    if isinstance(model, (bytes, bytearray)):
      sp.LoadFromSerializedProto(bytes(model))
    else:
      sp.Load(os.fspath(model))
  except (OSError, RuntimeError, TypeError) as e:
    raise VocabularyError(
        f"Could not load SentencePiece model {str(model)[:100]!r}: {e}. Expected a "
        f".model file or serialized ModelProto bytes."
    ) from e
  return sp


def _sentencepiece_token_bytes(sp) -> tuple[list[bytes | None], set[int]]:
  """Bytes of every piece (control/unknown/unused: None) and the guessed eos ids."""
  token_bytes = []
  for i in range(sp.GetPieceSize()):
    piece = sp.IdToPiece(i)
    if sp.IsControl(i) or sp.IsUnknown(i) or sp.IsUnused(i):
      token_bytes.append(None)
    elif sp.IsByte(i):
      token_bytes.append(_spm_piece_bytes(piece, _GGUF_BYTE))
    else:
      token_bytes.append(piece.replace(_METASPACE, " ").encode("utf-8"))
  eos_ids = {sp.eos_id()} if sp.eos_id() >= 0 else set()
  eos_ids |= _end_of_turn_ids((i, sp.IdToPiece(i)) for i in range(sp.GetPieceSize())
                              if token_bytes[i] is None)
  return token_bytes, eos_ids


def _parse_sentencepiece(sp, added: Iterable[tuple[int, str, bool]]) -> _ParsedTokenizer:
  """A SentencePiece model plus a transformers tokenizer's added tokens."""
  token_bytes, guessed = _sentencepiece_token_bytes(sp)
  token_to_id = {sp.IdToPiece(i): i for i in range(sp.GetPieceSize())}
  specials = []
  for i, content, special in added:
    if i >= len(token_bytes):
      token_bytes += [None] * (i + 1 - len(token_bytes))
    token_bytes[i] = None if special else content.encode("utf-8")
    token_to_id[content] = i
    if special:
      specials.append((i, content))
  return _ParsedTokenizer(tuple(token_bytes), tuple(specials), token_to_id,
                          tuple(sorted(guessed)))


def _added_tokens(tok: Any) -> tuple[tuple[int, str, bool], ...]:
  """`(id, content, special)` of a transformers tokenizer's `added_tokens_decoder`."""
  decoder = getattr(tok, "added_tokens_decoder", None) or {}
  return tuple((int(i), str(getattr(a, "content", a)), bool(getattr(a, "special", False)))
               for i, a in sorted(decoder.items()))


def _guess_eos_ids(parsed: _ParsedTokenizer) -> set[int]:
  """The tokenizer's own eos ids and special tokens named like one (`_END_OF_TURN_PIECES`)."""
  eos_ids = set(parsed.own_eos_ids) | _end_of_turn_ids(parsed.specials)
  if not eos_ids:
    raise VocabularyError(
        "The tokenizer names no end-of-sequence token among its special tokens. "
        "Expected one of " + ", ".join(_END_OF_TURN_PIECES) + ", or the model's config "
        "files (Vocabulary.from_huggingface on its directory); pass eos_ids=[...]."
    )
  return eos_ids


def _is_tokenizers_tokenizer(obj: Any) -> bool:
  """Whether `obj` is a `tokenizers.Tokenizer`, or one of the package's wrappers around
  one (`ByteLevelBPETokenizer` and the other `tokenizers.implementations`, which have
  `to_str` too); checked without importing the package."""
  return any(c.__name__ in ("Tokenizer", "BaseTokenizer")
             and c.__module__.startswith("tokenizers") for c in type(obj).__mro__)


_HF_CONFIG_FILES = ("generation_config.json", "config.json", "tokenizer_config.json")


def _read_hf_configs(directory: str) -> dict[str, dict]:
  """The JSON config files present in a Hugging Face model directory, by file name."""
  configs = {}
  for name in _HF_CONFIG_FILES:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
      continue
    try:
      with open(path, encoding="utf-8") as f:
        config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      raise VocabularyError(f"Could not read {path!r}: {e}. Expected a JSON object.") from e
    if not isinstance(config, dict):
      raise VocabularyError(
          f"{path!r} holds a {type(config).__name__}. Expected a JSON object.")
    configs[name] = config
  return configs


def _int_ids(value: Any, where: str) -> list[int]:
  """An `eos_token_id` value (an int, a list of ints, or null) as a list of ids."""
  if value is None:
    return []
  values = value if isinstance(value, (list, tuple)) else [value]
  if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
    raise VocabularyError(
        f"{where} is {value!r}. Expected a token id or a list of token ids.")
  return [int(v) for v in values]


def _config_eos_ids(configs: dict[str, dict], parsed: _ParsedTokenizer) -> set[int]:
  """End-of-sequence ids named by a model directory's config files (empty if none)."""
  eos_ids = set()
  for name in ("generation_config.json", "config.json"):
    config = configs.get(name, {})
    eos_ids |= set(_int_ids(config.get("eos_token_id"), f"{name}'s eos_token_id"))
    text_config = config.get("text_config")
    if isinstance(text_config, dict):
      eos_ids |= set(_int_ids(text_config.get("eos_token_id"),
                              f"{name}'s text_config.eos_token_id"))
  token = configs.get("tokenizer_config.json", {}).get("eos_token")
  if isinstance(token, dict):  # a serialized AddedToken
    token = token.get("content")
  if token is not None:
    if not isinstance(token, str) or token not in parsed.token_to_id:
      raise VocabularyError(
          f"tokenizer_config.json's eos_token {token!r} is not a token of the tokenizer. "
          f"Expected the content of one of its tokens; pass eos_ids=[...] explicitly."
      )
    eos_ids.add(parsed.token_to_id[token])
  return eos_ids


def _config_vocab_size(configs: dict[str, dict]) -> int | None:
  """The model's logits width from `config.json` (`vocab_size` or `text_config`'s)."""
  config = configs.get("config.json", {})
  size = config.get("vocab_size")
  if size is None and isinstance(config.get("text_config"), dict):
    size = config["text_config"].get("vocab_size")
  if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
    raise VocabularyError(
        f"config.json's vocab_size is {size!r}. Expected a positive integer.")
  return size



def _fingerprint(token_bytes: tuple[bytes | None, ...], vocab_size: int,
                 eos_ids: tuple[int, ...]) -> str:
  h = hashlib.sha256()
  h.update(f"v{FORMAT_VERSION}|{vocab_size}|{eos_ids}|{len(token_bytes)}|".encode())
  # Joined once for the fingerprint and the compiler's passes (`_joined`); a Vocabulary
  # holds no b"" (made None), so an empty token is a None one: length -1.
  data, starts, ends = _joined.joined(token_bytes)
  h.update(np.where(ends > starts, ends - starts, -1).tobytes())
  h.update(data)
  return h.hexdigest()


def _spm_piece_bytes(piece: str, token_type: int) -> bytes | None:
  """Bytes of one SentencePiece piece given its GGUF/llama.cpp token type."""
  if token_type in (_GGUF_CONTROL, _GGUF_UNKNOWN, _GGUF_UNUSED):
    return None
  if token_type == _GGUF_BYTE:
    match = _BYTE_PIECE.fullmatch(piece)
    if not match:
      raise VocabularyError(
          f"Byte token {piece!r} is not of the form <0xNN>. Expected byte-fallback pieces "
          f"such as '<0x0A>'."
      )
    return bytes([int(match.group(1), 16)])
  return piece.replace(_METASPACE, " ").encode("utf-8")


def _end_of_turn_ids(id_pieces: Iterable[tuple[int, str]]) -> set[int]:
  return {i for i, p in id_pieces if p in _END_OF_TURN_PIECES}


def _byte_level_decoder() -> dict[str, int]:
  """Inverse of GPT-2's byte -> printable character table used by byte-level BPE."""
  printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
  mapping = {b: b for b in printable}
  extra = 0
  for b in range(256):
    if b not in mapping:
      mapping[b] = 256 + extra
      extra += 1
  return {chr(c): b for b, c in mapping.items()}


def _byte_level_bytes(piece: str, decoder: dict[str, int]) -> bytes:
  try:
    return bytes(decoder[c] for c in piece)
  except KeyError as e:
    raise VocabularyError(
        f"Byte-level piece {piece!r} contains {e.args[0]!r}, which is not in the byte-level "
        f"alphabet. Expected a GPT-2 style byte-level BPE vocabulary."
    ) from None


def _uses_byte_level(spec: dict) -> bool:
  def types(node):
    if not node:
      return []
    found = [node.get("type")]
    for key in ("decoders", "pretokenizers"):
      for child in node.get(key) or []:
        found += types(child)
    return found

  return "ByteLevel" in types(spec.get("decoder")) + types(spec.get("pre_tokenizer"))


def _load_json(source: Any) -> dict:
  if isinstance(source, dict):
    return source
  if _is_tokenizers_tokenizer(source) or (
      hasattr(source, "to_str") and not isinstance(source, (str, os.PathLike))):
    return _load_json(source.to_str())
  if not isinstance(source, (str, os.PathLike)):
    raise VocabularyError(
        f"Cannot read a tokenizer.json from {type(source).__name__}. Expected a path, JSON "
        f"text, a parsed dict or a tokenizers.Tokenizer (Vocabulary.from_huggingface also "
        f"takes transformers tokenizers)."
    )
  text = os.fspath(source)
  if not text.lstrip().startswith("{"):
    try:
      with open(text, encoding="utf-8") as f:
        text = f.read()
    except OSError as e:
      raise VocabularyError(f"Could not read tokenizer.json {text!r}: {e}.") from e
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise VocabularyError(
        f"tokenizer.json is not valid JSON: {e}. Expected a Hugging Face tokenizer file."
    ) from e
