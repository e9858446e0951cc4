"""generate(constraint=spec): specs compiled per vocabulary, and `Completion.value` parsed.

A random-weight tiny Gemma 3 with the real vocabulary samples at temperature > 1, so the
outputs are arbitrary members of each constraint's language; the oracles are `json`,
`jsonschema`, `re` and `parse_dataclass`.
"""

import dataclasses
import enum
import json
import re
import subprocess
import sys
import typing

import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding import _compiler
from constrained_decoding import models
from constrained_decoding.sampling import _generate

_SCHEMA = {"type": "object", "properties": {
    "answer": {"enum": ["A", "B", "C", "D"]},
    "score": {"type": "integer", "minimum": -5, "maximum": 250},
    "ok": {"type": "boolean"}},
    "required": ["answer", "score"], "additionalProperties": False}


class Color(enum.Enum):
  RED = "red"
  BLUE = "blue"


@dataclasses.dataclass
class Verdict:
  choice: typing.Literal["A", "B", "C"]
  sure: bool
  color: Color
  note: typing.Literal["x", "yz"] | None


@pytest.fixture(scope="module")
def random_model(gemma_vocab):
  from constrained_decoding.vocab._spm_from_gguf import sentencepiece_from_gguf  # pylint: disable=g-import-not-at-top

  tokenizer = sentencepiece_from_gguf(models.default_gguf_path())
  config = models.Gemma3Config.tiny(vocab_size=gemma_vocab.vocab_size)
  return models.Gemma3.random(config, tokenizer=tokenizer, vocab=gemma_vocab, bos_id=2, seed=5)


_HOT = cd.SamplingConfig(temperature=1.5)


def _finished(outs):
  return [o for o in outs if o.finished and not o.error]


def test_json_schema_value_is_the_parsed_document(random_model):
  spec = cd.JsonSchema(_SCHEMA)
  seen = 0
  for seed in range(3):
    outs = cd.generate(random_model, ["a", "{", "JSON:"], constraint=spec, max_new_tokens=24,
                       sampling=_HOT, seed=seed)
    for out in outs:
      assert not out.error
      if out.finished:
        assert out.value == json.loads(out.text)
        jsonschema.validate(out.value, _SCHEMA)
        seen += 1
      else:
        assert out.value is None
  assert seen  # Not vacuous: some rows finished.


def test_dataclass_value_is_an_instance(random_model):
  spec = cd.Dataclass(Verdict)
  outs = cd.generate(random_model, ["x", "y", "z", "w"], constraint=spec, max_new_tokens=64,
                     sampling=cd.SamplingConfig(temperature=1.0), seed=1)
  assert all(o.value is None for o in outs if not o.finished)
  done = _finished(outs)
  assert done
  for out in done:
    assert isinstance(out.value, Verdict)
    assert out.value == cd.parse_dataclass(Verdict, out.text)
    assert cd.format_dataclass(out.value) == out.text


def test_regex_grammar_and_json_values(random_model):
  regex = r"(yes|no), [0-9]{2}"
  grammar = cd.Grammar('root ::= "<" [a-c]{1,3} ">"')
  specs = [cd.Regex(regex), grammar, cd.Json(1)]
  outs = cd.generate(random_model, ["q", "r", "s"], constraint=specs, max_new_tokens=24,
                     sampling=_HOT, seed=2)
  regex_out, grammar_out, json_out = outs
  assert regex_out.finished and re.fullmatch(regex, regex_out.text)
  assert regex_out.value == regex_out.text
  assert grammar_out.finished and re.fullmatch(r"<[a-c]{1,3}>", grammar_out.text)
  assert grammar_out.value == grammar_out.text
  if json_out.finished:
    assert json_out.value == json.loads(json_out.text)
  else:
    assert json_out.value is None


def test_mixed_list_of_specs_and_tables(random_model):
  tables = _compiler.compiler_for(random_model.vocab).compile(cd.Regex(r"[0-9]{3}"))
  outs = cd.generate(random_model, ["a", "b"], constraint=[tables, cd.Regex(r"[a-z]{2}")],
                     max_new_tokens=8, sampling=_HOT, seed=0)
  assert outs[0].finished and re.fullmatch(r"[0-9]{3}", outs[0].text)
  assert outs[0].value is None  # Tables carry no spec to parse with.
  assert outs[1].finished and outs[1].value == outs[1].text
  assert re.fullmatch(r"[a-z]{2}", outs[1].value)


def test_unfinished_rows_have_no_value(random_model):
  [out] = cd.generate(random_model, "n", constraint=cd.JsonSchema({"type": "string"}),
                      max_new_tokens=1)
  assert not out.finished and out.value is None and out.text.startswith('"')


