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
