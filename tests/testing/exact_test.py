"""The exact reference of grammar-aligned sampling against brute force (tiny model)."""

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import models
from constrained_decoding.models import _gemma3
from constrained_decoding.testing import _exact

# Multi-character tokens: a string has several tokenizations, each its own outcome.
_TOKENS = [b"0", b"1", b"00", b"10", b"x"]
_PATTERN = r"00000|1[01]{4}"
_PROMPT = [4, 1, 4]
_FORWARD = jax.jit(_gemma3.forward, static_argnames="config")


@pytest.fixture(scope="module")
def vocab():
  return cd.Vocabulary.from_token_bytes(_TOKENS + [None], eos_ids=[len(_TOKENS)])


@pytest.fixture(scope="module")
def model(vocab):
  config = models.Gemma3Config.tiny(vocab_size=vocab.vocab_size)
  return models.Gemma3.random(config, tokenizer=None, vocab=vocab, bos_id=4, seed=5)


@pytest.fixture(scope="module")
def tables(vocab, tmp_path_factory):
  options = cd.CompileOptions(cache_dir=str(tmp_path_factory.mktemp("exact")))
  return cd.Compiler(vocab, options).compile(cd.Regex(_PATTERN))


def _brute_force_language():
  return sorted(w for n in range(1, 6) for w in itertools.product(range(len(_TOKENS)), repeat=n)
                if re.fullmatch(_PATTERN, b"".join(_TOKENS[t] for t in w).decode()))


def _brute_force_log_probs(model, w, temperature):
  """log P(t | prefix) of every step then the end-of-sequence mass, one forward each."""
  tokens = np.array([_PROMPT + list(w)], np.int32)
  cache = _gemma3.init_cache(model.config, batch_size=1, cache_len=tokens.shape[1])
  positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
  logits, _ = _FORWARD(model.params, model.config, jnp.asarray(tokens), positions, cache)
  logp = np.asarray(jax.nn.log_softmax(logits[0] / temperature), np.float64)
  steps = logp[len(_PROMPT) - 1:]
  return steps


def test_accepted_sequences_are_the_brute_force_language(tables):
  language = _brute_force_language()
  assert _exact.accepted_sequences(tables) == language
  assert len(language) > 17  # several tokenizations of the 17 strings


def test_exact_distribution_matches_brute_force(model, tables):
  temperature = 0.7
  exact = _exact.exact_distribution(model, _PROMPT, tables,
                                    sampling=cd.SamplingConfig(temperature=temperature),
                                    batch_size=8)
  language = set(exact.sequences)
  eos = len(_TOKENS)
  log_p, log_gcd = [], []
  for w in exact.sequences:
    steps = _brute_force_log_probs(model, w, temperature)
    lp = sum(steps[i, t] for i, t in enumerate(w)) + steps[len(w), eos]
    gcd = 0.0
    for i in range(len(w) + 1):  # allowed after w[:i]: extends to some word, or EOS
      prefix = w[:i]
      allowed = [t for t in range(len(_TOKENS)) if any(v[:i + 1] == prefix + (t,)
                                                       for v in language)]
      if prefix in language:
        allowed.append(eos)
      mass = np.logaddexp.reduce(steps[i, allowed])
      gcd += (steps[i, w[i]] if i < len(w) else steps[i, eos]) - mass
    log_p.append(lp)
    log_gcd.append(gcd)
  np.testing.assert_allclose(exact.log_p, log_p, atol=1e-4)
  np.testing.assert_allclose(exact.log_gcd, log_gcd, atol=1e-4)
  np.testing.assert_allclose(exact.q.sum(), 1.0, atol=1e-9)
  np.testing.assert_allclose(exact.gcd.sum(), 1.0, atol=1e-4)
  # The EFG of the root is the grammatical mass; of a full word, its EOS probability.
  np.testing.assert_allclose(exact.efg(()), np.exp(exact.log_mass), rtol=1e-9)
  w = exact.sequences[0]
  np.testing.assert_allclose(np.log(exact.efg(w)), exact.log_p[0] - exact.step_log_p[0].sum(),
                             atol=1e-6)
  assert exact.efg((4,)) == 0.0


def test_counts_and_kl(model, tables):
  exact = _exact.exact_distribution(model, _PROMPT, tables)
  counts = exact.counts([exact.sequences[0]] * 3 + [exact.sequences[1]])
  assert counts.sum() == 4 and counts[0] == 3
  assert _exact.empirical_kl(np.round(exact.q * 1e6), exact.q) == pytest.approx(0, abs=1e-5)
  with pytest.raises(ValueError, match=r"is not in the language"):
    exact.counts([(4,)])


def test_infinite_language_is_refused(vocab, tmp_path):
  tables = cd.Compiler(vocab, cd.CompileOptions(cache_dir=str(tmp_path))).compile(cd.Regex("1+"))
  with pytest.raises(ValueError, match=r"longer than 6 tokens"):
    _exact.accepted_sequences(tables, max_length=6)
