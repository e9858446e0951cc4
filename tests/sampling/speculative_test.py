"""Speculative decoding: exact under greedy, valid under sampling, right in distribution.

Targets and drafts are random-weight Gemma 3 architectures (the drafts smaller, with
other weights) sharing one vocabulary: the real Gemma 3 vocabulary for the end-to-end
tests, the byte vocabulary for the distribution test, where every string has a single
tokenization and the exact constrained distribution can be enumerated.

Compiling the loop dominates the cost, so the end-to-end tests share shapes: one
stacked table set (a row picks its pattern by constraint id), three rows, one token
budget, one draft length. Each (drafter, sampling kind, draft constrained or not)
compiles once.
"""

import collections
import functools
import itertools
import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

import constrained_decoding as cd
from constrained_decoding import models
from constrained_decoding.sampling import _generate
from constrained_decoding.sampling import _host
from constrained_decoding.sampling import _speculative

_PATTERNS = [
    r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)",
    r'\{"answer": "[ABCD]", "why": "[a-z ]{0,12}"\}',
    r"(Red|Orange|Yellow|Green) (Red|Orange|Yellow|Green)",
    r"\d{3}",
    r"[a-z]{2,4}",
    r"(yes|no)!",
]
_PROMPTS = ["x", "The answer is", "1.2 and 1.2 and 1."]
_TOKENS = 24  # max_new_tokens everywhere (one compiled shape)
_K = 3  # num_draft_tokens everywhere
_GREEDY = cd.SamplingConfig()
_RANDOM = cd.SamplingConfig(temperature=1.5)


@pytest.fixture(scope="module")
def tokenizer():
  from constrained_decoding.vocab._spm_from_gguf import sentencepiece_from_gguf  # pylint: disable=g-import-not-at-top

  return sentencepiece_from_gguf(models.default_gguf_path())


@pytest.fixture(scope="module")
def target(gemma_vocab, tokenizer):
  config = models.Gemma3Config.tiny(vocab_size=gemma_vocab.vocab_size, num_layers=2)
  return models.Gemma3.random(config, tokenizer=tokenizer, vocab=gemma_vocab, bos_id=2, seed=3)


@pytest.fixture(scope="module")
def draft(gemma_vocab, tokenizer):
  config = models.Gemma3Config.tiny(vocab_size=gemma_vocab.vocab_size, num_layers=1,
                                    embed_dim=16, hidden_dim=32)
  return models.Gemma3.random(config, tokenizer=tokenizer, vocab=gemma_vocab, bos_id=2, seed=11)


@pytest.fixture(scope="module")
def tables(gemma_compiler):
  return jax.device_put(cd.stack_tables([gemma_compiler.compile(cd.Regex(p))
                                         for p in _PATTERNS]))


def _run(target, d, tables, ids, *, constrain_draft=True, sampling=_GREEDY, seed=0):
  return cd.generate_speculative(
      target, _PROMPTS, draft=d, num_draft_tokens=_K, constraint=tables, constraint_ids=ids,
      constrain_draft=constrain_draft, max_new_tokens=_TOKENS, sampling=sampling, seed=seed)


def _plain(target, tables, ids, sampling=_GREEDY):
  return cd.generate(target, _PROMPTS, constraint=tables, constraint_ids=ids,
                     max_new_tokens=_TOKENS, sampling=sampling)


_ID_SETS = [[0, 1, 2], [3, 4, 5], [0, 5, 3]]


# ------------------------------------------------------------------------ greedy: exact


@pytest.mark.parametrize("kind, constrain_draft", [("ngram", True), ("model", False)])
def test_greedy_equals_plain_constrained_decoding(kind, constrain_draft, target, draft,
                                                  tables):
  # The unconstrained draft model proposes invalid tokens, which the masked target
  # rejects; the constraint then rewinds past states with `error` set.
  d = cd.NGramDrafter(max_ngram=2) if kind == "ngram" else draft
  rounds = generated = 0
  for ids in _ID_SETS:
    plain = _plain(target, tables, ids)
    outs, stats = _run(target, d, tables, ids, constrain_draft=constrain_draft)
    assert outs == plain, (ids, outs, plain)
    assert stats.generated == tuple(len(o.token_ids) + o.finished for o in plain)
    for a, n, r, g in zip(stats.accepted, stats.drafted, stats.rounds, stats.generated):
      # The first token, then per round the accepted drafts and one more, except when
      # the row ended on an accepted draft.
      assert a <= n and a + r <= g <= 1 + a + r, stats
    rounds, generated = rounds + sum(stats.rounds), generated + sum(stats.generated)
  assert rounds < generated  # drafts were accepted: fewer target calls than tokens


