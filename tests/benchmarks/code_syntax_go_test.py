"""The Go part of `benchmarks/code_syntax.py`: the stubs, the cut and the judge.

Oracle: `gofmt -e` (the tests that run it are skipped when it is not on PATH). The cut
of the test data's real functions (`tests/data/go/`), each followed by the rest of its
file, must keep exactly the function.
"""

import glob
import os
import re
import shutil
import sys

import pytest

import constrained_decoding as cd
from constrained_decoding.constraints import _lexed_grammar

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)
from benchmarks import code_syntax as cs  # noqa: E402  # pylint: disable=g-import-not-at-top

_GOFMT = pytest.mark.skipif(shutil.which("gofmt") is None, reason="gofmt is not on PATH")
PROMPT = "package p\n\n// F doc.\nfunc F(x int) int {\n"


@pytest.mark.parametrize("completion, cut", [
    ("\treturn x\n}\n\nfunc G() {}\n", "\treturn x\n}"),
    ("\tif x > 0 {\n\t\treturn 1\n\t}\n\treturn 0\n}", "\tif x > 0 {\n\t\treturn 1\n\t}\n\treturn 0\n}"),
    # Braces in strings, runes, raw strings and comments do not count.
    ("\ts := \"}\" + `}` + string('}') // }\n\t/* } */\n\treturn len(s)\n}\nx",
     "\ts := \"}\" + `}` + string('}') // }\n\t/* } */\n\treturn len(s)\n}"),
    ("\ts := \"\\\"}\"\n}", "\ts := \"\\\"}\"\n}"),
    # Still open: all of it is kept.
    ("\treturn x +", None),
    ("\ts := \"}", None),
])
def test_cut_at_the_closing_brace(completion, cut):
  got = cs.go_find_cut(PROMPT, completion)
  assert (None if got is None else completion[:got]) == cut
  assert cs.go_cut_completion(PROMPT, completion) == (completion if cut is None
                                                      else cut + "\n")


def test_stubs_are_prefixes_of_the_grammar():
  stubs = cs.read_go_stubs()
  assert len(stubs) >= 50 and len({s["task_id"] for s in stubs}) == len(stubs)
  vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                         eos_ids=[256])
  arrays = _lexed_grammar.compile_lexed_grammar(
      open(cs.GO_GRAMMAR, encoding="utf-8").read(), vocab, start="source_file",
      semicolons=_lexed_grammar.Semicolons())
  ref = _lexed_grammar.LexedReference(arrays)
  for s in stubs:
    assert s["prompt"].endswith("{\n") and "// " in s["prompt"], s["task_id"]
    row = ref.step(ref.start(), s["prompt"].encode())
    assert row is not None, s["task_id"]
    row = ref.step(row, b"}\n")  # the empty body is valid Go syntax
    assert row is not None and ref.end_ok(row), s["task_id"]


@_GOFMT
def test_judge_and_error_kinds():
  for s in cs.read_go_stubs():
    assert cs.go_syntax_ok(s["prompt"], "}\n"), s["task_id"]
  assert cs.go_syntax_ok(PROMPT, "\treturn x\n}\n\nfunc G( {")  # cut before G
  assert not cs.go_syntax_ok(PROMPT, "\treturn x x\n}\n")
  assert cs.go_error_kind(PROMPT, "\treturn x\n}\n", "eos") is None
  assert cs.go_error_kind(PROMPT, "\treturn x +", "budget") == "truncated"
  assert cs.go_error_kind(PROMPT, "\treturn x x\n\treturn", "budget") == "syntax"
  assert cs.go_error_kind(PROMPT, "\treturn x +", "eos") == "syntax"
  assert cs.go_adds_code(PROMPT, "\treturn x\n}\n")
  assert not cs.go_adds_code(PROMPT, "\t// only a comment { }\n}\n")
  assert not cs.go_adds_code(PROMPT, "\treturn x x\n}\n")


@_GOFMT
def test_cut_of_real_functions_keeps_exactly_the_function():
  data = os.path.join(_REPO, "tests", "data", "go")
  checked = 0
  for path in sorted(glob.glob(os.path.join(data, "*.go"))):
    src = open(path, encoding="utf-8").read()
    for m in re.finditer(r"^func [^\n]*\{\n", src, re.M):
      prompt, rest = src[:m.end()], src[m.end():]
      cut = cs.go_cut_completion(prompt, rest)
      end = re.search(r"^\}\n", rest, re.M).end()  # gofmt'ed: the function's last line
      assert cut == rest[:end], (path, m.group(0))
      assert cs.go_syntax_ok(prompt, rest)
      checked += 1
  assert checked >= 35
