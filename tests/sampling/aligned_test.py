"""Grammar-aligned sampling (ASAp) against the exact conditioned distribution.

The toy model is a Gemma 3 whose blocks are switched off (post-norm weights 0), so its
next-token logits depend on the last token only: a bigram table set by hand through the
tied embedding (`_bigram_model`). Its distribution over the tiny language is then known
exactly (`testing.exact_distribution`), and built so that plain constrained sampling is
badly biased: after the prompt "x", "0" and "1" are equally likely, but "0" is followed
by "0" with probability 0.0045, so `00000` has Q ≈ 2e-10 while GCD draws it half the time.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import models
from constrained_decoding.models import _gemma3
from constrained_decoding.sampling import _aligned
from constrained_decoding.testing import _exact
from constrained_decoding.testing import _reference

_TOKENS = [b"0", b"1", b"x"]
_EOS = len(_TOKENS)
_PATTERN = r"00000|1[01]{4}"
_PROMPT = [2]  # "x"
_SAMPLING = cd.SamplingConfig(temperature=1.0)
_FORWARD = jax.jit(_gemma3.forward, static_argnames="config")
# Symmetric bigram logits (the head is tied to the embedding), rows: current token
# "0", "1", "x", end of sequence; columns: next token.
_LOGITS = np.array([
    [-3.0, 2.0, 1.0, 0.0],
    [2.0, 1.0, 1.0, 0.0],
    [1.0, 1.0, 0.0, -2.0],
    [0.0, 0.0, -2.0, 0.0],
])


def _bigram_model(vocab, logits: np.ndarray):
  """A tiny Gemma 3 whose logits after token t are `logits[t]` (symmetric)."""
  config = models.Gemma3Config.tiny(vocab_size=vocab.vocab_size)
  params = jax.tree.map(np.asarray, models.Gemma3.random(config, tokenizer=None, vocab=vocab,
                                                         bos_id=2).params)
  for layer in params["layers"]:  # every block adds 0 to the residual stream
    layer["post_attention_norm"] = np.zeros_like(layer["post_attention_norm"])
    layer["post_ffw_norm"] = np.zeros_like(layer["post_ffw_norm"])
  # x = sqrt(D) e_t with |e_t| = 1, so rms_norm(x) = x and logits = sqrt(D) e_t diag(w) E^T.
  values, vectors = np.linalg.eigh(logits)
  dim = config.embed_dim
  embedding = np.zeros((vocab.vocab_size, dim), np.float32)
  embedding[:, :len(values)] = vectors
  final = np.zeros(dim, np.float32)
  final[:len(values)] = values / np.sqrt(dim)
  params["embedding"], params["final_norm"] = embedding, final
  return models.Gemma3(config=config, params=jax.tree.map(jnp.asarray, params),
                       tokenizer=None, vocab=vocab, bos_id=2)


@pytest.fixture(scope="module")
def vocab():
  return cd.Vocabulary.from_token_bytes(_TOKENS + [None], eos_ids=[_EOS])


@pytest.fixture(scope="module")
def model(vocab):
  return _bigram_model(vocab, _LOGITS)


@pytest.fixture(scope="module")
def compiler(vocab, tmp_path_factory):
  return cd.Compiler(vocab, cd.CompileOptions(cache_dir=str(tmp_path_factory.mktemp("al"))))


@pytest.fixture(scope="module")
def tables(compiler):
  return compiler.compile(cd.Regex(_PATTERN))


@pytest.fixture(scope="module")
def exact(model, tables):
  return _exact.exact_distribution(model, _PROMPT, tables, sampling=_SAMPLING)


def _draw(model, tables, num_samples, **kwargs):
  """generate_aligned with this file's defaults (few shapes: few compilations)."""
  kwargs = {"sampling": _SAMPLING, "max_new_tokens": 8, "capacity": 256, **kwargs}
  return cd.generate_aligned(model, kwargs.pop("prompt", _PROMPT), constraint=tables,
                             num_samples=num_samples, **kwargs)


