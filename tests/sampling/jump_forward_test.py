"""Jump-forward decoding: forced tokens fed in one model call, outputs unchanged.

Two tiny random-weight Gemma 3 models: one over the byte vocabulary (every literal byte
is one token, so constraints force long runs) and one over the real Gemma 3 vocabulary
(where forced tokens are rare: a literal can be spelled many ways).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.models import _gemma3
from constrained_decoding.sampling import _generate
from constrained_decoding.sampling import _loop
from constrained_decoding.testing import _reference

_BYTE_PATTERNS = [
    r"abcdefgh",
    r'\{"x": [0-9]{1,3}, "name": "[a-z]{0,5}"\}',
    r"(yes|no)",
    r"abc(d|e)fghij",
    r"[0-9]{2,4}",
]


def _prompts(n):
  return ["xyz"[i % 3] + "!?"[i % 2] for i in range(n)]


def _forced_oracle(tables, state: int, eos_ids) -> int:
  """The forced token of a state (numpy, from the packed bits), or -1: the only allowed
  token, or the lowest end-of-sequence id if only those are allowed."""
  ids = set(np.nonzero(_reference.reference_allowed(tables, state))[0].tolist())
  others, ends = ids - set(eos_ids), ids & set(eos_ids)
  if len(others) == 1 and not ends:
    return others.pop()
  return min(ends) if ends and not others else -1


@pytest.mark.parametrize("vocab_name, pattern", [
    ("byte", r'\{"x": [0-9]{1,3}, "name": "[a-z]{0,5}"\}'),
    ("byte", r"abc(d|e)fghij"),
    ("gemma", r'\{"answer": "[ABCD]", "why": "[a-z ]{0,12}"\}'),
    ("gemma", r"(yes|no)\.|maybe"),
])
def test_forced_tokens_match_a_numpy_oracle(vocab_name, pattern, request):
  vocab = request.getfixturevalue(f"{vocab_name}_vocab")
  compiler = request.getfixturevalue(f"{vocab_name}_compiler")
  tables = compiler.compile(cd.Regex(pattern))
  states = np.arange(np.asarray(tables.accepting).shape[0], dtype=np.int32)  # padding too
  cstate = cd.init_state(tables, batch_size=len(states)).replace(state=jnp.asarray(states))
  got = np.asarray(jax.jit(cd.forced_tokens)(jax.device_put(tables), cstate))
  want = [_forced_oracle(tables, int(s), vocab.eos_ids) for s in states]
  assert got.tolist() == want
  assert (got >= 0).any() and (got < 0).any()  # both kinds occur: the test can fail
  # Stopped rows are never forced, though they allow exactly end of sequence.
  stopped = cstate.replace(done=jnp.ones(len(states), bool))
  assert (np.asarray(cd.forced_tokens(tables, stopped)) == -1).all()


def test_greedy_outputs_identical(byte_model, byte_compiler):
  tables = [byte_compiler.compile(cd.Regex(p)) for p in _BYTE_PATTERNS]
  prompts = _prompts(len(tables))
  plain = cd.generate(byte_model, prompts, constraint=tables, max_new_tokens=40)
  jumped = cd.generate(byte_model, prompts, constraint=tables, max_new_tokens=40,
                       sampling=cd.SamplingConfig(jump_forward=3))
  assert jumped == plain
  for pattern, out in zip(_BYTE_PATTERNS, jumped):
    assert out.finished and re.fullmatch(pattern, out.text), (pattern, out)


def _calls(model, prompts, tables, sampling, max_new_tokens):
  """(model calls of the decode loop, final state)."""
  tables, state, eos_ids = _generate._prepare(model, prompts, tables, None, max_new_tokens, 0)
  state = _generate._decode_until(model, tables, state, max_new_tokens, eos_ids, sampling)
  return int(state.calls), state


def test_model_calls_counted_exactly(byte_model, byte_compiler):
  # "abcdefgh" then end of sequence: 9 tokens, all forced (a is the only allowed start).
  # Jump 8: "a" (one call), then "bcdefgh" in one call; the forced end is never fed.
  # Jump 3: "a" + "bcd", "e" + "fgh", then the end of sequence: 2 + 2 + 1 calls.
  tables = byte_compiler.compile(cd.Regex("abcdefgh"))
  prompts = _prompts(5)
  assert _calls(byte_model, prompts, tables, cd.SamplingConfig(), 16)[0] == 9
  for jump, calls in [(8, 2), (3, 5)]:
    got, state = _calls(byte_model, prompts, tables, cd.SamplingConfig(jump_forward=jump), 16)
    assert got == calls, jump
    assert (np.asarray(state.lengths) == 9).all() and bool(state.done.all())


def test_token_budget_is_respected(byte_model, byte_compiler):
  tables = byte_compiler.compile(cd.Regex("abcdefgh"))
  for budget in (1, 3, 5, 9):
    plain = cd.generate(byte_model, _prompts(5), constraint=tables, max_new_tokens=budget)
    jumped = cd.generate(byte_model, _prompts(5), constraint=tables, max_new_tokens=budget,
                         sampling=cd.SamplingConfig(jump_forward=8))
    assert jumped == plain
    assert all(len(c.token_ids) == min(budget, 8) for c in jumped)
    assert all(c.finished == (budget == 9) for c in jumped)


def test_greedy_identical_on_the_gemma_vocabulary(random_model, gemma_compiler):
  patterns = [r'\{"answer": "[ABCD]", "why": "[a-z ]{0,12}"\}', r"(yes|no)\.",
              r"\d{3}-\d{4}", r"[A-Z][a-z]{1,5}!"]
  tables = [gemma_compiler.compile(cd.Regex(p)) for p in patterns]
  prompts = ["x", "The answer is", "Call", "1.2"]
  plain = cd.generate(random_model, prompts, constraint=tables, max_new_tokens=32)
  sampling = cd.SamplingConfig(jump_forward=True)
  jumped = cd.generate(random_model, prompts, constraint=tables, max_new_tokens=32,
                       sampling=sampling)
  assert jumped == plain
  for pattern, out in zip(patterns, jumped):
    assert not out.finished or re.fullmatch(pattern, out.text, re.ASCII), (pattern, out)
  # Gemma spells every byte two ways (a piece and a byte-fallback token), so only the
  # end of sequence (<eos> or <end_of_turn>, the same completion) is forced here.
  calls_plain = _calls(random_model, prompts, tables, cd.SamplingConfig(), 32)[0]
  calls_jump = _calls(random_model, prompts, tables, sampling, 32)[0]
  assert calls_jump < calls_plain


def test_sampled_outputs_conform_and_rows_stay_independent(byte_model, byte_compiler):
  tables = [byte_compiler.compile(cd.Regex(p)) for p in _BYTE_PATTERNS]
  sampling = cd.SamplingConfig(temperature=1.5, jump_forward=3)
  for seed in range(3):
    outs = cd.generate(byte_model, _prompts(len(tables)), constraint=tables,
                       max_new_tokens=40, sampling=sampling, seed=seed)
    for pattern, out in zip(_BYTE_PATTERNS, outs):
      assert not out.error and out.finished and re.fullmatch(pattern, out.text), (pattern, out)


def test_streaming_with_jump_forward_matches_generate(byte_model, byte_compiler):
  # With chunks of 2 tokens, "ab" (a sampled, b forced) takes row 0 to the chunk's limit
  # at a choice while row 1 ("z" then a choice) still decodes: row 0 must keep the
  # logits of its last call across the pause.
  patterns = [r"ab[c-k]{2}", r"z[c-k]{4}"] + _BYTE_PATTERNS[:3]
  tables = [byte_compiler.compile(cd.Regex(p)) for p in patterns]
  sampling = cd.SamplingConfig(jump_forward=3)
  whole = cd.generate(byte_model, _prompts(5), constraint=tables, max_new_tokens=40,
                      sampling=sampling)
  assert whole == cd.generate(byte_model, _prompts(5), constraint=tables, max_new_tokens=40)
  for chunk_size in (2, 3):
    pieces = [b"" for _ in whole]
    finals = [None for _ in whole]
    for row, item in cd.generate_stream(byte_model, _prompts(5), constraint=tables,
                                        max_new_tokens=40, sampling=sampling,
                                        chunk_size=chunk_size):
      if isinstance(item, cd.Completion):
        assert finals[row] is None  # one per row, after all of its bytes
        finals[row] = item
      else:
        assert finals[row] is None
        pieces[row] += item
    assert [p.decode() for p in pieces] == [c.text for c in whole], chunk_size
    assert finals == whole, chunk_size


def _exact_distribution(model, prompt, temperature):
  """P(output) for `a(b|c)de(f|g)h`, from one cache-free forward pass per output."""
  texts = [f"a{x}de{y}h" for x in "bc" for y in "fg"]
  tokens = jnp.asarray([prompt + list(t.encode()) for t in texts], jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape).astype(jnp.int32)
  cache = _gemma3.init_cache(model.config, batch_size=len(texts), cache_len=tokens.shape[1])
  forward = jax.jit(_gemma3.forward, static_argnums=1)
  logits = np.asarray(forward(model.params, model.config, tokens, positions, cache)[0],
                      np.float64)
  probs = {}
  for row, text in enumerate(texts):
    p = 1.0
    for offset, options in ((1, "bc"), (4, "fg")):  # choice after "a", after "a?de"
      scores = logits[row, len(prompt) + offset - 1, [ord(c) for c in options]] / temperature
      weights = np.exp(scores - scores.max())
      p *= weights[options.index(text[offset])] / weights.sum()
    probs[text] = p
  return probs


def test_sampling_distribution_is_unchanged(byte_model, byte_compiler):
  # a, d, e, h and end of sequence are forced; b|c and f|g are sampled. The empirical
  # distribution under jump-forward must match the exact constrained distribution.
  pattern = "a(b|c)de(f|g)h"
  tables = byte_compiler.compile(cd.Regex(pattern))
  prompt = [0, 7, 3]
  temperature = 3.0
  exact = _exact_distribution(byte_model, prompt, temperature)
  assert min(exact.values()) > 0.02  # every outcome is observable
  n = 2000
  outs = cd.generate(byte_model, [prompt] * n, constraint=tables, max_new_tokens=8,
                     sampling=cd.SamplingConfig(temperature=temperature, jump_forward=8),
                     seed=11)
  counts = {k: 0 for k in exact}
  for out in outs:
    counts[out.text] += 1
  for text, p in exact.items():
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(counts[text] / n - p) < 4.5 * sigma + 1e-3, (text, counts[text] / n, p)


def test_jump_forward_option_errors():
  assert cd.SamplingConfig(jump_forward=True).jump_forward == 8
  with pytest.raises(ValueError, match=r"jump_forward -1 is not a count"):
    cd.SamplingConfig(jump_forward=-1)


def test_jump_decode_loop_has_no_callbacks(byte_model, byte_compiler):
  tables = jax.device_put(byte_compiler.compile(cd.Regex(r"ab(c|d)+")))
  state = _generate._prepare(byte_model, [[0, 1]], tables, None, 8, 0)[1]
  args = (byte_model.params, tables, state, jnp.int32(8), jnp.array([256], jnp.int32),
          jnp.float32(0), jnp.float32(1))
  jaxpr = str(jax.make_jaxpr(lambda *a: _loop.decode(
      *a, network=byte_model.network, sampling=cd.SamplingConfig(jump_forward=3)))(*args))
  assert "callback" not in jaxpr
