"""`cd.sampling.ConstrainedSamplerLoop` against a reproduction of gemma 3.3's loop shape.

gemma is not in the `test` extra (it imports TensorFlow through kauldron, ~1.9 GB), so
`gemma_sampler_test.py`, which runs gemma's real code, skips in CI. This file keeps the
adapter's own step under test everywhere: it loads `_gemma_sampler.py` against a small
stand-in for the three gemma modules it imports, copied in shape from gemma 3.3.0's
`gm/text/_sampler_loop.py` (a keyword-only `flax.struct` `SamplingState`, a frozen
`SamplerLoop` whose `_sample_loop` is a jitted `lax.while_loop` over `_sample_step`, end
tokens, post-processing that zeroes tokens after the end). The model is a random bigram
table. The stand-ins live only while the module is loaded; `sys.modules` is restored.
"""

import dataclasses
import functools
import importlib.util
import pathlib
import re
import sys
import types

import flax.struct
import jax
import jax.numpy as jnp
import pytest

import constrained_decoding as cd

FIRST_BYTE = 4  # token 4 + b is byte b; 0 PAD, 1 EOS, 2 BOS, 3 END_OF_TURN
VOCAB_SIZE = FIRST_BYTE + 256
END_TOKENS = (1, 3)


def _gemma_stand_in() -> dict[str, types.ModuleType]:
  """gemma.gm.text's `_sampler_loop` (shape of 3.3.0), `_sampler` and `_prefill`."""

  @flax.struct.dataclass(kw_only=True)
  class SamplingState:
    step: jax.Array
    done: jax.Array
    last_token: jax.Array
    last_token_pos: jax.Array
    predicted_tokens: jax.Array
    cache: dict
    rng: jax.Array
    init_cache_length: jax.Array
    full_attention_mask: jax.Array

    @property
    def attention_mask_for_step(self):
      cache_length = self.full_attention_mask.shape[-1]
      step_mask = jnp.arange(cache_length) < self.init_cache_length + self.step + 1
      return self.full_attention_mask * step_mask

  @dataclasses.dataclass(frozen=True, kw_only=True)
  class SamplerLoop:
    model: object
    end_tokens: tuple
    forbidden_tokens: tuple | None
    sampling: object
    cache_length: int
    special_tokens: object

    def sample(self, *, params, init_state, max_new_tokens, stream=False):
      assert not stream
      return self._sample_loop(params=params, state=init_state,
                               max_new_tokens=max_new_tokens)

    @functools.partial(jax.jit, static_argnames=("self",))
    def _sample_loop(self, *, params, state, max_new_tokens):
      step_fn = functools.partial(self._sample_step, params=params)

      def cond_fn(state):
        return (state.step < max_new_tokens) & ~jnp.all(state.done)

      state = jax.lax.while_loop(cond_fn, step_fn, state)
      tokens = state.predicted_tokens
      ended = jnp.isin(tokens, jnp.asarray(self.end_tokens))
      keep = jnp.cumsum(ended, axis=-1) - ended == 0
      return dataclasses.replace(state, predicted_tokens=tokens * keep)

    def _sample_step(self, state, *, params):  # replaced by the adapter
      raise NotImplementedError

  loop = types.ModuleType("gemma.gm.text._sampler_loop")
  loop.SamplingState, loop.SamplerLoop = SamplingState, SamplerLoop
  sampler = types.ModuleType("gemma.gm.text._sampler")

  @dataclasses.dataclass(frozen=True, kw_only=True)
  class Sampler:
    model: object = None

  sampler.Sampler = Sampler
  modules = {"gemma.gm.text._sampler_loop": loop, "gemma.gm.text._sampler": sampler,
             "gemma.gm.text._prefill": types.ModuleType("gemma.gm.text._prefill")}
  for name in ("gemma", "gemma.gm", "gemma.gm.text"):
    modules[name] = types.ModuleType(name)
  modules["gemma"].gm = modules["gemma.gm"]
  modules["gemma.gm"].text = modules["gemma.gm.text"]
  for name in ("_sampler_loop", "_sampler", "_prefill"):
    setattr(modules["gemma.gm.text"], name, modules[f"gemma.gm.text.{name}"])
  return modules


