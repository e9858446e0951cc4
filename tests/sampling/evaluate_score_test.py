"""evaluate(score=, answer_key=, row_ids=): JSON answers scored by their field, custom
scorers, and rows that sample as in the full run when evaluated on their own."""

import json
import re

import jax
import pytest

import constrained_decoding as cd
from constrained_decoding.sampling import _evaluate

_SCHEMA = {"type": "object", "properties": {"Final Answer": {"enum": ["A", "B", "C", "D"]}},
           "required": ["Final Answer"], "additionalProperties": False}
_PROMPTS = ["Q1", "Q2", "Q3", "Q4", "Q5", "Q6"]
_BUDGET = 24
# One device: sharding is evaluate_test's subject; here it would only add compile time.
_ONE = jax.devices()[:1]


@pytest.fixture(scope="module")
def tables(gemma_compiler):
  return gemma_compiler.compile(cd.JsonSchema(json.dumps(_SCHEMA), whitespace="compact"))


def _letter(text: str) -> str | None:
  """Independent of json: the letter after "Final Answer" in the text."""
  found = re.search(r'"Final Answer"\s*:\s*"([ABCD])"', text)
  return found and found.group(1)


_ANSWERS = ["A", "B", "C", "D", "A", None]


@pytest.fixture(scope="module")
def run(random_model, tables):
  kwargs = dict(answers=_ANSWERS, max_new_tokens=_BUDGET, batch_size=8, devices=_ONE,
                sampling=cd.SamplingConfig(temperature=1.0), seed=11)
  return {"key": cd.evaluate(random_model, _PROMPTS, tables, answer_key="Final Answer",
                             **kwargs),
          "spec": cd.evaluate(random_model, _PROMPTS, cd.JsonSchema(json.dumps(_SCHEMA), whitespace="compact"),
                              answer_key="Final Answer", **kwargs)}


def test_answer_key_scores_the_json_field(run):
  rows = run["key"].rows
  letters = [_letter(r.completion.text) for r in rows]
  assert sum(letter is not None for letter in letters) >= 4  # most rows finish
  assert [r.correct for r in rows] == [None if a is None else letter == a
                                       for letter, a in zip(letters, _ANSWERS)]
  # Scored as whole texts (the default), they would never equal a bare letter.
  assert not any(_evaluate.exact_match(r.completion, "B") for r in rows)
  assert len({r.completion.text for r in rows}) > 1  # sampled: the answers differ


def test_answer_key_uses_parsed_values_of_spec_rows(run):
  for with_spec, with_tables in zip(run["spec"].rows, run["key"].rows):
    assert with_spec.completion.text == with_tables.completion.text
    assert with_spec.correct == with_tables.correct
    if with_spec.completion.finished:
      assert isinstance(with_spec.completion.value, dict)


def test_custom_score_sees_completion_and_answer(random_model, tables, run):
  seen = []

  def score(completion, answer):
    seen.append((completion.text, answer))
    return answer in completion.text

  result = cd.evaluate(random_model, _PROMPTS, tables, answers=_ANSWERS, score=score,
                       max_new_tokens=_BUDGET, batch_size=8, devices=_ONE,
                       sampling=cd.SamplingConfig(temperature=1.0), seed=11)
  texts = [r.completion.text for r in run["key"].rows]
  assert seen == [(t, a) for t, a in zip(texts, _ANSWERS) if a is not None]
  assert [r.correct for r in result.rows] == [None if a is None else a in t
                                              for t, a in zip(texts, _ANSWERS)]


def test_row_ids_reproduce_the_rows_of_the_full_run(random_model, tables, run):
  rest = cd.evaluate(random_model, _PROMPTS[3:], tables, row_ids=[3, 4, 5],
                     max_new_tokens=_BUDGET, batch_size=8, devices=_ONE,
                     sampling=cd.SamplingConfig(temperature=1.0), seed=11)
  assert [r.completion for r in rest.rows] == [r.completion for r in run["key"].rows[3:]]


@pytest.mark.parametrize("kwargs, message", [
    (dict(score=lambda c, a: True, answer_key="x"), "Expected at most one"),
    (dict(row_ids=[0, 1]), r"row_ids has shape \(2,\)"),
    (dict(row_ids=[0, -1, 2, 3, 4, 5]), "non-negative"),
])
def test_bad_scoring_arguments_are_typed_errors(random_model, tables, kwargs, message):
  with pytest.raises(cd.DecodingArgumentError, match=message):
    cd.evaluate(random_model, _PROMPTS, tables, **kwargs)


@pytest.mark.parametrize("score, answer_key, message", [
    ("x", None, "score is a str. Expected a function"),
    (None, 3, "answer_key is 3. Expected a string"),
])
def test_mistyped_scoring_arguments_are_typed_errors(score, answer_key, message):
  # Called directly: under the tests' beartype hook `evaluate` would stop them first.
  with pytest.raises(cd.DecodingArgumentError, match=message):
    _evaluate._scorer(score, answer_key)  # pylint: disable=protected-access
