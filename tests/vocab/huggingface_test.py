"""`Vocabulary.from_huggingface`: tokenizer objects, model directories and their config files.

Oracles: the `tokenizers` package's own decoder for token bytes, and the ids the trained
tokenizer itself assigns to the special tokens named in the config files.
"""

import json
import random

import pytest
import sentencepiece as spm

import constrained_decoding as cd

tokenizers = pytest.importorskip("tokenizers")

_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]
_TEXTS = ["hello café", "中文 😀 world", "x=1\n\ty", '{"a": [1, 2]}']


@pytest.fixture(scope="module")
def byte_bpe():
  """A small byte-level BPE tokenizer with Llama 3's special tokens, trained here."""
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=320, special_tokens=_SPECIALS,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(['hello world café 中文 😀 x=1 {"a": [1, 2]}'] * 50, trainer=trainer)
  return tok


def _ids(tok, *names):
  return tuple(sorted(tok.token_to_id(n) for n in names))


def _write_model_dir(path, tok, **configs):
  path.mkdir(exist_ok=True)
  tok.save(str(path / "tokenizer.json"))
  for name, config in configs.items():
    (path / f"{name}.json").write_text(json.dumps(config), encoding="utf-8")
  return path


def _assert_decodes_like(vocab, tok):
  assert vocab.is_byte_complete
  for text in _TEXTS:
    ids = tok.encode(text).ids
    assert vocab.decode(ids).decode("utf-8") == tok.decode(ids) == text


def test_tokenizers_object(byte_bpe):
  vocab = cd.Vocabulary.from_huggingface(byte_bpe)
  assert vocab.num_tokens == vocab.vocab_size == byte_bpe.get_vocab_size()
  # No config files: guessed from names, which finds only <|eot_id|> (the old behaviour).
  assert vocab.eos_ids == _ids(byte_bpe, "<|eot_id|>")
  _assert_decodes_like(vocab, byte_bpe)
  for name in _SPECIALS:
    assert vocab.token_bytes[byte_bpe.token_to_id(name)] is None
  # from_tokenizer_json takes the same object (it used to raise a raw TypeError).
  assert cd.Vocabulary.from_tokenizer_json(byte_bpe, vocab_size=400) == (
      cd.Vocabulary.from_huggingface(byte_bpe, vocab_size=400))


def test_llama3_instruct_directory(tmp_path, byte_bpe):
  eos = _ids(byte_bpe, "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")
  model_dir = _write_model_dir(
      tmp_path / "llama3-instruct", byte_bpe,
      generation_config={"bos_token_id": byte_bpe.token_to_id("<|begin_of_text|>"),
                         "eos_token_id": list(eos)},
      tokenizer_config={"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"},
      config={"vocab_size": 384, "eos_token_id": byte_bpe.token_to_id("<|eot_id|>")})
  for source in (model_dir, str(model_dir), model_dir / "tokenizer.json"):
    vocab = cd.Vocabulary.from_huggingface(source)
    assert vocab.eos_ids == eos
    assert vocab.vocab_size == 384 and vocab.num_tokens == byte_bpe.get_vocab_size()
    _assert_decodes_like(vocab, byte_bpe)
  # Explicit arguments win over the config files.
  vocab = cd.Vocabulary.from_huggingface(model_dir, vocab_size=500, eos_ids=[0])
  assert vocab.eos_ids == (0,) and vocab.vocab_size == 500


@pytest.mark.parametrize("configs, names", [
    # Llama 3 base: one int in generation_config, <|end_of_text|> in tokenizer_config;
    # name guessing would have picked <|eot_id|> instead.
    (dict(generation_config={"eos_token_id": "<|end_of_text|>"},
          tokenizer_config={"eos_token": "<|end_of_text|>"}), ["<|end_of_text|>"]),
    # Only tokenizer_config, as a serialized AddedToken (DeepSeek's format).
    (dict(tokenizer_config={"eos_token": {"__type": "AddedToken",
                                          "content": "<|eom_id|>", "special": True}}),
     ["<|eom_id|>"]),
    # A multimodal config nests the text model's fields.
    (dict(config={"text_config": {"eos_token_id": "<|end_of_text|>", "vocab_size": 330}}),
     ["<|end_of_text|>"]),
    # No config with an eos: guessed from the special tokens' names.
    (dict(config={"vocab_size": 330}), ["<|eot_id|>"]),
])
def test_eos_ids_from_config_files(tmp_path, byte_bpe, configs, names):
  def ids(value):  # names in the table stand for the trained tokenizer's ids
    return byte_bpe.token_to_id(value) if isinstance(value, str) and value in _SPECIALS else value

  configs = json.loads(json.dumps(configs))
  for config in configs.values():
    for c in (config, config.get("text_config", {})):
      if "eos_token_id" in c:
        c["eos_token_id"] = ids(c["eos_token_id"])
  vocab = cd.Vocabulary.from_huggingface(_write_model_dir(tmp_path / "m", byte_bpe, **configs))
  assert vocab.eos_ids == _ids(byte_bpe, *names)
  expected_size = configs.get("config", {}).get("vocab_size") or configs.get(
      "config", {}).get("text_config", {}).get("vocab_size") or byte_bpe.get_vocab_size()
  assert vocab.vocab_size == expected_size