def test_greedy_unconstrained_equals_plain(target):
  plain = cd.generate(target, _PROMPTS, max_new_tokens=_TOKENS)
  outs, _ = cd.generate_speculative(target, _PROMPTS, draft=cd.NGramDrafter(),
                                    num_draft_tokens=_K, max_new_tokens=_TOKENS)
  assert outs == plain


# ------------------------------------------------------------- sampling: always valid


@pytest.mark.parametrize("kind, constrain_draft", [("model", True), ("ngram", False)])
def test_random_sampling_output_always_matches(kind, constrain_draft, target, draft, tables):
  d = cd.NGramDrafter(max_ngram=2) if kind == "ngram" else draft
  for seed, ids in enumerate(_ID_SETS):
    outs, stats = _run(target, d, tables, ids, constrain_draft=constrain_draft,
                       sampling=_RANDOM, seed=seed)
    for i, out in zip(ids, outs):
      assert not out.error
      if out.finished:
        assert re.fullmatch(_PATTERNS[i], out.text, re.ASCII), (_PATTERNS[i], out.text)
      else:  # ran out of tokens: still a viable prefix
        assert len(out.token_ids) == _TOKENS
    assert all(a <= n for a, n in zip(stats.accepted, stats.drafted))


def test_per_row_constraints_stay_independent(target, tables):
  # Row 0 keeps its constraint while the others change: its output must not move, and
  # rows accept different numbers of draft tokens (each row rewinds on its own).
  d = cd.NGramDrafter(max_ngram=2)
  first, stats_a = _run(target, d, tables, [1, 3, 4])
  second, stats_b = _run(target, d, tables, [1, 5, 0])
  assert first[0] == second[0]
  assert first[1:] != second[1:]
  assert len(set(stats_a.accepted)) > 1 or len(set(stats_b.accepted)) > 1


# ----------------------------------------------------------------- loop structure


def test_loop_is_one_while_without_callbacks(target, draft, tables):
  for d in (cd.NGramDrafter(), draft):
    jaxpr = _speculate_jaxpr(target, d, tables)
    assert jaxpr.count(" while[") == 1
    assert "callback" not in jaxpr


def _speculate_jaxpr(target, d, tables) -> str:
  # The shapes of the sampling test, so that `_start` is already compiled.
  is_model = not isinstance(d, cd.NGramDrafter)
  ids = jnp.zeros(len(_PROMPTS), jnp.int32)
  first = _generate._prepare(target, _PROMPTS, tables, ids, _TOKENS + _K + 1, 0)[1]
  eos = jnp.asarray(target.vocab.eos_ids, jnp.int32)
  static = _RANDOM.static_part()
  encoded = _host.encode_prompts(target, _PROMPTS)
  prompt = jnp.asarray(_host.left_pad(encoded, _host.prompt_width(encoded))[0])
  state = _speculative._start(
      d.params if is_model else None, tables, first, prompt, eos, jnp.int32(8),
      jnp.float32(1), jnp.float32(1), draft_network=d.network if is_model else None,
      sampling=static, context_len=prompt.shape[1] + first.tokens.shape[1], buffer=first.tokens.shape[1])
  fn = functools.partial(_speculative._speculate, target_network=target.network,
                         drafter=d.network if is_model else d, sampling=static,
                         num_draft=_K, constrain_draft=True)
  return str(jax.make_jaxpr(fn)(target.params, d.params if is_model else None, tables, state,
                                jnp.int32(8), eos, jnp.float32(1), jnp.float32(1)))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(num_draft_tokens=0), ValueError, r"num_draft_tokens 0 is invalid\. Expected an int"),
    (dict(draft="small"), TypeError, r"draft is a str\. Expected cd\.NGramDrafter"),
    (dict(max_new_tokens=0), ValueError, r"max_new_tokens 0 is out of range"),
])
def test_errors(kwargs, error, message, target):
  with pytest.raises(error, match=message):
    cd.generate_speculative(target, "a", **kwargs)


