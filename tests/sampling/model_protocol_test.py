"""A user's own Flax NNX model, written against `cd.models.LanguageModel`, in every loop.

The model here is not Gemma: a one-layer NNX network over the byte vocabulary whose
"attention" averages the embeddings of every visible earlier position. It keeps the
protocol's cache contract (slot p holds position p, a query at p sees slots <= p,
negative positions are padding) with its own cache pytree, so these tests fail if a
decode loop still assumes Gemma's `KVCache`, config or forward anywhere.
"""

import dataclasses
import json
import re
from typing import Any

import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
from flax import nnx

import constrained_decoding as cd
from constrained_decoding import models
from constrained_decoding.errors import VocabularyMismatchError

_DIM = 16
_REGEX = r"(yes|no)-[0-9]{2}"
_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                            "n": {"type": "integer", "minimum": 0,
                                                  "maximum": 99}},
           "required": ["ok", "n"], "additionalProperties": False}
_PROMPTS = ["Answer: ", "Q? ", "Some longer prompt, to pad the others: "]
_RANDOM = cd.SamplingConfig(temperature=1.0)
# One token budget (and so one buffer and cache size) for every call: fewer compiles.
_TOKENS = 32


class _TinyLM(nnx.Module):
  """Embedding, mean over visible cached positions, tanh, output projection."""

  def __init__(self, width: int, *, rngs: nnx.Rngs):
    self.embed = nnx.Embed(width, _DIM, rngs=rngs)
    self.out = nnx.Linear(_DIM, width, rngs=rngs)

  def __call__(self, tokens, positions, cache, logit_indices):
    values, written = cache
    batch, slots = written.shape
    x = self.embed(jnp.maximum(tokens, 0))  # [B, L, D]
    rows = jnp.arange(batch)[:, None]
    where = jnp.where(positions >= 0, positions, slots)  # padding: dropped
    values = values.at[rows, where].set(x, mode="drop")
    written = written.at[rows, where].set(True, mode="drop")
    visible = written[:, None, :] & (jnp.arange(slots)[None, None, :] <= positions[:, :, None])
    count = jnp.maximum(visible.sum(-1, keepdims=True), 1)
    context = jnp.einsum("blc,bcd->bld", visible.astype(x.dtype), values) / count
    h = jnp.tanh(x + context)
    if logit_indices is not None:
      h = jnp.take_along_axis(h, logit_indices[..., None], axis=1)
    return 3.0 * self.out(h), (values, written)


@dataclasses.dataclass(frozen=True)
class _NnxNetwork:
  """A `models.Network` for any NNX module of `_TinyLM`'s call signature.

  Static under jit: the module's `GraphDef` (compared by structure, so two models of
  the same architecture share compiled programs); the weights are the `params` State.
  """

  graphdef: Any
  logits_width: int

  def init_cache(self, *, batch_size: int, cache_len: int):
    return (jnp.zeros((batch_size, cache_len, _DIM), jnp.float32),
            jnp.zeros((batch_size, cache_len), bool))

  def apply(self, params, tokens, positions, cache, *, logit_indices=None):
    return nnx.merge(self.graphdef, params)(tokens, positions, cache, logit_indices)


@dataclasses.dataclass(frozen=True, eq=False)
class _ByteModel:
  """A `models.LanguageModel`: prompts are their UTF-8 bytes (the byte vocabulary)."""

  network: Any
  params: Any
  vocab: cd.Vocabulary

  def encode(self, text: str) -> list[int]:
    return list(text.encode())


def _byte_model(vocab: cd.Vocabulary, *, width: int | None = None, seed: int = 0,
                pad_bias: float = 0.0) -> _ByteModel:
  """The tiny NNX model over `vocab`, with `width` logits (default: the vocabulary's);
  columns past the vocabulary get `pad_bias` added (a padded head that prefers them)."""
  width = vocab.vocab_size if width is None else width
  module = _TinyLM(width, rngs=nnx.Rngs(seed))
  if pad_bias:
    module.out.bias[...] = module.out.bias[...].at[vocab.vocab_size:].add(pad_bias)
  graphdef, params = nnx.split(module)
  return _ByteModel(network=_NnxNetwork(graphdef, width), params=params, vocab=vocab)