def _step_log_probs(model, w) -> np.ndarray:
  """log P(. | prompt + w[:k]) for k = 0..len(w), by one plain forward pass."""
  tokens = jnp.asarray([_PROMPT + list(w)], jnp.int32)
  cache = _gemma3.init_cache(model.config, batch_size=1, cache_len=tokens.shape[1])
  positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
  logits, _ = _FORWARD(model.params, model.config, tokens, positions, cache)
  return np.asarray(jax.nn.log_softmax(logits[0, len(_PROMPT) - 1:]), np.float64)


def test_toy_model_is_the_bigram_table(model):
  logp = _step_log_probs(model, (0, 1, 1, 0))
  for k, row in enumerate([2, 0, 1, 1, 0]):
    np.testing.assert_allclose(logp[k], _LOGITS[row] - np.logaddexp.reduce(_LOGITS[row]),
                               atol=1e-4)


def test_first_path_efg_is_eq_3_by_hand(model, tables, exact):
  [sample], store = _draw(model, tables, 1, seed=3)
  w = sample.token_ids
  assert sample.finished and w in exact.index
  assert store.num_nodes == len(w) + 1 and store.num_samples == 1
  # Bottom-up: the last prefix has no child (its end of sequence needs none).
  states, _ = _reference.reference_walk(tables, w, with_stacks=True)
  states = [(int(np.asarray(tables.start)[0]), ())] + states
  expected = None
  step_log_probs = _step_log_probs(model, w)
  for k in range(len(w), -1, -1):
    logp = step_log_probs[k]
    allowed = _reference.reference_allowed(tables, *states[k])
    others = allowed.copy()
    if k < len(w):
      others[w[k]] = False
    efg = np.exp(np.logaddexp.reduce(logp[others]))
    if k < len(w):
      efg += np.exp(logp[w[k]]) * expected
    expected = efg
    np.testing.assert_allclose(store.efg(w[:k]), expected, rtol=1e-4)
  np.testing.assert_allclose(np.exp(store.log_mass_bound), expected, rtol=1e-4)


def _check_theorem_1(store, exact):
  """c̃ >= c (exact EFG) for every stored prefix, compared in log space."""
  for prefix, efg in store.prefixes().items():
    assert np.log(efg) >= np.log(exact.efg(prefix)) - 1e-4, (prefix, efg, exact.efg(prefix))


@pytest.mark.parametrize("batch_size", [1, 8])
def test_converges_to_exact_q_and_beats_gcd(model, tables, exact, batch_size):
  n = 400
  samples, store = _draw(model, tables, n, batch_size=batch_size, seed=0)
  assert len(samples) == n and store.num_samples == n and store.num_dropped == 0
  assert all(s.finished and re.fullmatch(_PATTERN, s.text) for s in samples)
  kl_aligned = _exact.empirical_kl(exact.counts([s.token_ids for s in samples]), exact.q)
  gcd = cd.generate(model, [_PROMPT] * n, constraint=tables, max_new_tokens=8,
                    sampling=_SAMPLING, seed=0)
  kl_gcd = _exact.empirical_kl(exact.counts([s.token_ids for s in gcd]), exact.q)
  # The bound: the multinomial noise of n draws over the k = 16 likely strings,
  # E[KL] ≈ (k - 1) / 2n, three times over, plus exploration: each row of the first
  # round may draw `00000` once (Q ≈ 2e-10) before its EFG is known, which adds at
  # most (b / n) log(b / (n Q)) to the KL.
  q_low = exact.q[exact.index[(0, 0, 0, 0, 0)]]
  bound = 3 * 15 / (2 * n) + batch_size / n * np.log(batch_size / (n * q_low))
  assert kl_aligned < bound, (kl_aligned, bound)
  # GCD's own limit is far away: KL(GCD || Q) ≈ 0.5 log(0.5 / Q(00000)).
  assert kl_gcd > 5, kl_gcd
  assert kl_aligned < kl_gcd / 20
  _check_theorem_1(store, exact)
  # The root's estimate converged to P(L) (every branch has been explored).
  np.testing.assert_allclose(store.log_mass_bound, exact.log_mass, atol=1e-3)


