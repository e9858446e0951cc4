"""LR table sizes of the parser level of grammars with a lexer (issue 18, increment 2).

Prints, for the rule part of each grammar read over its terminals
(`constraints/_lr.py`): the method that succeeded (LALR(1), or canonical LR(1) merged where
conflict-free), states, terminals (with `$END`), nonterminals (with `$START`),
productions, table bytes (int32 as built; int16 as the device could store them) and the
build time; also the canonical LR(1) state count for comparison.

* SQL: `constraints/grammars/sql_select.lark` as it is (its `_S` separator terminal makes
  it non-LR(1): the conflict message is printed), and with `_S` removed, which is what a
  lexer allows (longest match separates words; NAME vs keywords is the lexer's job).
* Python: the subset sketched below (statements and expressions of function bodies,
  `_NEWLINE`, `_INDENT`, `_DEDENT` as terminals produced by the lexer's modes), written
  after Lark's own `python.lark` (LALR, operator precedence by stratification).

Run: `.venv/bin/python benchmarks/lr_tables.py` (about a second).
"""

import re
import time
from pathlib import Path

import numpy as np

from constrained_decoding import errors
from constrained_decoding.constraints import _lr

_ROOT = Path(__file__).resolve().parents[1]
_SQL = _ROOT / "constrained_decoding/constraints/grammars/sql_select.lark"

PYTHON_SUBSET = r"""
file_input: (_NEWLINE | stmt)*

?stmt: simple_stmt | compound_stmt
simple_stmt: small_stmt (";" small_stmt)* [";"] _NEWLINE
?small_stmt: expr_stmt | pass_stmt | break_stmt | continue_stmt | return_stmt | raise_stmt
           | yield_stmt | global_stmt | nonlocal_stmt | del_stmt | assert_stmt | import_stmt
expr_stmt: testlist_star_expr (annassign | augassign | ("=" (yield_expr | testlist_star_expr))*)
annassign: ":" test ["=" test]
augassign: AUGASSIGN (yield_expr | testlist)
pass_stmt: "pass"
break_stmt: "break"
continue_stmt: "continue"
return_stmt: "return" [testlist_star_expr]
yield_stmt: yield_expr
yield_expr: "yield" [testlist_star_expr | "from" test]
raise_stmt: "raise" [test ["from" test]]
global_stmt: "global" NAME ("," NAME)*
nonlocal_stmt: "nonlocal" NAME ("," NAME)*
del_stmt: "del" exprlist
assert_stmt: "assert" test ["," test]
import_stmt: "import" dotted_as_name ("," dotted_as_name)*
           | "from" (dots? dotted_name | dots) "import" ("*" | "(" import_as_names ")" | import_as_names)
dots: "."+
dotted_as_name: dotted_name ["as" NAME]
import_as_names: import_as_name ("," import_as_name)* [","]
import_as_name: NAME ["as" NAME]
dotted_name: NAME ("." NAME)*

?compound_stmt: if_stmt | while_stmt | for_stmt | try_stmt | with_stmt | funcdef | classdef
              | decorated | async_stmt
if_stmt: "if" namedexpr_test ":" suite ("elif" namedexpr_test ":" suite)* ["else" ":" suite]
while_stmt: "while" namedexpr_test ":" suite ["else" ":" suite]
for_stmt: "for" exprlist "in" testlist ":" suite ["else" ":" suite]
try_stmt: "try" ":" suite (except_clause ":" suite)+ ["else" ":" suite] ["finally" ":" suite]
        | "try" ":" suite "finally" ":" suite
except_clause: "except" [test ["as" NAME]]
with_stmt: "with" with_item ("," with_item)* ":" suite
with_item: test ["as" expr]
async_stmt: "async" (funcdef | with_stmt | for_stmt)
decorated: decorator+ (classdef | funcdef | async_stmt)
decorator: "@" namedexpr_test _NEWLINE
funcdef: "def" NAME "(" [parameters] ")" ["->" test] ":" suite
parameters: param ("," param)* [","]
param: NAME [":" test] ["=" test] | "*" [NAME [":" test]] | "**" NAME [":" test] | "/"
classdef: "class" NAME ["(" [arguments] ")"] ":" suite
suite: simple_stmt | _NEWLINE _INDENT stmt+ _DEDENT

?namedexpr_test: test | NAME ":=" test
?test: or_test ["if" or_test "else" test] | lambdef
lambdef: "lambda" [lambda_params] ":" test
lambda_params: lambda_param ("," lambda_param)* [","]
lambda_param: NAME ["=" test] | "*" [NAME] | "**" NAME
?or_test: or_test "or" and_test | and_test
?and_test: and_test "and" not_test | not_test
?not_test: "not" not_test | comparison
?comparison: comparison comp_op expr | expr
comp_op: "<" | ">" | "==" | ">=" | "<=" | "!=" | "in" | "not" "in" | "is" | "is" "not"
star_expr: "*" expr
?expr: expr "|" xor_expr | xor_expr
?xor_expr: xor_expr "^" and_expr | and_expr
?and_expr: and_expr "&" shift_expr | shift_expr
?shift_expr: shift_expr ("<<" | ">>") arith_expr | arith_expr
?arith_expr: arith_expr ("+" | "-") term | term
?term: term ("*" | "@" | "/" | "%" | "//") factor | factor
?factor: ("+" | "-" | "~") factor | power
?power: await_expr ["**" factor]
?await_expr: ["await"] atom_expr
?atom_expr: atom_expr "(" [arguments] ")" | atom_expr "[" subscriptlist "]"
          | atom_expr "." NAME | atom
?atom: "(" [yield_expr | testlist_comp] ")" | "[" [testlist_comp] "]"
     | "{" [dictorsetmaker] "}" | NAME | NUMBER | STRING+ | "..." | "None" | "True" | "False"
testlist_comp: (namedexpr_test | star_expr) (comp_for | ("," (namedexpr_test | star_expr))* [","])
subscriptlist: subscript ("," subscript)* [","]
subscript: test | [test] ":" [test] [":" [test]]
exprlist: (expr | star_expr) ("," (expr | star_expr))* [","]
testlist: test ("," test)* [","]
testlist_star_expr: (test | star_expr) ("," (test | star_expr))* [","]
dictorsetmaker: (key_value | "**" expr) (comp_for | ("," (key_value | "**" expr))* [","])
              | (test | star_expr) (comp_for | ("," (test | star_expr))* [","])
key_value: test ":" test
arguments: argument ("," argument)* [","]
argument: test [comp_for] | NAME "=" test | "*" test | "**" test
comp_for: ["async"] "for" exprlist "in" or_test [comp_iter]
?comp_iter: comp_for | comp_if
comp_if: "if" or_test [comp_iter]

NAME: /[^\W\d]\w*/
NUMBER: /[0-9][0-9_]*(\.[0-9_]*)?([eE][-+]?[0-9]+)?[jJ]?/
STRING: /[rbfuRBFU]{0,2}("([^"\\\n]|\\.)*"|'([^'\\\n]|\\.)*')/
AUGASSIGN: "+=" | "-=" | "*=" | "@=" | "/=" | "%=" | "&=" | "|=" | "^=" | "<<=" | ">>="
         | "**=" | "//="
COMMENT: /#[^\n]*/
%declare _NEWLINE _INDENT _DEDENT
%ignore /[\t \f]+/
%ignore COMMENT
"""


