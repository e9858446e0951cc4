"""`generate_stream`'s final `Completion` per row, and pydantic instances as values.

A tiny random-weight Gemma 3 over the byte vocabulary decodes; the oracles are
`generate` itself (a streamed row must end in exactly the `Completion` that `generate`
returns) and pydantic's own `model_validate_json`.
"""

import json
import logging
import typing

import pytest

import constrained_decoding as cd

pydantic = pytest.importorskip("pydantic")


class Answer(pydantic.BaseModel):
  answer: typing.Literal["A", "B", "C", "D"]
  score: int = pydantic.Field(ge=0, le=99)


class PickyAnswer(Answer):
  """Accepts no score at all: a validator its JSON Schema cannot express."""

  @pydantic.field_validator("score")
  @classmethod
  def _never(cls, value):
    raise ValueError(f"score {value} is never good enough")


_HOT = cd.SamplingConfig(temperature=1.5)


def test_pydantic_spec_gives_model_instances(byte_model):
  spec = cd.JsonSchema(Answer, strict_properties=True)
  assert spec.model is Answer and spec == cd.JsonSchema(Answer.model_json_schema(),
                                                        strict_properties=True)
  outs = cd.generate(byte_model, ["a", "b", "c", "d"], constraint=spec, max_new_tokens=40,
                     sampling=_HOT, seed=3)
  done = [o for o in outs if o.finished]
  assert done  # Not vacuous.
  for out in outs:
    assert not out.error
    if out.finished:
      assert isinstance(out.value, Answer)
      assert out.value == Answer.model_validate_json(out.text)
    else:
      assert out.value is None
  # A schema dict plus an explicit model does the same.
  by_dict = cd.JsonSchema(Answer.model_json_schema(), strict_properties=True, model=Answer)
  assert by_dict.parse(done[0].text) == done[0].value


def test_model_validators_that_reject_give_none_and_a_warning(byte_model, caplog):
  spec = cd.JsonSchema(PickyAnswer, strict_properties=True)
  with caplog.at_level(logging.WARNING, logger="constrained_decoding"):
    outs = cd.generate(byte_model, ["a", "b"], constraint=spec, max_new_tokens=40,
                       sampling=_HOT, seed=3)
  done = [o for o in outs if o.finished]
  assert done
  for out in done:
    assert out.value is None and not out.error
    Answer.model_validate_json(out.text)  # The schema's language: only the validator fails.
  assert "PickyAnswer rejects the generated JSON" in caplog.text
  assert "never good enough" in caplog.text


def test_pydantic_model_argument_errors():
  with pytest.raises(cd.SchemaError, match=r"model 3 is not a pydantic model class"):
    cd.JsonSchema({"type": "integer"}, model=3)


def test_stream_ends_each_row_with_generates_completion(byte_model):
  # Row 0 ends after 2 tokens, row 1 runs out of tokens, row 2 is parsed JSON.
  specs = [cd.Regex(r"ab"), cd.Regex(r"[a-z]{30}"), cd.JsonSchema(Answer, strict_properties=True)]
  prompts = ["x", "y", "z"]
  kwargs = dict(constraint=specs, max_new_tokens=20, sampling=_HOT, seed=4)
  whole = cd.generate(byte_model, prompts, **kwargs)
  assert whole[0].finished and not whole[1].finished
  items = list(cd.generate_stream(byte_model, prompts, chunk_size=3, **kwargs))
  finals = {}
  pieces = [b"", b"", b""]
  for k, (row, item) in enumerate(items):
    if isinstance(item, cd.Completion):
      assert row not in finals  # exactly one, after all of the row's bytes
      finals[row] = (k, item)
    else:
      assert row not in finals and isinstance(item, bytes)
      pieces[row] += item
  assert [finals[r][1] for r in range(3)] == whole
  assert [p.decode() for p in pieces] == [c.text for c in whole]
  assert finals[1][1].value is None and not finals[1][1].finished
  # Row 0's Completion comes as soon as it ends, before row 1's last bytes.
  last_of_row_1 = max(k for k, (row, item) in enumerate(items)
                      if row == 1 and isinstance(item, bytes))
  assert finals[0][0] < last_of_row_1
  if whole[2].finished:
    assert finals[2][1].value == Answer.model_validate_json(json.dumps(
        json.loads(whole[2].text)))