def test_first_path_on_push_down_tables(model, compiler):
  # 1^n x 0^n: the stack counts the ones; Eq. 3 by hand along the sampled path.
  tables = compiler.compile(cd.Grammar('root ::= "x" | "1" root "0"'))
  assert tables.is_pushdown
  [sample], store = _draw(model, tables, 1, seed=1)
  w = sample.token_ids
  assert sample.finished and re.fullmatch(r"(1*)x(0*)", sample.text)
  assert len(w) > 1
  states, _ = _reference.reference_walk(tables, w, with_stacks=True)
  states = [(int(np.asarray(tables.start)[0]), ())] + states
  step_log_probs = _step_log_probs(model, w)
  expected = None
  for k in range(len(w), -1, -1):
    allowed = _reference.reference_allowed(tables, *states[k])
    others = allowed.copy()
    if k < len(w):
      others[w[k]] = False
    expected = np.exp(np.logaddexp.reduce(step_log_probs[k][others])) + (
        np.exp(step_log_probs[k][w[k]]) * expected if k < len(w) else 0.0)
    np.testing.assert_allclose(store.efg(w[:k]), expected, rtol=1e-4)
  more, store = _draw(model, tables, 16, store=store)
  for s in more:
    m = re.fullmatch(r"(1*)x(0*)", s.text)
    assert not s.finished or (m and len(m[1]) == len(m[2])), s.text


def test_full_store_falls_back_to_the_mask(model, tables, exact):
  # Capacity 3: the first path stores its first three edges; the fourth is refused and
  # its prefix keeps c̃ = 1, so c̃ of the third prefix is its whole allowed mass.
  [sample], store = _draw(model, tables, 1, seed=3, capacity=3)
  w = sample.token_ids
  assert store.is_full and store.num_nodes == 4 and store.num_dropped == 1
  assert store.efg(w[:4]) is None
  logp = _step_log_probs(model, w)[3]
  state = _reference.reference_walk(tables, w[:3], with_stacks=True)[0][-1]
  np.testing.assert_allclose(store.efg(w[:3]),
                             np.exp(np.logaddexp.reduce(logp[_reference.reference_allowed(
                                 tables, *state)])), rtol=1e-4)
  samples, store = _draw(model, tables, 40, store=store)
  assert all(s.finished and re.fullmatch(_PATTERN, s.text) for s in samples)
  assert store.num_nodes == 4 and store.num_dropped > 1 and store.num_samples == 41
  _check_theorem_1(store, exact)  # still an over-approximation


