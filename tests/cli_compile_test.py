"""`constrained-decoding compile ... -o FILE`: the saved tables equal a fresh compilation."""

import json

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import cli
from constrained_decoding import tables as tables_lib

_SCHEMA = {"type": "object", "properties": {"Final Answer": {"enum": ["A", "B", "C", "D"]}},
           "required": ["Final Answer"], "additionalProperties": False}
_GRAMMAR = 'root ::= "(" [a-z]+ ")"'


@pytest.mark.parametrize("flag, value, spec", [
    ("--regex", r"\d{3}", cd.Regex(r"\d{3}")),
    ("--json-schema", _SCHEMA, cd.JsonSchema(json.dumps(_SCHEMA))),
    ("--grammar", _GRAMMAR, cd.Grammar(_GRAMMAR)),
])
def test_compile_writes_the_tables_of_the_spec(flag, value, spec, gemma_compiler, gemma_vocab,
                                               tmp_path, capsys, monkeypatch):
  if flag != "--regex":  # These flags take a file.
    path = tmp_path / ("schema.json" if flag == "--json-schema" else "g.gbnf")
    path.write_text(json.dumps(value) if isinstance(value, dict) else value)
    value = str(path)
  out = tmp_path / "tables.cdt"
  # The session's copy of the default model's vocabulary, instead of reading it again.
  monkeypatch.setattr(cd.Vocabulary, "from_gguf", lambda path: gemma_vocab)
  assert cli.main(["compile", flag, value, "-o", str(out)]) == 0
  assert "wrote" in capsys.readouterr().err
  loaded = cd.load_tables(out, vocab=gemma_vocab)
  expected = gemma_compiler.compile(spec)
  for field in tables_lib._ARRAY_FIELDS:  # pylint: disable=protected-access
    np.testing.assert_array_equal(getattr(loaded, field),
                                  np.asarray(getattr(expected, field)), err_msg=field)
  assert cd.read_tables_header(out).description == spec.describe()


def test_compile_needs_a_constraint_and_an_output(tmp_path, capsys):
  with pytest.raises(SystemExit) as stop:
    cli.main(["compile", "-o", str(tmp_path / "t.cdt")])
  assert stop.value.code == 2
  assert "one of the arguments --regex" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    cli.main(["compile", "--regex", "a"])
  assert "-o/--output" in capsys.readouterr().err


def test_compile_reports_a_bad_regex_in_one_line(tmp_path, capsys):
  assert cli.main(["compile", "--regex", "a(b", "-o", str(tmp_path / "t.cdt")]) == 2
  assert "error: RegexSyntaxError" in capsys.readouterr().err
  assert not (tmp_path / "t.cdt").exists()



_LEXED_GRAMMAR = 'start: NAME ("," NAME)*\nNAME: /[a-z]+/\n%ignore " "\n'


def test_compile_saves_a_grammar_with_a_lexer(byte_compiler, byte_vocab, tmp_path, capsys,
                                              monkeypatch):
  (tmp_path / "g.lark").write_text(_LEXED_GRAMMAR)
  out = tmp_path / "tables.cdt"
  monkeypatch.setattr(cd.Vocabulary, "from_gguf", lambda path: byte_vocab)
  # The session's compiler (its memo holds what the command compiled).
  monkeypatch.setattr(cd, "Compiler", lambda vocab: byte_compiler)
  assert cli.main(["compile", "--grammar", str(tmp_path / "g.lark"), "--lexer", "-o",
                   str(out)]) == 0
  assert "wrote" in capsys.readouterr().err
  spec = cd.Grammar(_LEXED_GRAMMAR, syntax="lark", lexer=True)
  loaded, expected = cd.load_tables(out, vocab=byte_vocab), byte_compiler.compile(spec)
  assert isinstance(loaded, cd.LexedTables) and loaded.shape_key == expected.shape_key
  for field in ("state_outcomes", "set_bits", "state_small_tokens", "action", "goto_chain"):
    np.testing.assert_array_equal(getattr(loaded, field),
                                  np.asarray(getattr(expected, field)), err_msg=field)
  assert cd.read_tables_header(out).description == spec.describe()


def test_builtin_grammar_flag_names_the_builtin_spec(tmp_path):
  args = cli._parser().parse_args(  # pylint: disable=protected-access
      ["compile", "--builtin-grammar", "go", "-o", str(tmp_path / "t.cdt")])
  assert cli._spec(args, cd) == cd.Grammar.builtin("go")  # pylint: disable=protected-access


def test_lexer_needs_a_lark_grammar(tmp_path, capsys):
  (tmp_path / "g.gbnf").write_text(_GRAMMAR)
  assert cli.main(["compile", "--grammar", str(tmp_path / "g.gbnf"), "--lexer", "-o",
                   str(tmp_path / "t.cdt")]) == 2
  assert "--lexer applies to a Lark grammar only" in capsys.readouterr().err
