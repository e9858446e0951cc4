"""Budgets of the push-down path: each `CompileOptions` limit stops compilation with a
`CompileBudgetError` that names the grammar, the limit and the remedy."""

import pytest

import constrained_decoding as cd
from constrained_decoding import errors

ARITHMETIC = cd.Grammar.builtin("arithmetic")


@pytest.mark.parametrize("options, message", [
    (dict(max_states=3), r"Grammar\(.*\) needs \d+ automaton states\. Expected at most "
                         r"CompileOptions\.max_states=3\. Raise the budget"),
    (dict(max_edges=100), r"needs more than 100 token edges\. Expected at most "
                          r"CompileOptions\.max_edges=100\. Raise the budget or simplify"),
    (dict(max_table_bytes=1 << 16), r"needs \d+\.\d MiB of tables \(\d+ token edges\)\. "
                                    r"Expected at most CompileOptions\.max_table_bytes=65536"),
    (dict(max_seconds=0.0), r"exceeded its compile time budget during composition with "
                            r"the vocabulary\. Raise CompileOptions\.max_seconds"),
])
def test_pushdown_budget_errors(gemma_vocab, options, message):
  compiler = cd.Compiler(gemma_vocab, cd.CompileOptions(memoize=False, **options))
  with pytest.raises(errors.CompileBudgetError, match=message):
    compiler.compile(ARITHMETIC)


def test_default_budgets_compile_the_same_grammar(gemma_vocab):
  tables = cd.Compiler(gemma_vocab, cd.CompileOptions(memoize=False)).compile(ARITHMETIC)
  assert tables.is_pushdown
