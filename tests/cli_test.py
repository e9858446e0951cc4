"""The command line: stdout carries only completions; errors are clear, with exit code 2."""

import json
import subprocess
import sys

import pytest

from constrained_decoding import cli


def _run(*args):
  return subprocess.run([sys.executable, "-m", "constrained_decoding", *args],
                        capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_generate_choices_and_regex_with_the_default_model():
  out = _run("generate", "--prompt", "Q: Is the sky blue? A:", "--choices", " yes, no",
             "--max-new-tokens", "4")
  assert out.returncode == 0, out.stderr
  assert out.stdout in (" yes\n", " no\n")
  assert "model loaded" in out.stderr
  out = _run("generate", "--prompt", "The year the Berlin wall fell was ", "--regex",
             r"\d{4}", "--batch-size", "2", "--temperature", "1", "--no-stream",
             "--max-new-tokens", "6")
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert lines[::2] == ["--- row 0 ---", "--- row 1 ---"]  # batches print row headers
  assert all(len(l) == 4 and l.isdigit() for l in lines[1::2])


@pytest.mark.parametrize("args, message", [
    (["--regex", "(?=a)b"], r"UnsupportedRegexError: Regex '\(\?=a\)b' uses a lookahead at position 0"),
    (["--regex", "a(b"], r"RegexSyntaxError"),
    (["--choices", "a,,b"], r"has an empty choice"),
    (["--regex", "a", "--batch-size", "0"], r"--batch-size 0 is out of range"),
    (["--regex", "a", "--top-p", "2"], r"--top-p 2.0 is outside"),
])
def test_errors_go_to_stderr(args, message, capsys):
  code = cli.main(["generate", "--prompt", "x", *args])
  captured = capsys.readouterr()
  assert code == 2 and captured.out == ""
  assert __import__("re").search(message, captured.err), captured.err


def test_demo_prompt_examples_conform():
  from constrained_decoding import demo  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top

  answers = re.findall(r"Answer: (\{.*\})", demo.FEW_SHOT)
  assert len(answers) == 2
  for answer in answers:
    assert re.fullmatch(demo.ANSWER_REGEX, answer)
    assert json.loads(answer)["Final Answer"] in "ABCD"


def test_spec_flags_errors(tmp_path, capsys):
  bad_schema = tmp_path / "s.json"
  bad_schema.write_text('{"type": "array", "items": {}, "uniqueItems": true}')
  bad_grammar = tmp_path / "g.gbnf"
  bad_grammar.write_text('root ::= "a" (')
  cases = [
      (["--json-schema", str(tmp_path / "missing.json")], r"No such file"),
      (["--json-schema", str(bad_schema)], r"UnsupportedSchemaError"),
      (["--grammar", str(bad_grammar)], r"GrammarSyntaxError"),
      (["--dataclass", "json"], r"has no class name. Expected MODULE:NAME"),
      (["--dataclass", "no_such_module_xyz:A"], r"could not be imported"),
  ]
  for args, message in cases:
    code = cli.main(["generate", "--prompt", "x", *args])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "", args
    assert __import__("re").search(message, captured.err), (args, captured.err)


@pytest.mark.slow
def test_generate_json_schema_with_the_default_model(tmp_path):
  schema = tmp_path / "answer.json"
  schema.write_text('{"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, '
                    '"required": ["answer"], "additionalProperties": false}')
  out = _run("generate", "--prompt", "Is the sky blue? Answer in JSON: ", "--json-schema",
             str(schema), "--max-new-tokens", "16", "--no-stream")
  assert out.returncode == 0, out.stderr
  assert json.loads(out.stdout) in ({"answer": "yes"}, {"answer": "no"})
