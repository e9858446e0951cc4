"""The official JSON-Schema-Test-Suite through `cd.JsonSchema`, on the byte vocabulary.

One test per suite file (`draft2020-12/*.json`, `draft7/*.json`) from
`../shared/data/json-schema-test-suite` (relative to the repository; skipped when
absent). Each case's schema is compiled once with default options and the suite's
`remotes/` as `resources`; a typed `ConstraintError` (or the time budget) is a refusal,
fine, except that "accepts no JSON value" for a case with a valid instance is wrong;
any other exception is a crash. Every instance of a compiled case is then judged by
`benchmarks/json_schema_suite.py` (the numpy reference walk over each serialization of
the value; documented narrowings such as implied types are not wrong answers). A file
passes with 0 crashes and 0 wrong answers.
"""

import os
import sys

import pytest

import constrained_decoding as cd
from constrained_decoding.testing import TokenIndex

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # The judge lives in benchmarks/, shared with the benchmark.
from benchmarks import json_schema_suite as suite  # noqa: E402  # pylint: disable=g-import-not-at-top

# ---- Files with known wrong answers: remove an entry once its file passes. ----
# (strict: a file listed here that passes fails the run, so the list only shrinks.)
KNOWN_WRONG = {
    # "draft2020-12/example.json": "what is wrong, e.g. `not` accepts {} (#/not)",
}

SUITE_DIR = os.path.join(_REPO, "..", "shared", "data", "json-schema-test-suite")
FILES = suite.suite_files(SUITE_DIR)
REMOTES = suite.load_remotes(SUITE_DIR)  # refRemote.json's documents.
TIME_LIMIT_S = 10.0  # Per compile; past it a case counts as refused.


def _params():
  if not FILES:
    return [pytest.param(None, marks=pytest.mark.skip(
        reason=f"JSON-Schema-Test-Suite not found at {os.path.abspath(SUITE_DIR)}"))]
  return [pytest.param(name, id=name, marks=[pytest.mark.xfail(reason=KNOWN_WRONG[name],
                                                                 strict=True)]
                       if name in KNOWN_WRONG else []) for name in FILES]


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
  return cd.Compiler(suite.byte_vocab(), cd.CompileOptions(
      max_seconds=TIME_LIMIT_S, cache_dir=str(tmp_path_factory.mktemp("suite_cache"))))


@pytest.fixture(scope="module")
def speller():
  return suite.Speller(TokenIndex(suite.byte_vocab()))


def test_known_wrong_files_exist():
  missing = sorted(set(KNOWN_WRONG) - set(FILES))
  assert not FILES or not missing, f"KNOWN_WRONG names files the suite lacks: {missing}"


@pytest.mark.parametrize("name", _params())
def test_suite_file(name, compiler, speller):
  report = suite.run_file(compiler, speller, SUITE_DIR, name, time_limit=TIME_LIMIT_S,
                          resources=REMOTES)
  crashes = [f"{c['case']}: {c['error']}" for c in report["crashes"]]
  wrong = [f"{w['verdict']}: {w['case']} / {w['test']}: {w['text'][:100]}"
           for w in report["wrong"]]
  assert not crashes and not wrong, "\n".join(["crashes:", *crashes, "wrong:", *wrong])