@pytest.fixture(scope="module")
def model(byte_vocab):
  return _byte_model(byte_vocab)


def _is_json_instance(text: str) -> bool:
  try:
    jsonschema.validate(json.loads(text), _SCHEMA)
  except (ValueError, jsonschema.ValidationError):
    return False
  return True


def test_the_model_implements_the_protocol(model):
  assert isinstance(model, models.LanguageModel)
  assert isinstance(model.network, models.Network)
  assert models.check_model(model) is model
  # The bundled model does too, and its network is static by value (its config).
  config = models.Gemma3Config.tiny(vocab_size=model.vocab.vocab_size)
  gemma = models.Gemma3.random(config, tokenizer=None, vocab=model.vocab, bos_id=0)
  assert models.check_model(gemma) is gemma
  assert gemma.network == models.Gemma3Network(config)
  assert hash(gemma.network) == hash(models.Gemma3Network(config))


@pytest.mark.parametrize("sampling", [_RANDOM, cd.SamplingConfig(temperature=1.0, jump_forward=4)])
def test_generate_follows_a_regex(model, sampling):
  outs = cd.generate(model, _PROMPTS, constraint=cd.Regex(_REGEX), max_new_tokens=_TOKENS,
                     sampling=sampling, seed=1)
  assert len(outs) == len(_PROMPTS)
  for out in outs:
    assert out.finished and not out.error
    assert re.fullmatch(_REGEX, out.text), out.text
    assert out.value == out.text


def test_generate_follows_a_json_schema(model):
  outs = cd.generate(model, _PROMPTS, constraint=cd.JsonSchema(_SCHEMA),
                     max_new_tokens=_TOKENS, sampling=_RANDOM, seed=2)
  finished = [o for o in outs if o.finished]
  assert len(finished) >= 2  # a random model may ramble in whitespace
  for out in finished:
    assert not out.error
    assert _is_json_instance(out.text), out.text
    assert out.value == json.loads(out.text)
  for out in outs:  # cut-off rows are prefixes of the language: never invalid JSON tokens
    assert not out.error


def test_the_oracles_reject_unconstrained_output(model):
  """The checks above can fail: the same model without a constraint breaks them."""
  outs = cd.generate(model, _PROMPTS, max_new_tokens=_TOKENS, sampling=_RANDOM, seed=1)
  assert not any(re.fullmatch(_REGEX, o.text) for o in outs)
  assert not any(_is_json_instance(o.text) for o in outs)


def test_stream_ends_each_row_with_generate_s_completion(model):
  spec = cd.Regex(_REGEX)
  expected = cd.generate(model, _PROMPTS, constraint=spec, max_new_tokens=_TOKENS,
                         sampling=_RANDOM)
  streamed = {}
  data = {i: b"" for i in range(len(_PROMPTS))}
  for row, item in cd.generate_stream(model, _PROMPTS, constraint=spec, max_new_tokens=_TOKENS,
                                      sampling=_RANDOM, chunk_size=3):
    if isinstance(item, cd.Completion):
      streamed[row] = item
    else:
      data[row] += item
  assert [streamed[i] for i in range(len(_PROMPTS))] == expected
  assert [data[i].decode() for i in range(len(_PROMPTS))] == [c.text for c in expected]