def test_store_carried_across_calls(model, tables):
  whole, store = _draw(model, tables, 32, batch_size=8, seed=7)
  first, half = _draw(model, tables, 16, batch_size=8, seed=7)
  second, again = _draw(model, tables, 16, batch_size=8, seed=7, store=half)
  assert first + second == whole
  assert again.num_samples == 32 and half.num_samples == 16  # `half` was not consumed
  for a, b in zip(jax.tree.leaves(store.arrays), jax.tree.leaves(again.arrays)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # A count that the batch does not divide: the last round keeps only what is needed.
  samples, store = _draw(model, tables, 5, batch_size=8)
  assert len(samples) == 5 and store.num_samples == 5


def test_round_is_jitted_without_callbacks(model, tables):
  from constrained_decoding.sampling import _generate  # pylint: disable=g-import-not-at-top

  placed, init, eos_ids = _generate._prepare(model, [_PROMPT] * 2, tables, None, 8, 0)
  args = (model.params, placed, init, _aligned.init_store(16), jnp.int32(8), eos_ids,
          jnp.float32(1), jnp.float32(1), jnp.int32(2), jax.random.PRNGKey(0))
  jaxpr = str(jax.make_jaxpr(lambda *a: _aligned._round(
      *a, network=model.network, sampling=_SAMPLING.static_part()))(*args))
  assert jaxpr.count(" while[") == 3  # decode, insert, backward update
  assert "callback" not in jaxpr


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(num_samples=0), cd.DecodingArgumentError, r"num_samples 0 is not a count"),
    (dict(batch_size=0), cd.DecodingArgumentError, r"batch_size 0 is not a count"),
    (dict(batch_size=5000), cd.DecodingArgumentError, r"batch_size 5000 .* \[1, 1024\]"),
    (dict(capacity=0), cd.DecodingArgumentError, r"capacity 0 is not a count"),
    (dict(sampling=cd.SamplingConfig()), cd.DecodingArgumentError, r"greedy"),
    (dict(sampling=cd.SamplingConfig(temperature=1.0, jump_forward=2)),
     cd.DecodingArgumentError, r"jump_forward=2, which it does not support"),
    (dict(constraint=None), cd.DecodingArgumentError, r"constraint is None"),
    (dict(constraint=[]), cd.DecodingArgumentError, r"constraint is an empty list"),
    (dict(constraint_ids=[0, 1]), cd.DecodingArgumentError,
     r"constraint_ids .* do not name a constraint per row. Expected 2 ints in \[0, 1\)"),
    (dict(constraint_ids=[0]), cd.DecodingArgumentError, r"Expected 2 ints"),
    (dict(prompt=["x", "y"]), cd.DecodingArgumentError, r"is a list of prompts"),
    (dict(prompt=[99]), cd.DecodingArgumentError, r"not a non-empty list of token ids"),
    (dict(max_new_tokens=0), cd.DecodingArgumentError, r"max_new_tokens 0 is out of range"),
])
def test_errors(kwargs, error, message, model, tables):
  args = dict(prompt=_PROMPT, constraint=tables, num_samples=2, sampling=_SAMPLING)
  args.update(kwargs)
  with pytest.raises(error, match=message):
    cd.generate_aligned(model, **args)


def test_store_mismatch_is_refused(model, tables, compiler):
  _, store = _draw(model, tables, 1)
  other = compiler.compile(cd.Regex(r"1[01]{4}"))
  cases = [
      (dict(constraint=other), r"another constraint"),
      (dict(prompt=[2, 2]), r"another prompt"),
      (dict(sampling=cd.SamplingConfig(temperature=0.5)), r"another temperature"),
  ]
  for kwargs, message in cases:
    with pytest.raises(cd.StoreMismatchError, match=message):
      _draw(model, kwargs.pop("constraint", tables), 1, store=store, **kwargs)
  # A list of one is the constraint itself; a list's order names the constraint ids.
  _draw(model, [tables], 1, store=store)
  _, pair = _draw(model, [tables, other], 2)
  with pytest.raises(cd.StoreMismatchError, match=r"another constraint"):
    _draw(model, [other, tables], 2, store=pair)
  with pytest.raises(cd.StoreMismatchError, match=r"another constraint"):
    _draw(model, tables, 2, store=pair)


# Per-row constraints. B = `0[01]{2}|111` disagrees with A = G_sk on the prefix "0":
# c_A(0) = P(0000 | 0) ≈ 4e-10 while c_B(0) is large, so a store that mixed the two
# would starve B's `0..` strings (or feed A's), and neither would converge to its Q.
_PATTERN_B = r"0[01]{2}|111"


@pytest.fixture(scope="module")
def tables_b(compiler):
  return compiler.compile(cd.Regex(_PATTERN_B))


@pytest.fixture(scope="module")
def exact_b(model, tables_b):
  return _exact.exact_distribution(model, _PROMPT, tables_b, sampling=_SAMPLING)


def _check_viable(store, k, tables):
  """Every prefix in constraint k's trie is a prefix the constraint's tables allow."""
  for prefix in store.prefixes(k):
    _, ok = _reference.reference_walk(tables, prefix, with_stacks=True)
    assert ok, (k, prefix)