@pytest.fixture(scope="module")
def adapter():
  """`_gemma_sampler.py` loaded against the stand-in, under a private module name."""
  path = pathlib.Path(cd.__file__).parent / "sampling" / "_gemma_sampler.py"
  name = "_gemma_sampler_on_stand_in"
  saved = {n: sys.modules.get(n) for n in [*_gemma_stand_in(), name]}
  sys.modules.update(_gemma_stand_in())
  try:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
  finally:
    for n, old in saved.items():
      if old is None:
        sys.modules.pop(n, None)
      else:
        sys.modules[n] = old
  return module


@dataclasses.dataclass(frozen=True)
class _BigramModel:
  """`model.apply({'params': p}, tokens=[B, 1], ...)`: logits from a random table."""

  def apply(self, variables, *, tokens, cache, positions, attention_mask):
    del positions, attention_mask
    logits = variables["params"]["table"][tokens]  # B 1 V
    return types.SimpleNamespace(logits=logits, cache=cache)


@dataclasses.dataclass(frozen=True)
class _Random:
  temperature: float = 1.0

  def get_next_tokens(self, logits, rng):
    return jax.random.categorical(rng, logits / self.temperature, axis=-1)


@dataclasses.dataclass(frozen=True)
class _Greedy:

  def get_next_tokens(self, logits, rng):
    del rng
    return jnp.argmax(logits, axis=-1)


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
  vocab = cd.Vocabulary.from_token_bytes(
      [None] * FIRST_BYTE + [bytes([b]) for b in range(256)], eos_ids=END_TOKENS)
  return cd.Compiler(vocab, cd.CompileOptions(cache_dir=str(tmp_path_factory.mktemp("c"))))


PARAMS = {"table": jax.random.normal(jax.random.key(0), (VOCAB_SIZE, VOCAB_SIZE)) * 3}


def _run(adapter, tables, *, sampling, seed=0, batch=3, max_new_tokens=24,
         forbidden_tokens=None, constraint_ids=None, end_tokens=END_TOKENS):
  loop = adapter.ConstrainedSamplerLoop(
      model=_BigramModel(), end_tokens=end_tokens, forbidden_tokens=forbidden_tokens,
      sampling=sampling, cache_length=64, special_tokens=None)
  # What gemma's prefill hands the loop: the last prompt token, no token sampled yet.
  init = adapter._sampler_loop.SamplingState(  # pylint: disable=protected-access
      step=jnp.asarray(0), done=jnp.zeros((batch,), bool),
      last_token=jnp.full((batch,), FIRST_BYTE + ord(":"), jnp.int32),
      last_token_pos=jnp.full((batch,), 5, jnp.int32),
      predicted_tokens=jnp.zeros((batch, 32), jnp.int32), cache={"k": jnp.zeros((batch, 64))},
      rng=jax.random.key(seed), init_cache_length=jnp.asarray(5),
      full_attention_mask=jnp.ones((batch, 64), bool))
  state = loop.sample(params=PARAMS, init_state=loop.start(init, tables,
                                                           constraint_ids=constraint_ids),
                      max_new_tokens=jnp.asarray(max_new_tokens))
  texts = [bytes(t - FIRST_BYTE for t in row if t >= FIRST_BYTE).decode()
           for row in state.predicted_tokens.tolist()]
  return state, texts


DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"


@pytest.mark.parametrize("sampling", [_Greedy(), _Random(1.0), _Random(4.0)],
                         ids=["greedy", "t1", "t4"])
def test_every_row_matches_and_stops_at_an_end_token(adapter, compiler, sampling):
  tables = compiler.compile(cd.Regex(DATE))
  for seed in range(3):
    state, texts = _run(adapter, tables, sampling=sampling, seed=seed)
    assert all(re.fullmatch(DATE, t) for t in texts), (seed, texts)
    assert state.constraint.done.all() and state.done.all()
    for row in state.predicted_tokens.tolist():
      assert row[10] in END_TOKENS and set(row[11:]) == {0}
    assert int(state.step) == 11  # the loop ends once every row is done


