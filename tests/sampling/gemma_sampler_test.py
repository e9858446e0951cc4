"""`cd.sampling.ConstrainedSampler`: DeepMind gemma's own `Sampler`/`SamplerLoop`, constrained.

Runs gemma's real code (prefill, `lax.while_loop`, post-processing) around a tiny random
`gm.nn.Transformer` and a byte tokenizer, and checks every sampled row against an
independent oracle (`re.fullmatch`, `json.loads` + `jsonschema`). Skipped where gemma is
not installed (`pip install -e ".[gemma]"`).
"""

import dataclasses
import json
import pathlib
import re

import jax
import jax.numpy as jnp
import pytest

pytest.importorskip("gemma")
from gemma import gm  # noqa: E402  pylint: disable=g-import-not-at-top
import jsonschema  # noqa: E402  pylint: disable=g-import-not-at-top

import constrained_decoding as cd  # noqa: E402  pylint: disable=g-import-not-at-top

FIRST_BYTE = 4  # token 4 + b is byte b; 0-3 are the special tokens below
VOCAB_SIZE = FIRST_BYTE + 256


class _ByteSpecialTokens(gm.text.SpecialTokens):
  PAD = 0  # gemma pads prompts and zeroes tokens after the end with id 0
  EOS = 1
  BOS = 2
  END_OF_TURN = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class _ByteTokenizer(gm.text.Tokenizer):
  """gemma's tokenizer interface over bytes: no SentencePiece model to download."""

  path: str = ""
  special_tokens = _ByteSpecialTokens

  def encode(self, text, *, add_bos=False, add_eos=False):
    ids = [FIRST_BYTE + b for b in text.encode()]
    return [self.special_tokens.BOS] * add_bos + ids + [self.special_tokens.EOS] * add_eos

  def decode(self, ids):
    ids = [ids] if isinstance(ids, int) else list(jnp.asarray(ids).reshape(-1).tolist())
    return bytes(i - FIRST_BYTE for i in ids if i >= FIRST_BYTE).decode("utf-8", "replace")


@pytest.fixture(scope="module")
def vocab():
  # The constraint's end ids are the sampler's end tokens (EOS, <end_of_turn>).
  return cd.Vocabulary.from_token_bytes(
      [None] * FIRST_BYTE + [bytes([b]) for b in range(256)],
      eos_ids=[_ByteSpecialTokens.EOS, _ByteSpecialTokens.END_OF_TURN])


@pytest.fixture(scope="module")
def compiler(vocab, tmp_path_factory):
  return cd.Compiler(vocab, cd.CompileOptions(cache_dir=str(tmp_path_factory.mktemp("c"))))


@pytest.fixture(scope="module")
def model_and_params():
  config = gm.nn.config.TransformerConfig(
      num_embed=VOCAB_SIZE, embed_dim=32, hidden_dim=64, num_heads=2, head_dim=16,
      num_kv_heads=1, final_logit_softcap=None, use_post_attn_norm=True,
      use_post_ffw_norm=True, attention_types=(gm.nn.AttentionType.GLOBAL,) * 2)
  model = gm.nn.Transformer(config=config, dtype=jnp.float32)
  params = model.init(jax.random.key(0), tokens=jnp.zeros((1, 4), jnp.int32))["params"]
  return model, params


def _sampler(model_and_params, **kwargs):
  model, params = model_and_params
  return cd.sampling.ConstrainedSampler(
      model=model, params=params, tokenizer=_ByteTokenizer(), cache_length=96,
      max_out_length=48, pad_length=(16,), **kwargs)


PROMPTS = ["Order date:", "When?", "x"]
DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"


@pytest.mark.parametrize("sampling", [
    gm.text.Greedy(),
    gm.text.RandomSampling(temperature=1.0),
    gm.text.RandomSampling(temperature=3.0),
    gm.text.TopkSampling(k=5, temperature=2.0),
], ids=["greedy", "t1", "t3", "top5"])
def test_every_row_matches_the_regex(model_and_params, compiler, sampling):
  tables = compiler.compile(cd.Regex(DATE))
  sampler = _sampler(model_and_params, sampling=sampling)
  for seed in range(3):
    out = sampler.sample(PROMPTS, tables=tables, max_new_tokens=32, rng=seed,
                         return_state=True)
    for text in out.text:
      assert re.fullmatch(DATE, text), (seed, text)
    assert out.state.constraint.done.all() and not out.state.constraint.error.any()
    tokens = out.tokens.tolist()
    for row in tokens:  # the end token, then gemma's zeroes
      end = row.index(next(t for t in row if t in (1, 3)))
      assert end == len("2024-05-17")
      assert set(row[end + 1:]) <= {0}


def test_the_first_token_is_constrained(model_and_params, compiler):
  """gemma's prefill does not sample (its loop re-runs the last prompt token), so the
  first new token comes from the constrained step: here it can only be `Q`."""
  plain = gm.text.Sampler(
      model=model_and_params[0], params=model_and_params[1], tokenizer=_ByteTokenizer(),
      cache_length=96, max_out_length=48, pad_length=(16,))
  unconstrained = plain.sample(PROMPTS, max_new_tokens=1, return_state=True).tokens[:, 0]
  assert (unconstrained != FIRST_BYTE + ord("Q")).any()  # the model alone picks others
  tables = compiler.compile(cd.Regex(r"Q[a-z]{1,6}"))
  out = _sampler(model_and_params).sample(PROMPTS, tables=tables, max_new_tokens=1,
                                          return_state=True)
  assert out.tokens[:, 0].tolist() == [FIRST_BYTE + ord("Q")] * len(PROMPTS)
  assert out.text == ["Q"] * len(PROMPTS)


