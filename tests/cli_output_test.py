"""`generate --output jsonl`, row separation in text output, and the --json-schema flags.

A stub model and stub `generate`/`generate_stream` stand in for decoding (decoding itself
is tested in tests/sampling/); the oracle for every output is `json.loads` of what the
CLI printed, compared with the completions the stubs returned.
"""

import dataclasses
import json

import pytest

import constrained_decoding as cd
from constrained_decoding import cli

# Row texts with newlines (a JSON grammar's whitespace can produce them).
_TEXTS = ['{\n  "a": 1\n}', '[\n"two"]', "12"]  # row 2: an integer cut off
_FINISHED = [True, True, False]


@dataclasses.dataclass
class _Point:
  x: int
  tags: tuple[str, ...]


class _FakeModel:
  """Stands in for Gemma3: the stubs below never call it."""


@pytest.fixture
def stub_decoding(monkeypatch):
  """`generate` returns fixed completions; `generate_stream` yields their bytes in pieces
  and then each row's Completion (row 1 ends first, as rows may end in any order)."""
  calls = []

  def fake_generate(model, prompts, *, constraint, **kwargs):
    calls.append(constraint)
    return [cd.Completion(token_ids=(k, k + 1), text=t, finished=f, error=False,
                          value=t if f else None)
            for k, (t, f) in enumerate(zip(_TEXTS[:len(prompts)], _FINISHED))]

  def fake_stream(model, prompts, **kwargs):
    completions = fake_generate(model, prompts, **kwargs)
    for row, completion in enumerate(completions):
      for k in range(0, len(completion.text), 2):
        yield row, completion.text[k:k + 2].encode()
    for row in sorted(range(len(completions)), key=lambda r: r != 1):
      yield row, completions[row]

  monkeypatch.setattr(cli, "_load_model", lambda path: _FakeModel())
  monkeypatch.setattr(cd, "generate", fake_generate)
  monkeypatch.setattr(cd, "generate_stream", fake_stream)
  return calls


def _generate(capsys, *args):
  code = cli.main(["generate", "--prompt", "x", *args])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


@pytest.mark.parametrize("stream", [False, True])
def test_jsonl_output_one_object_per_row(stream, capsys, stub_decoding):
  code, out, err = _generate(capsys, "--json", "--batch-size", "3", "--output", "jsonl",
                             *([] if stream else ["--no-stream"]))
  assert code == 0, err
  lines = [json.loads(line) for line in out.splitlines()]
  assert len(lines) == 3
  # Streamed, a row's line is printed when the row ends (row 1 first in the stub).
  assert [l["row"] for l in lines] == ([1, 0, 2] if stream else [0, 1, 2])
  for line in lines:
    row = line["row"]
    assert line["completion"] == _TEXTS[row] and line["finished"] == _FINISHED[row]
    assert line["token_ids"] == [row, row + 1] and line["constraint_error"] is False
    # --json values are the parsed JSON; an unfinished row has none.
    assert line["value"] == (json.loads(_TEXTS[row]) if _FINISHED[row] else None)


@pytest.mark.parametrize("stream", [False, True])
def test_text_output_separates_rows_that_contain_newlines(stream, capsys, stub_decoding):
  code, out, err = _generate(capsys, "--regex", "[a-z]+", "--batch-size", "3",
                             *([] if stream else ["--no-stream"]))
  assert code == 0, err
  assert out == "".join(f"--- row {i} ---\n{t}\n" for i, t in enumerate(_TEXTS))
  # A single row prints its text alone, as before.
  code, out, err = _generate(capsys, "--regex", "[a-z]+", *([] if stream else ["--no-stream"]))
  assert code == 0 and out == _TEXTS[0] + "\n"


@pytest.mark.parametrize("stream", [False, True])
def test_unfinished_streamed_row_is_not_reported_as_a_value(stream, capsys, stub_decoding):
  # Row 2's text "12" parses as JSON but was cut off by max_new_tokens (it might have
  # gone on to "123"): the final Completion's `finished` decides, not a parse attempt.
  code, _, err = _generate(capsys, "--json", "--batch-size", "3",
                           *([] if stream else ["--no-stream"]))
  assert code == 0, err
  assert "row 0 value: {'a': 1}" in err and "row 1 value: ['two']" in err
  assert "row 2 value: none (the row ran out of tokens" in err


def test_jsonable_values():
  value = {"p": _Point(3, ("a", "b")), "s": {1}}
  assert cli._jsonable(value) == {"p": {"x": 3, "tags": ["a", "b"]}, "s": [1]}  # pylint: disable=protected-access


def _spec(*args):
  return cli._spec(cli._parser().parse_args(["generate", "--prompt", "x", *args]), cd)  # pylint: disable=protected-access


def test_json_schema_flags(tmp_path):
  schema = tmp_path / "s.json"
  schema.write_text('{"type": "object", "properties": {"a": {"type": "integer"}}}')
  assert _spec("--json-schema", str(schema)) == cd.JsonSchema(schema.read_text())
  assert _spec("--json-schema", str(schema), "--strict-properties", "--whitespace",
               "single") == cd.JsonSchema(schema.read_text(), whitespace="single",
                                          strict_properties=True)
  # The flags change the language: a compiled check with the byte vocabulary.
  vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                         eos_ids=[256])
  strict = cd.JsonSchema(schema.read_text(), strict_properties=True, whitespace="single")
  loose = cd.JsonSchema(schema.read_text())
  compiler = cd.Compiler(vocab, cd.CompileOptions(cache_dir=str(tmp_path / "c")))
  accepts = lambda spec, text: _accepts(compiler.compile(spec), vocab, text)
  assert accepts(strict, '{"a": 1}') and not accepts(strict, '{"a":1}')
  assert not accepts(strict, '{"a": 1, "b": 2}')
  assert accepts(loose, '{"a":1,"b":2}')


def _accepts(tables, vocab, text: str) -> bool:
  """Whether the tables accept `text` spelled one byte per token (numpy reference walk)."""
  from constrained_decoding.testing import _reference  # pylint: disable=g-import-not-at-top

  del vocab  # one byte per token: token id == byte
  return _reference.reference_accepts(tables, list(text.encode()))


@pytest.mark.parametrize("args, message", [
    (["--regex", "a", "--strict-properties"], r"--strict-properties applies to --json-schema"),
    (["--json", "--whitespace", "single"], r"--whitespace applies to --json-schema only"),
])
def test_json_schema_flag_errors(args, message, capsys):
  code, out, err = _generate(capsys, *args)
  assert code == 2 and out == "" and message in err.replace("\\", "")