def test_evaluate_scores_the_model(model):
  specs = [cd.Regex(_REGEX), cd.JsonSchema(_SCHEMA), cd.Regex(_REGEX)]
  result = cd.evaluate(model, _PROMPTS, specs, max_new_tokens=_TOKENS, sampling=_RANDOM,
                       answers=[None, None, "no-00"])
  rows = result.rows
  assert re.fullmatch(_REGEX, rows[0].completion.text) and rows[0].conforms
  assert rows[1].completion.finished <= _is_json_instance(rows[1].completion.text)
  assert rows[1].conforms == rows[1].completion.finished
  assert re.fullmatch(_REGEX, rows[2].completion.text) and rows[2].conforms
  assert rows[2].correct == (rows[2].completion.text == "no-00")


def test_speculative_greedy_equals_generate(model):
  spec = cd.Regex(_REGEX)
  expected = cd.generate(model, _PROMPTS, constraint=spec, max_new_tokens=_TOKENS)
  for draft in (cd.NGramDrafter(), model):
    outs, stats = cd.generate_speculative(model, _PROMPTS, draft=draft, num_draft_tokens=3,
                                          constraint=spec, max_new_tokens=_TOKENS)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    if draft is model:  # a draft identical to the target: every draft token accepted
      assert stats.accepted == stats.drafted


def test_aligned_sampling_follows_the_constraint(model):
  samples, _ = cd.generate_aligned(model, "Q: ", constraint=cd.Regex("(yes|no)[0-9]"),
                                   num_samples=6, batch_size=3, sampling=_RANDOM,
                                   max_new_tokens=4)
  assert all(re.fullmatch("(yes|no)[0-9]", s.text) for s in samples)


def test_wider_logits_never_pick_padded_columns(byte_vocab):
  """Logits wider than the vocabulary (a padded head that even prefers the padding):
  every generated id is a token of the vocabulary, constrained or not."""
  wide = _byte_model(byte_vocab, width=byte_vocab.vocab_size + 63, pad_bias=20.0)
  for constraint in (None, cd.Regex(_REGEX)):
    outs = cd.generate(wide, _PROMPTS, constraint=constraint, max_new_tokens=_TOKENS,
                       sampling=_RANDOM, seed=3)
    ids = np.concatenate([np.asarray(o.token_ids, np.int64) for o in outs] + [[0]])
    assert ids.max() < byte_vocab.vocab_size
    if constraint is not None:
      assert all(re.fullmatch(_REGEX, o.text) for o in outs)
  # The unmasked network does prefer the padding (so the check above can fail).
  logits, _ = wide.network.apply(wide.params, jnp.asarray([[65]]), jnp.asarray([[0]]),
                                 wide.network.init_cache(batch_size=1, cache_len=4))
  assert int(jnp.argmax(logits[0, 0])) >= byte_vocab.vocab_size


def test_narrower_logits_are_a_vocabulary_mismatch(byte_vocab):
  narrow = _byte_model(byte_vocab, width=200)
  for run in (lambda: cd.generate(narrow, "a", constraint=cd.Regex("a")),
              lambda: cd.evaluate(narrow, ["a"], cd.Regex("a")),
              lambda: cd.generate_speculative(narrow, "a", constraint=cd.Regex("a")),
              lambda: cd.generate_aligned(narrow, "a", constraint=cd.Regex("a"),
                                          num_samples=1, sampling=_RANDOM)):
    with pytest.raises(VocabularyMismatchError,
                       match=r"compiled for a vocabulary of 257 tokens but the model has 200 "
                             r"logits\. Expected tables compiled for this model's vocabulary"):
      run()


@dataclasses.dataclass(frozen=True)
class _NoCache:
  logits_width: int

  def apply(self, params, tokens, positions, cache, *, logit_indices=None):
    raise AssertionError("never traced: the protocol check comes first")


class _Unhashable:
  """A network that defines `__eq__` but not `__hash__` (so `__hash__` is None)."""

  def __init__(self, network):
    self.network, self.logits_width = network, network.logits_width

  def __eq__(self, other):
    return isinstance(other, _Unhashable) and other.network == self.network

  def init_cache(self, *, batch_size, cache_len):
    return self.network.init_cache(batch_size=batch_size, cache_len=cache_len)

  def apply(self, params, tokens, positions, cache, *, logit_indices=None):
    return self.network.apply(params, tokens, positions, cache, logit_indices=logit_indices)


