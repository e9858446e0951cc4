"""generate() with a random-weight Gemma 3 and the real vocabulary: output always matches."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.sampling import _generate
from constrained_decoding.sampling import _loop

_PATTERNS = [
    r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)",
    r"\d{4}-[01]\d-[0-3]\dT[0-2]\d:[0-5]\d:[0-5]\d([+][0-2]\d:[0-5]\d|Z)",
    r"Red|Orange|Yellow|Green|Blue|Indigo|Violet",
    r'\{"answer": "[ABCD]", "why": "[a-z ]{0,12}"\}',
    r"[^a-z\n]{1,6}",
]


@pytest.mark.parametrize("pattern", _PATTERNS)
def test_random_model_output_always_matches(pattern, random_model, gemma_compiler):
  tables = gemma_compiler.compile(cd.Regex(pattern))
  sampling = cd.SamplingConfig(temperature=1.5)
  for seed in range(4):
    outs = cd.generate(random_model, ["x", "The answer is", "1.2"], constraint=tables,
                       max_new_tokens=48, sampling=sampling, seed=seed)
    for out in outs:
      assert not out.error
      if out.finished:
        assert re.fullmatch(pattern, out.text, re.ASCII), out.text
      else:  # ran out of tokens: still a viable prefix
        assert len(out.token_ids) == 48


def test_per_row_constraints_in_one_batch(random_model, gemma_compiler):
  patterns = [r"\d{3}", r"[a-z]{2,4}", r"(yes|no)!", r"[A-Z][a-z]?"]
  tables = [gemma_compiler.compile(cd.Regex(p)) for p in patterns]
  for seed in range(3):
    outs = cd.generate(random_model, ["p"] * 4, constraint=tables, max_new_tokens=12,
                       sampling=cd.SamplingConfig(temperature=1.0, top_k=1000), seed=seed)
    for pattern, out in zip(patterns, outs):
      assert out.finished and re.fullmatch(pattern, out.text, re.ASCII), (pattern, out)


def test_greedy_is_deterministic_and_top_p_runs(random_model, gemma_compiler):
  tables = gemma_compiler.compile(cd.Regex(r"[a-z ]{1,20}"))
  a = cd.generate(random_model, "q", constraint=tables, max_new_tokens=8)
  b = cd.generate(random_model, "q", constraint=tables, max_new_tokens=8)
  assert a == b
  c = cd.generate(random_model, "q", constraint=tables, max_new_tokens=8,
                  sampling=cd.SamplingConfig(temperature=0.8, top_p=0.9))
  assert re.fullmatch(r"[a-z ]{1,20}", c[0].text) or not c[0].finished


def test_unconstrained_and_streaming(random_model, gemma_compiler):
  [free] = cd.generate(random_model, "hello", max_new_tokens=5,
                       sampling=cd.SamplingConfig(temperature=1.0))
  assert len(free.token_ids) <= 5
  tables = gemma_compiler.compile(cd.Regex(r"\d{6}"))
  [whole] = cd.generate(random_model, "n", constraint=tables, max_new_tokens=10)
  items = list(cd.generate_stream(random_model, "n", constraint=tables, max_new_tokens=10,
                                  chunk_size=2))
  *pieces, (row, final) = items  # the row's Completion comes last, after its bytes
  assert row == 0 and final == whole
  assert all(isinstance(p, bytes) for _, p in pieces)
  assert b"".join(p for _, p in pieces).decode() == whole.text


def test_decode_loop_is_one_while_without_callbacks(random_model, gemma_compiler):
  tables = jax.device_put(gemma_compiler.compile(cd.Regex(r"\d+")))
  state = _generate._prepare(random_model, ["a"], tables, None, 8, 0)[1]
  args = (random_model.params, tables, state, jnp.int32(8), jnp.array([1, 106], jnp.int32),
          jnp.float32(0), jnp.float32(1))
  jaxpr = str(jax.make_jaxpr(lambda *a: _loop.decode(
      *a, network=random_model.network, sampling=cd.SamplingConfig()))(*args))
  assert jaxpr.count(" while[") == 1
  assert "callback" not in jaxpr


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(prompts=[]), ValueError, r"Got no prompts"),
    (dict(prompts="a", max_new_tokens=0), ValueError, r"max_new_tokens 0 is out of range"),
    (dict(prompts=["a", "b"], constraint="tables"), TypeError, r"ConstraintTables"),
])
def test_generate_errors(kwargs, error, message, random_model):
  with pytest.raises(error, match=message):
    cd.generate(random_model, **kwargs)


def test_constraint_count_must_match(random_model, gemma_compiler):
  t = gemma_compiler.compile(cd.Regex("a"))
  with pytest.raises(ValueError, match=r"Got 1 constraints for 2 prompts"):
    cd.generate(random_model, ["a", "b"], constraint=[t])


def test_masking_does_not_distort_the_distribution():
  # Sampling masked logits = sampling the model's distribution renormalized on the set.
  logits = jnp.log(jnp.array([[0.1, 0.2, 0.3, 0.4]]))
  allowed = jnp.array([[True, False, True, True]])
  masked = jnp.where(allowed, logits, -jnp.inf)
  keys = jax.random.split(jax.random.PRNGKey(0), 20000)
  draws = jax.vmap(lambda k: cd.sampling.sample_tokens(
      masked, k, cd.SamplingConfig(temperature=1.0)))(keys)[:, 0]
  freq = np.bincount(np.asarray(draws), minlength=4) / len(draws)
  np.testing.assert_allclose(freq, [0.125, 0, 0.375, 0.5], atol=0.015)


def test_sampling_config_errors():
  with pytest.raises(ValueError, match=r"temperature -1.0 is negative"):
    cd.SamplingConfig(temperature=-1.0)
  with pytest.raises(ValueError, match=r"top_p 0.0 is outside \(0, 1\]"):
    cd.SamplingConfig(top_p=0.0)
  with pytest.raises(ValueError, match=r"top_k -2 is negative"):
    cd.SamplingConfig(top_k=-2)
