"""Grammars whose only recursion is a tail call push nothing: their tables still pack."""

import random
import re

import pytest

import constrained_decoding as cd
from constrained_decoding.testing import _reference


@pytest.mark.parametrize("grammar,pattern", [
    ('root ::= "x" ("y" | "z") root?', r"(x[yz])+"),
    ('root ::= "a" | "b" root', r"b*a"),
])
def test_tail_recursive_grammar_agrees_with_regex(byte_compiler, grammar, pattern):
  # Packing once failed here (IndexError in stack_needs: no push columns at all).
  tables = byte_compiler.compile(cd.Grammar(grammar))
  rng = random.Random(0)
  alphabet = sorted(set(re.sub(r"[^a-z]", "", grammar)))
  texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(8)))
           for _ in range(300)]
  texts += ["xy", "xyxz", "a", "bba"]
  for text in texts:
    expected = re.fullmatch(pattern, text) is not None
    assert _reference.reference_accepts(tables, list(text.encode())) == expected, text