def test_per_row_constraints_converge_each_to_its_own_q(model, tables, tables_b, exact,
                                                         exact_b):
  n = 400  # per constraint; rows alternate A, B, A, ... (constraint_ids None: i % 2)
  batch = 8
  samples, store = _draw(model, [tables, tables_b], 2 * n, batch_size=batch, seed=0,
                         capacity=512)
  assert store.num_constraints == 2 and store.num_dropped == 0
  assert store.num_samples == 2 * n
  by = {0: samples[0::2], 1: samples[1::2]}
  assert all(s.finished and re.fullmatch(_PATTERN, s.text) for s in by[0])
  assert all(s.finished and re.fullmatch(_PATTERN_B, s.text) for s in by[1])
  for k, (ex, pattern_tables) in enumerate([(exact, tables), (exact_b, tables_b)]):
    kl = _exact.empirical_kl(ex.counts([s.token_ids for s in by[k]]), ex.q)
    # As in test_converges_to_exact_q_and_beats_gcd: multinomial noise over the likely
    # strings, three times over, plus one exploratory draw of the least likely string
    # per row of the first round (b / 2 rows of each constraint; b is an upper bound).
    likely = int(np.sum(ex.q > 1e-3))
    bound = 3 * (likely - 1) / (2 * n) + batch / n * np.log(batch / (n * ex.q.min()))
    assert kl < bound, (k, kl, bound)
    # Each trie is its own constraint's: its prefixes are viable under it, c̃ >= its c
    # (Theorem 1), and its root converged to its own P(L).
    _check_viable(store, k, pattern_tables)
    for prefix, efg in store.prefixes(k).items():
      assert np.log(efg) >= np.log(ex.efg(prefix)) - 1e-4, (k, prefix, efg)
    np.testing.assert_allclose(store.log_mass_bounds[k], ex.log_mass, atol=1e-3)
  # The shared prefix "0" has one node per constraint, with that constraint's EFG.
  np.testing.assert_allclose(store.efg((0,), 0), exact.efg((0,)), rtol=1e-3)
  np.testing.assert_allclose(store.efg((0,), 1), exact_b.efg((0,)), rtol=1e-3)
  assert exact_b.efg((0,)) > 1e6 * exact.efg((0,))


def test_per_row_store_never_reads_another_constraint(model, tables, tables_b):
  # Constraint A's rows first, then B's from the same store: B's draws and B's trie are
  # the same whether A's estimates are true or overwritten with nonsense, and A's trie
  # is left as it was.
  both = [tables, tables_b]
  _, store = _draw(model, both, 24, constraint_ids=[0] * 24, batch_size=8, seed=5)
  assert store.prefixes(1) == {(): 1.0}
  a_nodes = np.r_[0, 2:store.num_nodes]
  arrays = store.arrays
  poisoned = dataclasses.replace(store, arrays=arrays.replace(
      node_log_efg=arrays.node_log_efg.at[a_nodes].set(-69.0),
      node_log_rest=arrays.node_log_rest.at[a_nodes].set(-69.0)))
  ids = [1] * 16
  clean, after = _draw(model, both, 16, constraint_ids=ids, batch_size=8, seed=5, store=store)
  dirty, after_dirty = _draw(model, both, 16, constraint_ids=ids, batch_size=8, seed=5,
                             store=poisoned)
  assert [s.token_ids for s in clean] == [s.token_ids for s in dirty]
  assert all(re.fullmatch(_PATTERN_B, s.text) for s in clean)
  assert after.prefixes(1) == after_dirty.prefixes(1) and len(after.prefixes(1)) > 1
  assert after.prefixes(0) == store.prefixes(0)  # B's rounds did not touch A's trie
  assert after_dirty.prefixes(0) == poisoned.prefixes(0)
  _check_viable(after, 1, tables_b)
  # Mixed rounds: a row's node is found under its own root only.
  mixed, store = _draw(model, both, 16, constraint_ids=[0, 1] * 8, batch_size=8, seed=6)
  assert [bool(re.fullmatch(_PATTERN, s.text)) for s in mixed[0::2]] == [True] * 8
  assert [bool(re.fullmatch(_PATTERN_B, s.text)) for s in mixed[1::2]] == [True] * 8
  _check_viable(store, 0, tables)
  _check_viable(store, 1, tables_b)