class _FastTokenizerStandIn:
  """The attributes `from_huggingface` reads of a transformers `PreTrainedTokenizerFast`:
  `backend_tokenizer` (the `tokenizers.Tokenizer`), `eos_token_id`, `name_or_path`."""

  def __init__(self, backend, eos_token, name_or_path=""):
    self.backend_tokenizer = backend
    self.eos_token = eos_token
    self.eos_token_id = backend.token_to_id(eos_token)
    self.name_or_path = name_or_path


def _transformers_fast(tok, eos_token, name_or_path=""):
  """A real transformers fast tokenizer when transformers is installed, else the stand-in."""
  try:
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    return _FastTokenizerStandIn(tok, eos_token, name_or_path)
  out = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos_token)
  out.name_or_path = name_or_path
  return out


def test_transformers_fast_tokenizer(tmp_path, byte_bpe):
  hf = _transformers_fast(byte_bpe, "<|end_of_text|>")
  vocab = cd.Vocabulary.from_huggingface(hf)
  assert vocab.eos_ids == _ids(byte_bpe, "<|end_of_text|>")
  _assert_decodes_like(vocab, byte_bpe)
  # name_or_path pointing at a local directory: its config files are read too.
  model_dir = _write_model_dir(
      tmp_path / "m", byte_bpe, config={"vocab_size": 352},
      generation_config={"eos_token_id": [byte_bpe.token_to_id("<|eot_id|>")]})
  vocab = cd.Vocabulary.from_huggingface(
      _transformers_fast(byte_bpe, "<|end_of_text|>", str(model_dir)))
  assert vocab.eos_ids == _ids(byte_bpe, "<|end_of_text|>", "<|eot_id|>")
  assert vocab.vocab_size == 352


class _AddedToken:
  def __init__(self, content, special):
    self.content, self.special = content, special


class _SlowTokenizerStandIn:
  """A transformers SentencePiece ("slow") tokenizer: `sp_model`, `added_tokens_decoder`."""

  def __init__(self, sp, added):
    self.sp_model = sp
    self.added_tokens_decoder = added
    self.eos_token_id = sp.eos_id()
    self.name_or_path = "not/a/local/dir"


def test_sentencepiece_tokenizer_and_directory(tmp_path):
  rng = random.Random(0)
  words = ["alpha", "beta", "gamma", "naïve", "café", "x=1", "中文"]
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(10))
                              for _ in range(200)), encoding="utf-8")
  spm.SentencePieceTrainer.Train(
      input=str(corpus), model_prefix=str(tmp_path / "tokenizer"), vocab_size=320,
      model_type="bpe", byte_fallback=True, character_coverage=1.0, minloglevel=2,
      num_threads=1, add_dummy_prefix=False)
  sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
  size = sp.GetPieceSize()
  hf = _SlowTokenizerStandIn(sp, {size: _AddedToken("<|im_end|>", True),
                                  size + 1: _AddedToken("<tool>", False)})
  vocab = cd.Vocabulary.from_huggingface(hf)
  assert vocab.num_tokens == size + 2
  assert vocab.token_bytes[size] is None and vocab.token_bytes[size + 1] == b"<tool>"
  assert vocab.eos_ids == (sp.eos_id(),)
  for text in ["alpha café", "中文 ☃ x=1"]:
    ids = sp.EncodeAsIds(text)
    assert vocab.decode(ids).decode("utf-8") == sp.DecodeIds(ids)
  # A directory with only tokenizer.model (no tokenizer.json) and a generation config.
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
  vocab = cd.Vocabulary.from_huggingface(tmp_path)
  assert vocab.eos_ids == (2, 7) and vocab.num_tokens == size


def test_errors(tmp_path, byte_bpe):
  with pytest.raises(cd.VocabularyError, match=r"is not a file or directory"):
    cd.Vocabulary.from_huggingface(tmp_path / "missing")
  with pytest.raises(cd.VocabularyError, match=r"has neither tokenizer.json nor tokenizer.model"):
    cd.Vocabulary.from_huggingface(tmp_path)
  with pytest.raises(cd.VocabularyError, match=r"Cannot read a tokenizer from int 42"):
    cd.Vocabulary.from_huggingface(42)
  with pytest.raises(cd.VocabularyError, match=r"Cannot read a tokenizer.json from int"):
    cd.Vocabulary.from_tokenizer_json(42)
  cases = [
      (dict(generation_config={"eos_token_id": "</s>"}),
       r"generation_config.json's eos_token_id is '</s>'. Expected a token id"),
      (dict(tokenizer_config={"eos_token": "<nope>"}),
       r"eos_token '<nope>' is not a token of the tokenizer"),
      (dict(config={"vocab_size": 10}),
       r"config.json's vocab_size 10 is smaller than the tokenizer's"),
      (dict(config={"vocab_size": "big"}), r"config.json's vocab_size is 'big'"),
      (dict(generation_config={"eos_token_id": 10**6}),
       r"End-of-sequence id 1000000 is outside"),
  ]
  for i, (configs, message) in enumerate(cases):
    model_dir = _write_model_dir(tmp_path / f"m{i}", byte_bpe, **configs)
    with pytest.raises(cd.VocabularyError, match=message):
      cd.Vocabulary.from_huggingface(model_dir)
  bad = _write_model_dir(tmp_path / "bad", byte_bpe)
  (bad / "config.json").write_text("[1, 2")
  with pytest.raises(cd.VocabularyError, match=r"config.json'.*Expected a JSON object"):
    cd.Vocabulary.from_huggingface(bad)
