"""The SQL grammar with a lexer (`grammars/sql_select_lexed.lark`) against SQLite's own
parser (the standard library's `sqlite3`): every text the tables accept, SQLite parses.

SQLite parses a statement before it resolves names, so `EXPLAIN <query>` on an empty
database fails with "syntax error" or "incomplete input" exactly when the text does not
parse, and with "no such table" (or column, function) when it does. Random derivations
of the grammar, rendered with random keyword case, spacing and literals, must be
accepted by both; random mutations of them must never be accepted by the tables alone.

Names include keywords SQLite also takes as names (`key`, `filter`); those it reserves
(`table`, `values`) the grammar lists as words no rule reaches, so they never read as a
NAME (the last test).
"""

import random
import sqlite3

import pytest

import constrained_decoding as cd
from constrained_decoding.constraints import _lexed_grammar
from constrained_decoding.constraints import _lr
from constrained_decoding.testing import random_derivation

_PATH = _lr.__file__.replace("_lr.py", "grammars/sql_select_lexed.lark")

# How a derivation renders each terminal that is not a literal.
_RENDER = {
    "NAME": ["a", "b", "price", "t", "x_1", "Users", "_tmp", "selected", "fromage", "key",
             "filter", "first", "replace", "tables", "Values2"],
    "NUMBER": ["1", "42", "007", "3.5", "1.", ".5", "2e3", "1.5E-2"],
    "INT": ["0", "1", "10"],
    "STRING": ["'hi'", "''", "'it''s'", "'a b'"],
    "COMPARE": ["=", "<>", "!=", "<=", ">=", "<", ">"],
    "OPERATOR": ["+", "-", "*", "/", "%"],
}
_SEPARATORS = [" ", " ", "  ", "\n", "\t "]


def _sqlite_parses(text: str) -> bool:
  """Whether SQLite parses `text` as one statement (names need not exist)."""
  try:
    sqlite3.connect(":memory:").execute("EXPLAIN " + text)
  except sqlite3.OperationalError as e:
    message = str(e)
    if "syntax error" in message or "incomplete input" in message or "unrecognized" in message:
      return False
    assert message.startswith("no such"), message  # Parsed; a name is unknown.
  except (sqlite3.ProgrammingError, sqlite3.Warning):  # Not one statement.
    return False
  return True


def _render(grammar, terminals, rng) -> str:
  literals = {d.name: d.literal for d in grammar.terminal_defs}
  parts = []
  for t in terminals:
    if t in _RENDER:
      parts.append(rng.choice(_RENDER[t]))
    else:  # Keywords are case-insensitive: any case.
      parts.append("".join(c.upper() if rng.random() < 0.5 else c.lower()
                           for c in literals[t]))
  return "".join(p + rng.choice(_SEPARATORS) for p in parts)


def _mutate(text: str, rng) -> str:
  i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
  kind = rng.randrange(3)
  if kind == 0:
    return text[:i] + text[j:]
  if kind == 1:
    return text[:i] + rng.choice(["(", ",", "a", "1", " ", "'", "OR ", "+", ".", ";",
                                  "AS ", "NULL", "*"]) + text[i:]
  return text[:i] + text[j:] + text[i:j]


@pytest.fixture(scope="module")
def sql():
  source = open(_PATH, encoding="utf-8").read()
  vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                         eos_ids=[256])
  reference = _lexed_grammar.LexedReference(_lexed_grammar.compile_lexed_grammar(source, vocab))

  def accepts(text: str) -> bool:
    row = reference.step(reference.start(), text.encode())
    return row is not None and reference.advance(row, 256) is not None

  return _lr.read_lark_rules(source), accepts


def test_derivations_parse_in_sqlite(sql):
  grammar, accepts = sql
  rng = random.Random(0)
  for _ in range(300):
    text = _render(grammar, random_derivation(grammar, rng), rng)
    assert accepts(text), text
    assert _sqlite_parses(text), text


def test_what_the_tables_accept_sqlite_parses(sql):
  grammar, accepts = sql
  rng = random.Random(1)
  kinds = {True: 0, False: 0}
  for _ in range(600):
    text = _mutate(_render(grammar, random_derivation(grammar, rng), rng), rng)
    ours = accepts(text)
    kinds[ours] += 1
    if ours:
      assert _sqlite_parses(text), text
  assert min(kinds.values()) >= 40, kinds  # Both verdicts, many of each.


@pytest.mark.parametrize("reserved, named", [
    ("SELECT table FROM t", "SELECT tablex FROM t"),
    ("SELECT a FROM values", "SELECT a FROM values_"),
    ("SELECT a AS in FROM t", "SELECT a AS inn FROM t"),
    ("SELECT a FROM t JOIN Union ON a = b", "SELECT a FROM t JOIN Unions ON a = b"),
])
def test_names_that_sqlite_reserves_are_refused(sql, reserved, named):
  _, accepts = sql
  assert not _sqlite_parses(reserved) and not accepts(reserved)
  assert _sqlite_parses(named) and accepts(named)  # One letter more: a name for both.
