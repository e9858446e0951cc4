"""evaluate(): rows sharded over the 8 host devices (conftest) give the single-device
results, each row following its own constraint; conformance figures add up.

The runs share shapes (tables, batch, token budget) so that few programs compile.
"""

import re

import jax
import pytest

import constrained_decoding as cd
from constrained_decoding import models

_PATTERNS = [
    r'\{"answer": "[ABCD]", "why": "[a-z ]{0,12}"\}',
    r"(yes|no)\.",
    r"\d{3}-\d{4}",
    r"[A-Z][a-z]{1,5}!",
    r"\d{30}",  # Gemma has no multi-digit tokens: 30 tokens, over the budget of 24
]
_PROMPTS = ["x", "The answer is", "Call", "1.2", "Colour:", "Q: why? A:", "a", "Yes or no?",
            "7", "Name", "{"]
_BUDGET = 24


def _patterns():
  return [_PATTERNS[i % len(_PATTERNS)] for i in range(len(_PROMPTS))]


@pytest.fixture(scope="module")
def row_tables(gemma_compiler):
  tables = [gemma_compiler.compile(cd.Regex(p)) for p in _PATTERNS]
  return [tables[i % len(tables)] for i in range(len(_PROMPTS))]


@pytest.fixture(scope="module")
def greedy_run(random_model, row_tables):
  """8 devices, greedy, one row per device per call; answers: row 0's text, then wrong."""
  reference = cd.generate(random_model, _PROMPTS, constraint=row_tables,
                          max_new_tokens=_BUDGET)
  answers = [f" {reference[0].text} ", "not it", None] + [None] * (len(_PROMPTS) - 3)
  batches = []
  result = cd.evaluate(random_model, _PROMPTS, row_tables, answers=answers,
                       max_new_tokens=_BUDGET, batch_size=3,
                       on_batch=lambda start, rows: batches.append((start, list(rows))))
  return reference, result, batches


def test_eight_host_devices():
  assert len(jax.devices()) == 8  # conftest's XLA_FLAGS; otherwise nothing is sharded


@pytest.mark.parametrize("sampling", [
    cd.SamplingConfig(),
    cd.SamplingConfig(temperature=1.0, jump_forward=4),
], ids=["greedy", "sampled_jump_forward"])
def test_sharded_matches_single_device(sampling, random_model, row_tables):
  # Different batching too: 3 calls of 4 rows on one device, 2 calls of 8 rows on 8.
  kwargs = dict(max_new_tokens=_BUDGET, sampling=sampling, seed=5)
  one = cd.evaluate(random_model, _PROMPTS, row_tables, devices=jax.devices()[:1],
                    batch_size=4, **kwargs)
  eight = cd.evaluate(random_model, _PROMPTS, row_tables, batch_size=8, **kwargs)
  assert one.devices == 1 and eight.devices == 8
  assert eight.rows == one.rows
  for pattern, row in zip(_patterns(), eight.rows):
    c = row.completion
    assert not c.error
    assert row.conforms == (c.finished and bool(re.fullmatch(pattern, c.text, re.ASCII)))
    if not c.finished:
      assert len(c.token_ids) == _BUDGET
  if not sampling.is_greedy:  # per-row keys: the rows really sample
    assert len({r.completion.text for r in eight.rows[:5]}) == 5


def test_greedy_matches_generate(greedy_run):
  reference, result, _ = greedy_run
  assert [r.completion for r in result.rows] == reference
  assert sum(r.conforms for r in result.rows) >= 6  # most rows finish: the test can fail


def test_summary_and_accuracy(greedy_run):
  _, result, _ = greedy_run
  rows = result.rows
  assert [r.correct for r in rows[:3]] == [True, False, None]
  assert all(r.correct is None for r in rows[3:])
  # "\d{30}" rows (4 and 9) cannot finish within the budget, so they do not conform.
  assert not rows[4].completion.finished and not rows[4].conforms and not rows[9].conforms
  summary = result.summary()
  n = len(_PROMPTS)
  assert summary["rows"] == n and summary["answered"] == 2 and summary["accuracy"] == 0.5
  assert summary["conformance"] == sum(r.conforms for r in rows) / n < 1
  assert summary["finished"] + summary["unfinished"] == n
  assert summary["finished"] == sum(r.completion.finished for r in rows)
  assert summary["constraint_errors"] == 0 and summary["devices"] == 8
  assert summary["model_calls"] >= 2 * 8  # two batches over 8 devices, >= 1 call each


def test_specs_compile_and_give_values(greedy_run, random_model):
  _, result, _ = greedy_run
  specs = [cd.Regex(p) for p in _patterns()]
  with_specs = cd.evaluate(random_model, _PROMPTS, specs, max_new_tokens=_BUDGET,
                           batch_size=8)
  for row, plain in zip(with_specs.rows, result.rows):
    c = row.completion
    assert (c.text, c.finished, row.conforms) == (plain.completion.text,
                                                  plain.completion.finished, plain.conforms)
    assert c.value == (c.text if c.finished else None)


def test_on_batch_reports_every_row_in_order(greedy_run):
  _, result, batches = greedy_run
  # batch_size 3 rounds up to 8 (one row per device): batches start at rows 0 and 8.
  assert [start for start, _ in batches] == [0, 8]
  assert [r for _, rows in batches for r in rows] == list(result.rows)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(prompts=[]), ValueError, r"Got no prompts"),
    (dict(max_new_tokens=0), ValueError, r"max_new_tokens 0 is out of range"),
    (dict(answers=["a"]), ValueError, r"Got 1 answers for 2 prompts"),
    (dict(batch_size=0), ValueError, r"batch_size 0 is below 1"),
    (dict(devices=[]), ValueError, r"empty device list"),
])
def test_errors(kwargs, error, message, random_model, gemma_compiler):
  args = dict(prompts=["a", "b"], constraints=gemma_compiler.compile(cd.Regex("a")))
  args.update(kwargs)
  with pytest.raises(error, match=message):
    cd.evaluate(random_model, **args)


def test_constraint_errors(random_model, gemma_compiler):
  a = gemma_compiler.compile(cd.Regex("a"))
  with pytest.raises(ValueError, match=r"Got 1 constraints for 2 prompts"):
    cd.evaluate(random_model, ["a", "b"], [a])
  with pytest.raises(ValueError, match=r"Constraint of prompt 0 stacks 2 constraints"):
    cd.evaluate(random_model, ["a"], [cd.stack_tables([a, a])])
  narrow_model = models.Gemma3.random(models.Gemma3Config.tiny(vocab_size=300),
                                      tokenizer=None, vocab=random_model.vocab, bos_id=2)
  with pytest.raises(ValueError, match=r"compiled for a vocabulary of 262144 tokens but the model has 300"):
    cd.evaluate(narrow_model, [[2, 5]], [a])
