"""`generate --json` and `--grammar` for recursive grammars (push-down, no --max-depth).

No weights are loaded: constraints compile before the model loads, so a stub loader that
fails shows how far a command got, and a stub `generate` checks what the CLI prints.
(Decoding with push-down tables for real is covered by the sampling tests.)
"""

import json
import re

import pytest

import constrained_decoding as cd
from constrained_decoding import cli
from constrained_decoding import models

# Recursive and ambiguous at the first token: "(" starts both x and y.
_AMBIGUOUS = 'root ::= x | y\nx ::= "(" x ")" | "a"\ny ::= "(" y "]" | "a"\n'


@pytest.fixture
def no_weights(monkeypatch):
  """Loading the model fails with a marker error (exit 2), after the constraint compiled."""

  def refuse(path):
    raise OSError(f"test: no weights loaded from {path}")

  monkeypatch.setattr(models.Gemma3, "from_gguf", refuse)


def _generate(capsys, *args):
  code = cli.main(["generate", "--prompt", "x", *args])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def _spec(*args):
  return cli._spec(cli._parser().parse_args(["generate", "--prompt", "x", *args]), cd)  # pylint: disable=protected-access


def test_json_flag_is_the_builtin_json_grammar():
  assert _spec("--json") == cd.Grammar.builtin("json")
  assert _spec("--json", "--max-depth", "2") == cd.Grammar.builtin("json", max_depth=2)
  assert _spec("--regex", "a") == cd.Regex("a")


@pytest.mark.parametrize("args, stack", [
    (["--json"], True),                      # any JSON: push-down tables
    (["--json", "--max-depth", "2"], False),  # bounded: a regular constraint
])
def test_json_compiles_before_weights_load(args, stack, capsys, no_weights):
  code, out, err = _generate(capsys, *args)
  assert code == 2 and out == ""
  compiled = re.search(r"constraint compiled in [\d.]+ ms: (ConstraintTables\(.*\))", err)
  assert compiled, err
  assert ("stack_depth=" in compiled.group(1)) == stack, compiled.group(1)
  assert "OSError: test: no weights loaded" in err


def test_recursive_grammar_file_needs_no_max_depth(tmp_path, capsys, no_weights):
  grammar = tmp_path / "nested.gbnf"
  grammar.write_text('root ::= "(" root ")" | [a-z]+\n')
  code, out, err = _generate(capsys, "--grammar", str(grammar))
  assert code == 2 and out == ""
  assert re.search(r"constraint compiled in .*stack_depth=\d+", err), err
  assert "OSError: test: no weights loaded" in err


@pytest.mark.parametrize("args, message", [
    (["--regex", "a", "--max-depth", "3"], r"--max-depth 3 applies to --grammar and --json"),
    (["--json", "--max-depth", "-1"], r"Grammar max_depth -1 is invalid"),
    (["--grammar", "ambiguous.gbnf"], r"NondeterministicGrammarError: .*max_depth=N"),
])
def test_errors_exit_2_before_weights_load(args, message, tmp_path, capsys, no_weights):
  (tmp_path / "ambiguous.gbnf").write_text(_AMBIGUOUS)
  args = [str(tmp_path / a) if a.endswith(".gbnf") else a for a in args]
  code, out, err = _generate(capsys, *args)
  assert code == 2 and out == ""
  assert re.search(message, err), err
  assert "no weights loaded" not in err


def test_json_excludes_other_constraints(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["generate", "--prompt", "x", "--json", "--regex", "a"])
  assert exit_info.value.code == 2
  assert "not allowed with argument" in capsys.readouterr().err


class _FakeModel:
  """Stands in for Gemma3: the stub `generate` below never calls it."""