def test_the_first_token_is_constrained(adapter, compiler):
  unconstrained = jnp.argmax(PARAMS["table"][FIRST_BYTE + ord(":")])
  assert int(unconstrained) != FIRST_BYTE + ord("Q")
  state, texts = _run(adapter, compiler.compile(cd.Regex(r"Q[a-z]{1,6}")),
                      sampling=_Greedy(), max_new_tokens=1)
  assert texts == ["Q"] * 3 and not state.constraint.done.any()


def test_greedy_takes_the_best_allowed_token(adapter, compiler):
  """The mask comes before `get_next_tokens` (not only the allowed_or_lowest guard)."""
  row = PARAMS["table"][FIRST_BYTE + ord(":")]
  best = chr(int(jnp.argmax(row[FIRST_BYTE + ord("a"):FIRST_BYTE + ord("z") + 1])) + ord("a"))
  assert best != "a"
  _, texts = _run(adapter, compiler.compile(cd.Regex(r"[a-z]")), sampling=_Greedy())
  assert texts == [best] * 3


def test_a_done_constraint_stops_its_row_without_an_end_token(adapter, tmp_path):
  # The constraint ends with id 3, which is not one of the loop's end tokens.
  vocab = cd.Vocabulary.from_token_bytes(
      [None] * FIRST_BYTE + [bytes([b]) for b in range(256)], eos_ids=[3])
  tables = cd.Compiler(vocab, cd.CompileOptions(cache_dir=str(tmp_path))).compile(
      cd.Regex(r"[0-9]{4}"))
  state, texts = _run(adapter, tables, sampling=_Random(), end_tokens=(1,))
  assert all(re.fullmatch(r"[0-9]{4}", t) for t in texts), texts
  assert state.done.all() and int(state.step) == 5


def test_forbidden_tokens_and_the_constraint_together(adapter, compiler):
  # Both digits forbidden, so the row is left with nothing: allowed_or_lowest picks 0.
  tables = compiler.compile(cd.Regex(r"[01]{3}"))
  forbidden = (FIRST_BYTE + ord("0"), FIRST_BYTE + ord("1"))
  state, texts = _run(adapter, tables, sampling=_Random(), forbidden_tokens=forbidden)
  assert texts == ["000"] * 3 and not state.constraint.error.any()


def test_per_row_constraints(adapter, compiler):
  regexes = [r"[0-9]{3}", r"[a-z]{4}", r"(ab)+c"]
  tables = cd.stack_tables([compiler.compile(cd.Regex(r)) for r in regexes])
  _, texts = _run(adapter, tables, sampling=_Random(), constraint_ids=jnp.arange(3))
  assert all(re.fullmatch(r, t) for r, t in zip(regexes, texts)), texts


def test_a_second_constraint_in_the_bucket_reuses_the_loop(adapter, compiler):
  a, b = (cd.stack_tables([compiler.compile(cd.Regex(r))], min_bucket=64)
          for r in (r"yes|no", r"Red|Orange|Yellow|Green|Blue|Indigo|Violet"))
  _run(adapter, a, sampling=_Random())
  loop = adapter.ConstrainedSamplerLoop._sample_loop  # pylint: disable=protected-access
  before = loop._cache_size()  # pylint: disable=protected-access
  _, texts = _run(adapter, b, sampling=_Random())
  assert all(re.fullmatch(r"Red|Orange|Yellow|Green|Blue|Indigo|Violet", t) for t in texts)
  assert loop._cache_size() == before  # pylint: disable=protected-access


def test_without_gemma_the_adapter_names_the_extra(monkeypatch):
  # gemma missing (None in sys.modules makes its import fail as if not installed).
  monkeypatch.setitem(sys.modules, "gemma", None)
  monkeypatch.delitem(sys.modules, "constrained_decoding.sampling._gemma_sampler",
                      raising=False)
  with pytest.raises(ImportError, match=(
      r"cd.sampling.ConstrainedSampler adapts DeepMind's gemma sampler, which is not "
      r"installed .*pip install -e '\.\[gemma\]'.*jax-constrained-decoding\[gemma\]")):
    cd.sampling.ConstrainedSampler  # pylint: disable=pointless-statement