def test_unconstrained_and_tables_give_no_value(random_model):
  [free] = cd.generate(random_model, "hi", max_new_tokens=3)
  assert free.value is None
  tables = _compiler.compiler_for(random_model.vocab).compile(cd.Regex("ab"))
  [out] = cd.generate(random_model, "hi", constraint=tables, max_new_tokens=4)
  assert out.finished and out.text == "ab" and out.value is None


def test_spec_and_tables_decode_identically(random_model):
  spec = cd.Regex(r"[a-z ]{1,12}")
  tables = cd.Compiler(random_model.vocab).compile(spec)
  by_spec = cd.generate(random_model, ["p", "q"], constraint=spec, max_new_tokens=10, seed=4,
                        sampling=_HOT)
  by_tables = cd.generate(random_model, ["p", "q"], constraint=tables, max_new_tokens=10,
                          seed=4, sampling=_HOT)
  assert [o.token_ids for o in by_spec] == [o.token_ids for o in by_tables]


def test_stream_takes_a_spec(random_model):
  spec = cd.Regex(r"[0-9]{5}")
  [whole] = cd.generate(random_model, "n", constraint=spec, max_new_tokens=8)
  *pieces, (_, final) = cd.generate_stream(random_model, "n", constraint=spec,
                                           max_new_tokens=8, chunk_size=3)
  assert b"".join(p for _, p in pieces).decode() == whole.text and whole.value == whole.text
  assert final == whole


def test_compiler_is_shared_per_vocabulary(random_model, gemma_vocab):
  vocab_again = cd.Vocabulary.from_token_bytes(gemma_vocab.token_bytes,
                                               eos_ids=gemma_vocab.eos_ids,
                                               vocab_size=gemma_vocab.vocab_size)
  assert vocab_again is not random_model.vocab
  compiler = _compiler.compiler_for(random_model.vocab)
  assert _compiler.compiler_for(vocab_again) is compiler
  spec = cd.Regex(r"x+")
  assert compiler.compile(spec) is compiler.compile(cd.Regex(r"x+"))  # Memoized.


@dataclasses.dataclass(frozen=True)
class _BrokenSchema(cd.JsonSchema):
  """A spec whose parser fails, to reach the path a library bug would take."""

  def parse(self, text):
    raise ValueError("broken on purpose")


def test_a_finished_row_that_does_not_parse_is_reported(random_model):
  with pytest.raises(ValueError, match=r"Row 0 finished under JsonSchema\(.*\) but its "
                                       r"text '7' does not parse: broken on purpose.*bug"):
    cd.generate(random_model, "a", constraint=_BrokenSchema({"const": 7}), max_new_tokens=4)


def test_bad_constraint_message_names_specs(random_model):
  with pytest.raises(TypeError, match=r"constraint is a int. Expected ConstraintTables .*a spec"):
    cd.generate(random_model, "a", constraint=3)


def test_sampling_import_stays_free_of_pynini():
  code = ("import sys, constrained_decoding.sampling as s; "
          "print('pynini' in sys.modules, 'constrained_decoding._compiler' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["False", "False"]


def test_value_dispatch_without_a_model():
  assert _generate._value(cd.Regex("a"), "a", 0) == "a"
  assert _generate._value(cd.Json(1), "[1]", 0) == [1]
  assert _generate._value(cd.JsonSchema({"type": "number"}), "2.5", 0) == 2.5


@pytest.mark.parametrize("stream", [False, True])
def test_cli_logs_the_parsed_dataclass(stream, random_model, monkeypatch, capsys):
  from constrained_decoding import cli  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(models.Gemma3, "from_gguf",
                      classmethod(lambda cls, path=None, **kwargs: random_model))
  args = ["generate", "--prompt", "x", "--dataclass", f"{__name__}:Verdict",
          "--max-new-tokens", "64", "--temperature", "1", "--seed", "1", "--batch-size", "3"]
  assert cli.main(args + ([] if stream else ["--no-stream"])) == 0
  captured = capsys.readouterr()
  texts = re.split(r"--- row \d ---\n", captured.out)[1:]  # each row under its header
  texts = [t.removesuffix("\n") for t in texts]
  assert len(texts) == 3
  logged = re.findall(r"row (\d) value: (.*)", captured.err)
  assert [int(r) for r, _ in logged] == [0, 1, 2]
  for text, (_, value) in zip(texts, logged):
    try:
      expected = repr(cd.parse_dataclass(Verdict, text))
    except ValueError:  # Ran out of tokens.
      expected = "none (the row ran out of tokens before finishing)"
    assert value == expected
  assert any(value.startswith("Verdict(") for _, value in logged)