def _sql_without_separator(text: str) -> str:
  text = re.sub(r"^_S:.*$", "", text, flags=re.M)
  return re.sub(r"\b_S\b ?", "", text)


def report(name: str, text: str, start: str) -> None:
  grammar = _lr.read_lark_rules(text, start=start)
  began = time.perf_counter()
  try:
    tables = _lr.build_tables(grammar)
  except errors.NondeterministicGrammarError as e:
    print(f"{name}: {e}\n")
    return
  seconds = time.perf_counter() - began
  canonical = _lr.build_tables(grammar, method="lr1", resolve="shift")
  fits16 = tables.num_states + 1 < 2**15 and len(tables.productions) + 1 < 2**15
  bytes16 = (tables.action.size + tables.goto.size + 2 * tables.rule_len.size) * 2
  print(f"{name}: {tables.method}, {tables.num_states} states (canonical LR(1):"
        f" {canonical.num_states}), {len(tables.terminals)} terminals,"
        f" {len(tables.nonterminals)} nonterminals, {len(tables.productions)} productions;"
        f" action+goto+rule arrays {tables.nbytes:,} bytes as int32"
        f" ({bytes16:,} as int16{'' if fits16 else ': does not fit'}),"
        f" non-error actions {np.count_nonzero(tables.action):,} of {tables.action.size:,};"
        f" built in {seconds * 1000:.0f} ms\n")


def main() -> None:
  sql = _SQL.read_text()
  report("SQL (sql_select.lark as is)", sql, "start")
  report("SQL (without _S)", _sql_without_separator(sql), "start")
  report("Python subset", PYTHON_SUBSET, "file_input")
  report("python_lexed.lark (the runtime's Python)",
         (_SQL.parent / "python_lexed.lark").read_text(), "file_input")


if __name__ == "__main__":
  main()