def test_draft_with_another_vocabulary_is_rejected(target, byte_vocab):
  other = models.Gemma3.random(models.Gemma3Config.tiny(vocab_size=byte_vocab.vocab_size),
                               tokenizer=None, vocab=byte_vocab, bos_id=0)
  with pytest.raises(ValueError, match=r"The draft model has 257 logits .* Expected the same "
                                       r"vocabulary"):
    cd.generate_speculative(target, "a", draft=other)
  with pytest.raises(ValueError, match=r"NGramDrafter\(min_ngram=3, max_ngram=2\) is invalid"):
    cd.NGramDrafter(min_ngram=3, max_ngram=2)


# ------------------------------------------------------------------- n-gram drafter


def _reference_lookup(seq, allowed, max_ngram, min_ngram):
  """Python prompt lookup: the longest suffix match, then the most recent; else the most
  recent allowed token; None if no earlier token is allowed."""
  best = None
  for i in range(len(seq) - 1):  # match ends at i; candidate seq[i + 1]
    length = 0
    while (length < max_ngram and i - length >= 0
           and seq[i - length] == seq[len(seq) - 1 - length]):
      length += 1
    if allowed is None or allowed[seq[i + 1]]:
      key = (length if length >= min_ngram else 0, i)
      if best is None or key >= best[0]:
        best = (key, seq[i + 1])
  return None if best is None else best[1]


def test_ngram_lookup_matches_reference():
  rng = random.Random(0)
  vocab, width = 5, 24
  lookup = jax.jit(_speculative._ngram_lookup, static_argnames="drafter")
  for trial in range(200):
    length = rng.randint(1, width - 1)
    seq = [rng.randrange(vocab) for _ in range(length)]
    allowed = np.array([rng.random() < 0.4 for _ in range(vocab)])
    allowed[rng.randrange(vocab)] = True
    max_ngram = rng.randint(1, 3)
    drafter = cd.NGramDrafter(max_ngram=max_ngram, min_ngram=rng.randint(1, max_ngram))
    context = np.zeros((1, width), np.int32)
    context[0, :length] = seq
    mask = None if trial % 2 else jnp.asarray(allowed[None])
    got = int(lookup(jnp.asarray(context), jnp.array([length - 1]), mask, drafter=drafter)[0])
    want = _reference_lookup(seq, None if mask is None else allowed, drafter.max_ngram,
                             drafter.min_ngram)
    if want is None:  # fallback: the last token again, or the lowest allowed token
      want = seq[-1] if mask is None else int(np.argmax(allowed))
    assert got == want, (seq, allowed, drafter)


# -------------------------------------------------- acceptance rule, in isolation


@pytest.mark.parametrize("sampling", [
    cd.SamplingConfig(temperature=1.0),
    cd.SamplingConfig(temperature=0.7, top_k=4, top_p=0.9),
])
def test_acceptance_rule_gives_the_target_distribution(sampling):
  # One round with fixed logits: the first committed token (d_1 if accepted, else the
  # resampled one) follows p_1, and the second (d_2, or the correction at position 2
  # when d_1 was accepted but d_2 not, or the bonus) follows p_2: for all q.
  rng = np.random.default_rng(0)
  vocab, k, n = 6, 2, 40000
  p_logits = jnp.asarray(rng.normal(0, 1.5, (1, k + 1, vocab)), jnp.float32)
  p_logits = p_logits.at[0, 0, 5].set(-jnp.inf)  # masked by the constraint
  q_logits = jnp.asarray(rng.normal(0, 1.5, (1, k, vocab)), jnp.float32)
  temperature, top_p = jnp.float32(sampling.temperature), jnp.float32(sampling.top_p)
  static = sampling.static_part()
  q_filtered = cd.sampling.filter_logits(q_logits, static, temperature=temperature,
                                         top_p=top_p)

  @jax.jit
  def one(key):
    draft_key, accept_key = jax.random.split(key)
    drafts = jax.random.categorical(draft_key, q_filtered)  # [1, k]
    m, token = _speculative._accept(p_logits, q_filtered, drafts, accept_key, static,
                                    temperature, top_p)
    committed = jnp.concatenate([drafts, token[:, None]], axis=1).at[0, m[0]].set(token[0])
    return committed[0, :2], m[0]

  committed, m = jax.vmap(one)(jax.random.split(jax.random.PRNGKey(1), n))
  committed, m = np.asarray(committed), np.asarray(m)
  p = np.asarray(jax.nn.softmax(cd.sampling.filter_logits(
      p_logits, static, temperature=temperature, top_p=top_p), axis=-1))[0]
  first = np.bincount(committed[:, 0], minlength=vocab)
  second = np.bincount(committed[m >= 1, 1], minlength=vocab)
  for counts, probs in ((first, p[0]), (second, p[1])):
    assert counts[probs == 0].sum() == 0
    keep = probs > 0
    want = probs[keep].astype(np.float64)
    pvalue = scipy_stats.chisquare(counts[keep], want / want.sum() * counts.sum()).pvalue
    assert pvalue > 1e-3, (counts, probs)
  assert 0 < (m == k).mean() < 1  # both the bonus and the rejection paths ran