def test_end_tokens_stop_rows_and_the_loop(model_and_params, compiler):
  tables = compiler.compile(cd.Regex(r"yes|no"))
  out = _sampler(model_and_params, sampling=gm.text.RandomSampling()).sample(
      PROMPTS, tables=tables, max_new_tokens=40, rng=1, return_state=True)
  assert all(t in ("yes", "no") for t in out.text), out.text
  assert out.state.done.all()
  # The while loop ended when every row was done: at most "yes" + the end token.
  assert int(out.state.step) <= 4


def test_truncated_rows_are_prefixes_and_not_done(model_and_params, compiler):
  tables = compiler.compile(cd.Regex(r"[a-c]{20}"))
  out = _sampler(model_and_params, sampling=gm.text.RandomSampling()).sample(
      PROMPTS, tables=tables, max_new_tokens=8, rng=0, return_state=True)
  assert all(re.fullmatch(r"[a-c]{8}", t) for t in out.text), out.text
  assert not out.state.constraint.done.any() and not out.state.constraint.error.any()


def test_json_schema_rows_validate(model_and_params, compiler):
  schema = {"type": "object", "required": ["n", "ok"], "additionalProperties": False,
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                           "ok": {"type": "boolean"}}}
  spec = cd.JsonSchema(schema)
  tables = compiler.compile(spec)
  sampler = _sampler(model_and_params, sampling=gm.text.RandomSampling(temperature=2.0))
  for seed in range(2):
    out = sampler.sample(PROMPTS, tables=tables, max_new_tokens=48, rng=seed,
                         return_state=True)
    done = out.state.constraint.done.tolist()
    for text, finished in zip(out.text, done):
      if finished:
        jsonschema.validate(json.loads(text), schema)
    assert any(done)


def test_stacked_tables_one_constraint_per_row(model_and_params, compiler):
  regexes = [r"[0-9]{3}", r"[a-z]{4}", r"(ab)+c"]
  tables = cd.stack_tables([compiler.compile(cd.Regex(r)) for r in regexes])
  out = _sampler(model_and_params, sampling=gm.text.RandomSampling()).sample(
      PROMPTS, tables=tables, constraint_ids=jnp.arange(3), max_new_tokens=24, rng=2,
      return_state=True)
  for regex, text in zip(regexes, out.text):
    assert re.fullmatch(regex, text), (regex, text)


def test_a_second_constraint_reuses_the_compiled_loop(model_and_params, compiler):
  """The tables are traced state, not static configuration (gemma's forbidden_tokens):
  two constraints padded to one bucket run the same compiled loop."""
  sampler = _sampler(model_and_params, sampling=gm.text.RandomSampling())
  small, large = r"yes|no", r"Red|Orange|Yellow|Green|Blue|Indigo|Violet"
  a, b = (cd.stack_tables([compiler.compile(cd.Regex(r))], min_bucket=64)
          for r in (small, large))
  assert a.shape_key == b.shape_key
  sampler.sample(PROMPTS, tables=a, max_new_tokens=8, rng=0)
  loop = cd.sampling.ConstrainedSamplerLoop._sample_loop  # pylint: disable=protected-access
  before = loop._cache_size()  # pylint: disable=protected-access
  texts = sampler.sample(PROMPTS, tables=b, max_new_tokens=8, rng=0)
  assert all(re.fullmatch(large, t) for t in texts), texts
  assert loop._cache_size() == before  # pylint: disable=protected-access


def test_the_worked_example_in_docs_runs():
  """docs/gemma_sampler.md's worked example, run exactly as written."""
  doc = (pathlib.Path(__file__).parents[2] / "docs" / "gemma_sampler.md").read_text()
  code = doc.split("<!-- test: gemma-sampler -->\n```python\n", 1)[1].split("```", 1)[0]
  exec(compile(code, "docs/gemma_sampler.md", "exec"), {})  # pylint: disable=exec-used


def test_streaming_and_a_second_turn(model_and_params, compiler):
  """gemma's streaming loop and multi-turn state run the constrained step too."""
  tables = compiler.compile(cd.Regex(DATE))
  sampler = _sampler(model_and_params, sampling=gm.text.RandomSampling())
  pieces = list(sampler.sample("When?", tables=tables, max_new_tokens=20, stream=True, rng=3))
  first = sampler.sample("When?", tables=tables, max_new_tokens=20, rng=3, return_state=True)
  assert "".join(pieces) == first.text and re.fullmatch(DATE, first.text)
  second = sampler.sample("And again?", tables=tables, max_new_tokens=20, rng=4,
                          return_state=True, last_state=first.state)
  assert re.fullmatch(DATE, second.text) and bool(second.state.constraint.done.all())