@pytest.mark.parametrize("stream", [False, True])
def test_json_values_are_logged_and_stdout_keeps_the_text(stream, capsys, monkeypatch):
  texts = ['{"a": [1, {"b": null}]}', '[true, "x"', ' 3.5e2 ']  # the 2nd is unfinished
  finished = [True, False, True]

  def fake_generate(model, prompts, *, constraint, **kwargs):
    assert isinstance(model, _FakeModel) and len(prompts) == 3
    assert constraint == cd.Grammar.builtin("json")
    return [cd.Completion(token_ids=(), text=t, finished=f, error=False,
                          value=t if f else None) for t, f in zip(texts, finished)]

  def fake_stream(model, prompts, **kwargs):
    for row, completion in enumerate(fake_generate(model, prompts, **kwargs)):
      for k in range(0, len(completion.text), 3):
        yield row, completion.text[k:k + 3].encode()
      yield row, completion

  monkeypatch.setattr(models.Gemma3, "from_gguf", lambda path: _FakeModel())
  monkeypatch.setattr(cd, "generate", fake_generate)
  monkeypatch.setattr(cd, "generate_stream", fake_stream)
  code, out, err = _generate(capsys, "--json", "--batch-size", "3",
                             *([] if stream else ["--no-stream"]))
  assert code == 0, err
  assert out == "".join(f"--- row {i} ---\n{t}\n" for i, t in enumerate(texts))
  assert f"row 0 value: {json.loads(texts[0])!r}" in err
  assert "row 1 value: none" in err
  assert f"row 2 value: {json.loads(texts[2])!r}" in err


@pytest.fixture(scope="module")
def tiny_model(gemma_vocab):
  """A random-weight Gemma 3 with the real vocabulary (decodes in seconds)."""
  from constrained_decoding.vocab._spm_from_gguf import sentencepiece_from_gguf  # pylint: disable=g-import-not-at-top

  tokenizer = sentencepiece_from_gguf(models.default_gguf_path())
  config = models.Gemma3Config.tiny(vocab_size=gemma_vocab.vocab_size)
  return models.Gemma3.random(config, tokenizer=tokenizer, vocab=gemma_vocab, bos_id=2, seed=3)


def test_recursive_grammar_decodes_on_the_stack(tmp_path, capsys, monkeypatch, tiny_model):
  grammar = tmp_path / "nested.gbnf"
  grammar.write_text('root ::= "(" ( root | [0-9] ) ")"\n')
  monkeypatch.setattr(models.Gemma3, "from_gguf", lambda path: tiny_model)
  code, out, err = _generate(capsys, "--grammar", str(grammar), "--batch-size", "8",
                             "--temperature", "1", "--max-new-tokens", "12", "--no-stream")
  assert code == 0, err
  lines = out.splitlines()[1::2]  # each row under a "--- row N ---" line
  assert out.splitlines()[::2] == [f"--- row {i} ---" for i in range(8)]
  assert len(lines) == 8
  depths = []
  for text in lines:  # Python re as the oracle: a prefix of "(" * n digit ")" * n
    m = re.fullmatch(r"(\(+)([0-9]?)(\)*)", text)
    assert m and len(m.group(3)) <= len(m.group(1)) and (m.group(2) or not m.group(3)), text
    if m.group(2) and len(m.group(3)) == len(m.group(1)):
      depths.append(len(m.group(1)))
  assert len(depths) >= 4 and max(depths) >= 2, lines  # rows finished, some nested


def test_json_streams_with_the_tiny_model(capsys, monkeypatch, tiny_model):
  monkeypatch.setattr(models.Gemma3, "from_gguf", lambda path: tiny_model)
  code, out, err = _generate(capsys, "--json", "--max-new-tokens", "6", "--temperature", "1")
  assert code == 0, err
  assert out.endswith("\n")
  text = out[:-1]  # JSON whitespace may hold newlines: one row, so all of it
  assert text.strip(), out
  logged = re.search(r"row 0 value: (.*)", err).group(1)
  if not logged.startswith("none"):  # finished: the value is the JSON of the text
    assert logged == repr(json.loads(text)), (text, logged)