# ------------------------------------------------------------- exact distribution


_DIST_PATTERN = r"[ab]{1,3}"
_DIST_PROMPT = [ord(c) for c in "ab ba ab"]
_DIST_SAMPLING = cd.SamplingConfig(temperature=1.0)


@pytest.fixture(scope="module")
def byte_models(byte_vocab):
  size = byte_vocab.vocab_size
  target = models.Gemma3.random(models.Gemma3Config.tiny(vocab_size=size, num_layers=2),
                                tokenizer=None, vocab=byte_vocab, bos_id=0, seed=5)
  draft = models.Gemma3.random(
      models.Gemma3Config.tiny(vocab_size=size, num_layers=1, embed_dim=16, hidden_dim=32),
      tokenizer=None, vocab=byte_vocab, bos_id=0, seed=6)
  return target, draft


def _exact_distribution(model, tables, language):
  """P(text) of plain constrained sampling, by teacher forcing every string of the
  (finite) language at once: products of masked, renormalized next-token probabilities."""
  eos = model.vocab.eos_ids[0]
  rows = [[*_DIST_PROMPT, *text.encode(), eos] for text in language]
  width = max(map(len, rows))
  tokens = jnp.asarray([r + [eos] * (width - len(r)) for r in rows], jnp.int32)
  cache = models.init_cache(model.config, batch_size=len(rows), cache_len=width)
  forward = jax.jit(models.forward, static_argnames="config")
  logits, _ = forward(model.params, model.config, tokens,
                      jnp.broadcast_to(jnp.arange(width), tokens.shape), cache)
  state = cd.init_state(tables, batch_size=len(rows))
  logprob = np.zeros(len(rows))
  for i in range(len(_DIST_PROMPT) - 1, width - 1):
    masked = cd.mask_logits(tables, state, logits[:, i]) / _DIST_SAMPLING.temperature
    step = np.asarray(jax.nn.log_softmax(masked, axis=-1))[np.arange(len(rows)), tokens[:, i + 1]]
    live = np.array([i + 1 < len(r) for r in rows])
    logprob += np.where(live, step, 0.0)
    state = cd.advance(tables, state, tokens[:, i + 1])
  assert bool(state.done.all()) and not bool(state.error.any())
  return dict(zip(language, np.exp(logprob)))


def _chi_square_pvalue(counts: collections.Counter, expected: dict) -> float:
  assert set(counts) <= set(expected), set(counts) - set(expected)
  keys = sorted(expected)
  observed = np.array([counts[k] for k in keys], float)
  want = np.array([expected[k] for k in keys])
  return float(scipy_stats.chisquare(observed, want / want.sum() * observed.sum()).pvalue)