def _replace(model, **changes):
  fields = dict(network=model.network, params=model.params, vocab=model.vocab)
  return _ByteModel(**{**fields, **changes})


class _NoEncode:

  def __init__(self, model):
    self.network, self.params, self.vocab = model.network, model.params, model.vocab


@pytest.mark.parametrize("broken, message", [
    (lambda m: _NoEncode(m), r"model \(a _NoEncode\) has no method 'encode'\. Expected a "
                             r"cd\.models\.LanguageModel"),
    (lambda m: _replace(m, network=_NoCache(m.network.logits_width)),
     r"model\.network \(a _NoCache\) has no method 'init_cache'\. Expected a "
     r"cd\.models\.Network"),
    (lambda m: _replace(m, network=_Unhashable(m.network)),
     r"model\.network \(a _Unhashable\) is not hashable .* static argument of jax\.jit"),
    (lambda m: _replace(m, network=dataclasses.replace(m.network, logits_width=None)),
     r"has logits_width None\. Expected a positive int"),
    (lambda m: _replace(m, vocab="bytes"), r"model\.vocab is a str\. Expected a "
                                           r"cd\.Vocabulary"),
    (lambda m: object(), r"model \(a object\) has no attribute 'network'"),
])
def test_a_model_missing_part_of_the_protocol_is_named(model, broken, message):
  bad = broken(model)
  for run in (lambda: cd.generate(bad, "a", constraint=cd.Regex("a")),
              lambda: list(cd.generate_stream(bad, "a")),
              lambda: cd.evaluate(bad, ["a"], cd.Regex("a")),
              lambda: cd.generate_speculative(bad, "a"),
              lambda: cd.generate_aligned(bad, "a", constraint=cd.Regex("a"), num_samples=1,
                                          sampling=_RANDOM)):
    with pytest.raises(models.ModelProtocolError, match=message):
      run()
  if hasattr(bad, "network") and hasattr(bad, "params"):  # a draft model, broken the same way
    with pytest.raises(models.ModelProtocolError, match=message.replace("model", "draft", 1)):
      cd.generate_speculative(model, "a", draft=bad)


def test_models_of_one_architecture_share_compiled_programs(byte_vocab):
  """The network (GraphDef) is the static part: new weights do not recompile."""
  from constrained_decoding.sampling import _loop  # pylint: disable=g-import-not-at-top

  first, second = _byte_model(byte_vocab, seed=5), _byte_model(byte_vocab, seed=6)
  assert first.network == second.network
  cd.generate(first, ["abc"], constraint=cd.Regex("[a-z]{3}"), max_new_tokens=5)
  sizes = _loop.decode._cache_size(), _loop.prefill_model._cache_size()  # pylint: disable=protected-access
  outs = cd.generate(second, ["abd"], constraint=cd.Regex("[a-z]{3}"), max_new_tokens=5)
  assert re.fullmatch("[a-z]{3}", outs[0].text)
  assert (_loop.decode._cache_size(), _loop.prefill_model._cache_size()) == sizes  # pylint: disable=protected-access


def test_the_worked_example_in_docs_runs():
  """docs/models.md's worked example, run exactly as written."""
  import pathlib  # pylint: disable=g-import-not-at-top

  doc = (pathlib.Path(__file__).parents[2] / "docs" / "models.md").read_text()
  section = doc[doc.index("## Worked example"):]
  code = section[section.index("```python\n") + 10:]
  code = code[:code.index("```")]
  namespace: dict = {}
  exec(compile(code, "docs/models.md", "exec"), namespace)  # pylint: disable=exec-used
  out = namespace["out"]
  assert out.finished and re.fullmatch(r"(yes|no)-[0-9]{2}", out.text)
  assert out.value == out.text
