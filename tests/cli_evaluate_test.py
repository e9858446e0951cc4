"""`constrained-decoding evaluate`: JSONL in, JSONL out, errors per line, exit codes.

The model is a tiny random-weight Gemma 3 with the real vocabulary, passed through the
CLI's `_load_model` hook; constraints compile for the real Gemma 3 vocabulary.
"""

import json
import re

import jsonschema
import lark
import pytest

from constrained_decoding import cli
from constrained_decoding import models

_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
           "additionalProperties": False}
_GRAMMAR = 'root ::= "(" [a-z]+ ")"'
_VALID = [
    {"prompt": "x", "regex": r"(yes|no)\.", "answer": "yes.", "id": "first"},
    {"prompt": "y", "choices": ["red", "green"], "answer": "green"},
    {"prompt": "z", "json_schema": _SCHEMA},
    {"prompt": "w", "grammar": _GRAMMAR},
    {"prompt": "v", "choices": "up,down", "id": 7},
]
# (input line, pattern of the error reported on its output line)
_INVALID = [
    ('{"prompt": "w", "regex": "a(b"}', r"^RegexSyntaxError: "),
    ("this is not JSON", r"^JSONDecodeError: "),
    ('{"prompt": "v"}', r"names 0 constraints \[\]. Expected exactly one of \['regex'"),
    ('{"prompt": "u", "regex": "a", "choices": "a,b"}', r"names 2 constraints"),
    ('{"prompt": "t", "regexp": "a"}', r"Unknown key 'regexp'"),
    ('{"prompt": 5, "regex": "a"}', r'"prompt" is 5. Expected a string'),
    ('{"prompt": "s", "choices": ["a", ""]}', r"not a list of non-empty strings"),
    ('["prompt", "regex"]', r"is a JSON list. Expected an object"),
    ('{"prompt": "r", "dataclass": "json"}', r"has no class name. Expected MODULE:NAME"),
]


@pytest.fixture(scope="module")
def tiny_model(gemma_vocab):
  from constrained_decoding.vocab._spm_from_gguf import sentencepiece_from_gguf  # pylint: disable=g-import-not-at-top

  tokenizer = sentencepiece_from_gguf(models.default_gguf_path())
  config = models.Gemma3Config.tiny(vocab_size=gemma_vocab.vocab_size)
  return models.Gemma3.random(config, tokenizer=tokenizer, vocab=gemma_vocab, bos_id=2, seed=3)


@pytest.fixture
def use_tiny_model(monkeypatch, tiny_model):
  monkeypatch.setattr(cli, "_load_model", lambda path: tiny_model)


def _conforms(record: dict, text: str) -> bool:
  """Independent oracles: Python re, jsonschema, lark."""
  if "regex" in record:
    return re.fullmatch(record["regex"], text, re.ASCII) is not None
  if "choices" in record:
    choices = record["choices"]
    return text in (choices.split(",") if isinstance(choices, str) else choices)
  if "json_schema" in record:
    try:
      jsonschema.validate(json.loads(text), record["json_schema"])
      return True
    except (ValueError, jsonschema.ValidationError):
      return False
  parser = lark.Lark('start: "(" /[a-z]+/ ")"')
  try:
    parser.parse(text)
    return True
  except lark.LarkError:
    return False


def _evaluate(tmp_path, lines, *extra):
  source = tmp_path / "in.jsonl"
  source.write_text("\n".join(lines) + "\n", encoding="utf-8")
  target = tmp_path / "out.jsonl"
  code = cli.main(["evaluate", "--input", str(source), "--output", str(target),
                   "--batch-size", "8", "--max-new-tokens", "16", *extra])
  out = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
  return code, out


def test_errors_are_reported_per_line(tmp_path, capsys, use_tiny_model):
  lines = [json.dumps(r) for r in _VALID[:2]] + [bad for bad, _ in _INVALID]
  lines += [""] + [json.dumps(r) for r in _VALID[2:]]  # a blank line is skipped
  code, out = _evaluate(tmp_path, lines)
  captured = capsys.readouterr()
  assert code == 1
  numbers = [k for k, text in enumerate(lines, start=1) if text]
  assert [o["line"] for o in out] == numbers
  by_line = dict(zip(numbers, out))
  for k, (_, message) in enumerate(_INVALID, start=3):
    assert by_line[k]["completion"] is None and re.search(message, by_line[k]["error"]), (
        k, by_line[k])
    assert f"in.jsonl:{k}: " in captured.err
  valid = [by_line[1], by_line[2]] + [by_line[k] for k in numbers[-3:]]
  for record, row in zip(_VALID, valid):
    assert row["error"] is None and not row["constraint_error"]
    assert row["id"] == record.get("id")
    assert row["conforms"] == (row["finished"] and _conforms(record, row["completion"])), row
    assert len(row["token_ids"]) <= 16
    if not row["finished"]:
      assert row["value"] is None
    elif "json_schema" in record:  # the parsed document; the other kinds' value is the text
      assert row["value"] == json.loads(row["completion"])
    else:
      assert row["value"] == row["completion"]
    if "answer" in record:
      assert row["correct"] == (row["completion"] == record["answer"])
    else:
      assert row["correct"] is None
  assert sum(row["conforms"] for row in valid) >= 3  # the test can fail
  summary = json.loads(captured.out)
  assert summary["lines"] == len(numbers) and summary["line_errors"] == len(_INVALID)
  assert summary["rows"] == len(_VALID)
  assert summary["conformance"] == sum(row["conforms"] for row in valid) / len(_VALID)
  # Error lines do not change the other lines' results.
  code, alone = _evaluate(tmp_path, [json.dumps(r) for r in _VALID], "--no-progress")
  captured = capsys.readouterr()
  assert code == 0
  strip = lambda row: {k: v for k, v in row.items() if k != "line"}
  assert [strip(r) for r in alone] == [strip(r) for r in valid]
  assert "evaluate:" not in captured.err  # --no-progress


def test_progress_bar_on_stderr(tmp_path, capsys, use_tiny_model):
  code, out = _evaluate(tmp_path, [json.dumps(_VALID[0])])
  captured = capsys.readouterr()
  assert code == 0 and len(out) == 1
  assert re.search(r"evaluate: 100%.*1/1", captured.err), captured.err


@pytest.mark.parametrize("args, message", [
    (["--input", "/no/such/file.jsonl"], r"No such file"),
    (["--batch-size", "0"], r"--batch-size 0 is out of range"),
    (["--max-new-tokens", "0"], r"--max-new-tokens 0 is out of range"),
    (["--jump-forward", "-2"], r"--jump-forward -2 is not a count"),
])
def test_job_errors_exit_2(args, message, tmp_path, capsys):
  source = tmp_path / "in.jsonl"
  source.write_text('{"prompt": "a", "regex": "a"}\n')
  argv = ["evaluate", "--input", str(source), "--output", str(tmp_path / "o.jsonl"), *args]
  assert cli.main(argv) == 2
  captured = capsys.readouterr()
  assert captured.out == "" and re.search(message, captured.err), captured.err


def test_empty_input_exits_2(tmp_path, capsys):
  source = tmp_path / "in.jsonl"
  source.write_text("\n\n")
  assert cli.main(["evaluate", "--input", str(source), "--output",
                   str(tmp_path / "o.jsonl")]) == 2
  assert "has no lines" in capsys.readouterr().err