def test_speculative_sampling_matches_the_exact_constrained_distribution(byte_models,
                                                                         byte_compiler):
  target, draft = byte_models
  tables = byte_compiler.compile(cd.Regex(_DIST_PATTERN))
  language = ["".join(p) for n in (1, 2, 3) for p in itertools.product("ab", repeat=n)]
  exact = _exact_distribution(target, tables, language)
  assert abs(sum(exact.values()) - 1) < 1e-4
  draft_exact = _exact_distribution(draft, tables, language)
  rows, seeds = 1500, 2

  def run(d, constrain, seed):
    return cd.generate_speculative(
        target, [_DIST_PROMPT] * rows, draft=d, num_draft_tokens=2, constraint=tables,
        constrain_draft=constrain, max_new_tokens=4, sampling=_DIST_SAMPLING, seed=seed)

  samples = {}
  for name, d, constrain in [("model", draft, True), ("model_unconstrained", draft, False),
                             ("ngram", cd.NGramDrafter(max_ngram=2), True)]:
    outs = [o for seed in range(seeds) for o in run(d, constrain, seed)[0]]
    assert all(o.finished and not o.error for o in outs)
    samples[name] = collections.Counter(o.text for o in outs)
    pvalue = _chi_square_pvalue(samples[name], exact)
    assert pvalue > 1e-3, (name, pvalue, samples[name], exact)
  # The test has power: the draft's own distribution (what accepting every draft token
  # would give) is far from the target's and is rejected on the same samples.
  tv = 0.5 * sum(abs(exact[t] - draft_exact[t]) for t in language)
  assert tv > 0.1, tv
  assert _chi_square_pvalue(samples["model"], draft_exact) < 1e-6


def test_draft_equal_to_target_is_always_accepted(byte_models, byte_compiler):
  # The target as its own draft: greedy proposals are the target's argmax, so every
  # draft token is accepted. A draft cache that missed or attended a wrong entry after
  # a round would propose something else.
  target, _ = byte_models
  tables = byte_compiler.compile(cd.Regex(r"[a-z]{4,30}"))
  prompts = [_DIST_PROMPT, _DIST_PROMPT[:3], [ord(c) for c in "zzz"]]
  outs, stats = cd.generate_speculative(target, prompts, draft=target, num_draft_tokens=_K,
                                        constraint=tables, max_new_tokens=20)
  assert stats.accepted == stats.drafted and sum(stats.drafted) > 0
  assert outs == cd.generate(target, prompts, constraint=tables, max_new_tokens=20)


# ------------------------------------------------------- push-down (grammar) constraints

_NESTED = 'root ::= item+ "."\nitem ::= "a" | "(" item* ")"\n'


def _nested_ok(text: str) -> bool:
  """Whether `text` is in the language of `_NESTED` (an independent checker)."""
  if not text.endswith(".") or len(text) < 2:
    return False
  depth = 0
  for ch in text[:-1]:
    depth += {"(": 1, ")": -1, "a": 0}.get(ch, -10**6)
    if depth < 0:
      return False
  return depth == 0


def _nested_prefix_ok(text: str) -> bool:
  depth = 0
  for ch in text:
    depth += {"(": 1, ")": -1, "a": 0}.get(ch, -10**6)
    if depth < 0:
      return False
  return True


def test_speculative_with_a_pushdown_grammar(byte_models, byte_compiler):
  """Rewinding restores stacks: greedy speculative decoding equals plain decoding, and
  sampled outputs are in the grammar's language (or viable prefixes when cut off)."""
  target, draft = byte_models
  tables = byte_compiler.compile(cd.Grammar(_NESTED))
  assert tables.is_pushdown
  prompts = [_DIST_PROMPT, [ord(c) for c in "(("], [ord(c) for c in "a(a"]]
  plain = cd.generate(target, prompts, constraint=tables, max_new_tokens=20)
  for d, constrain in [(draft, True), (draft, False), (cd.NGramDrafter(max_ngram=2), True)]:
    outs, _ = cd.generate_speculative(target, prompts, draft=d, num_draft_tokens=_K,
                                      constraint=tables, constrain_draft=constrain,
                                      max_new_tokens=20)
    assert outs == plain
  for seed in range(3):
    outs, _ = cd.generate_speculative(target, prompts, draft=draft, num_draft_tokens=_K,
                                      constraint=tables, max_new_tokens=20,
                                      sampling=cd.SamplingConfig(temperature=1.5), seed=seed)
    for out in outs:
      assert not out.error
      # Cut off by max_new_tokens: a viable prefix (possibly complete, EOS not yet drawn).
      viable = _nested_ok(out.text) or _nested_prefix_ok(out.text)
      assert _nested_ok(out.text) if out.finished else viable, out.text
