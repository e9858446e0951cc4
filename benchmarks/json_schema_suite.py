"""Conformance of `cd.JsonSchema` on the official JSON-Schema-Test-Suite.

Reads the suite from `../shared/data/json-schema-test-suite` (relative to the repository;
`--suite-dir` elsewhere; never copied into the project), files
`tests/{draft2020-12,draft7}/*.json` (with `--optional`, also `optional/*.json`). Each
file holds cases: a schema and tests, each a `data` instance and whether it is `valid`.

Per case, the schema is compiled with `cd.Compiler(vocab).compile(cd.JsonSchema(schema,
whitespace=..., resources=...))` under a time limit, `resources` holding every file of
the suite's `remotes/` folder as `http://localhost:1234/<path>` (where the suite says
to serve it; `refRemote.json` refers to them):
  compiled       tables were built;
  unsatisfiable  refused because the schema accepts no JSON value (`SchemaError`
                 "accepts no JSON value", `EmptyConstraintError`: `false`, `not: {}`,
                 ...) and the suite's instances are all invalid: the right answer,
                 counted apart from refusals. With a valid instance, each valid one
                 counts as `rejected_valid` (wrong) unless a documented narrowing
                 explains it (`implied type`: `{"contains": false}` is an array);
  refused        any other typed `cd.ConstraintError` (UnsupportedSchemaError,
                 SchemaError, CompileBudgetError, ...) or the time limit: a documented
                 "no";
  crashed        any other exception: a defect, recorded with its traceback's last line.
The suite's files carry no `$schema` where the folder names the draft, as a harness
is expected to tell its validator the dialect: draft-07 schemas without one get
`"$schema": "http://json-schema.org/draft-07/schema#"` (which `cd.JsonSchema` reads:
a `$ref` there overrides its siblings).

Each instance of a compiled case is serialized in the layouts the whitespace policy
admits (compact `json.dumps(separators=(",", ":"))` for the default `compact`, the
spaced `json.dumps` default for `single`, both for `flexible`), the first of them
canonical, then as other texts of the same JSON value (`serializations`: escapes,
`1.0` as `1`, `-2` as `-2.0`, members reordered), and each text tokenized canonically (the vocabulary's own tokenizer where
it has one: SentencePiece for Gemma; greedy longest match otherwise) and, with Gemma,
in `--random-tokenizations` random ways (`TokenIndex`). The numpy reference walk
(`reference_accepts`) then decides. Verdicts:
  ok                 valid and the canonical text accepted, or invalid and no text
                     accepted;
  narrowed           valid and rejected, but a documented narrowing explains it (not
                     wrong; each listed with its reason):
                       serialization: another text of the same value is accepted
                         (`1.0` written `1` for an integer, `-2` as `-2.0` for a float
                         `const`, escapes, members of a `const` object in its order,
                         members in schema order: a large object keeps it);
                       implied type: "a schema without `type` takes the types its
                         keywords apply to" (`{"minLength": 2}` rejects `12`), checked
                         with `jsonschema` on the schema with those types written out;
                       patternProperties keys: "undeclared keys are generated only
                         if they match its pattern", checked likewise;
                       format asserted / free-form depth: accepted once the schema is
                         compiled with `format` removed (an annotation in the spec) /
                         with `free_form_depth` as deep as the instance (not with
                         `--free-form-depth none`: there a deep value is no narrowing);
  rejected_valid     valid, rejected, and no narrowing explains it: wrong;
  accepted_invalid   invalid, and some serialization accepted: wrong;
  inconsistent       two tokenizations of one text disagree: wrong (a token-level bug).

  python benchmarks/json_schema_suite.py --vocab bytes   # about a minute
  python benchmarks/json_schema_suite.py                 # Gemma 3 vocabulary, minutes
  python benchmarks/json_schema_suite.py --vocab bytes --free-form-depth none

`--free-form-depth N|none` compiles with `JsonSchema(free_form_depth=...)` (default 2;
`none`: free-form values call one JSON rule on the device stack). Under any other
depth than 2, every case refused is compiled again at depth 2, and those that compile
there are listed as `only_at_depth_2` (what the other depth still gives up).

Writes `benchmarks/results/json_schema_suite.json` (per file counts, compile times,
every wrong answer, refusal and crash) and prints a table.
"""

import argparse
import collections
import dataclasses
import glob
import json
import os
import random
import re
import signal
import statistics
import sys
import time
import traceback

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # Run as a script from a checkout.

import constrained_decoding as cd  # noqa: E402
from constrained_decoding.testing import TokenIndex  # noqa: E402
from constrained_decoding.testing import reference_accepts  # noqa: E402

DEFAULT_SUITE_DIR = os.path.join(_REPO, "..", "shared", "data", "json-schema-test-suite")
REMOTES_URI = "http://localhost:1234/"  # Where the suite serves its `remotes/` folder.
DRAFTS = ("draft2020-12", "draft7")
WRONG_VERDICTS = ("rejected_valid", "accepted_invalid", "inconsistent")


class CaseTimeout(BaseException):
  """A compile ran past the per-case limit (a BaseException: library code that catches
  `Exception` must not swallow it)."""


# ---- Reading the suite. ----


def suite_files(suite_dir: str, drafts=DRAFTS, *, optional: bool = False) -> list[str]:
  """Paths of the suite's test files, relative to `suite_dir/tests` (e.g.
  `draft7/ref.json`), sorted; empty if the suite is absent."""
  root = os.path.join(suite_dir, "tests")
  names = []
  for draft in drafts:
    names += glob.glob(os.path.join(root, draft, "*.json"))
    if optional:
      names += glob.glob(os.path.join(root, draft, "optional", "*.json"))
  return sorted(os.path.relpath(n, root) for n in names)


_DIALECTS = {"draft7": "http://json-schema.org/draft-07/schema#"}


def load_cases(suite_dir: str, name: str) -> list[dict]:
  """The cases of one test file: dicts with `description`, `schema` and `tests`; the
  schemas of a draft-07 file declare their dialect (`$schema`) where they do not."""
  with open(os.path.join(suite_dir, "tests", name), encoding="utf-8") as f:
    cases = json.load(f)
  dialect = _DIALECTS.get(name.split("/")[0])
  for case in cases:
    if dialect and isinstance(case["schema"], dict) and "$schema" not in case["schema"]:
      case["schema"] = {"$schema": dialect, **case["schema"]}
  return cases


def load_remotes(suite_dir: str) -> dict:
  """The suite's `remotes/` files as `JsonSchema(resources=...)`: URI
  (`http://localhost:1234/<relative path>`) -> schema; empty if the folder is absent."""
  root = os.path.join(suite_dir, "remotes")
  out = {}
  for path in sorted(glob.glob(os.path.join(root, "**", "*.json"), recursive=True)):
    with open(path, encoding="utf-8") as f:
      out[REMOTES_URI + os.path.relpath(path, root).replace(os.sep, "/")] = json.load(f)
  return out


# ---- Serializing and tokenizing instances. ----


def integral_floats_as_ints(value):
  """`value` with every float that is a whole number written as an int (`1.0` -> `1`):
  the same JSON value, in the form our integers are generated."""
  if isinstance(value, float) and value.is_integer():
    return int(value)
  if isinstance(value, list):
    return [integral_floats_as_ints(v) for v in value]
  if isinstance(value, dict):
    return {k: integral_floats_as_ints(v) for k, v in value.items()}
  return value


def ints_as_floats(value):
  """`value` with every int written as a float (`-2` -> `-2.0`): the same JSON value,
  in the form `json.dumps` writes a float `enum` or `const`."""
  if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53:
    return float(value)
  if isinstance(value, list):
    return [ints_as_floats(v) for v in value]
  if isinstance(value, dict):
    return {k: ints_as_floats(v) for k, v in value.items()}
  return value


def keys_reversed(value):
  """`value` with the members of every object in reverse order (the same JSON value;
  a `const` object is generated only in its own key order)."""
  if isinstance(value, list):
    return [keys_reversed(v) for v in value]
  if isinstance(value, dict):
    return {k: keys_reversed(v) for k, v in reversed(value.items())}
  return value


def declared_orders(schema) -> list[list[str]]:
  """The member names of every `properties` object in `schema`, in declaration order."""
  out = []

  def visit(node):
    if isinstance(node, dict):
      if isinstance(node.get("properties"), dict) and node["properties"]:
        out.append(list(node["properties"]))
      for value in node.values():
        visit(value)
    elif isinstance(node, list):
      for value in node:
        visit(value)
  visit(schema)
  return out


def keys_in_schema_order(value, orders: list[list[str]]):
  """`value` with every object's members in schema order, undeclared members last (an
  object past `MAX_ANY_ORDER_SIZE` keeps schema order, additional properties last).

  An object's schema order: a greedy cover of its members by `properties` lists (the
  one declaring most of them, then the one declaring most of the rest, ...), taken in
  the order the schema writes them, as `allOf` and `$ref` siblings merge them.
  """
  if isinstance(value, list):
    return [keys_in_schema_order(v, orders) for v in value]
  if not isinstance(value, dict):
    return value
  left, chosen = set(value), set()
  while left:
    best = max(range(len(orders)), key=lambda i: len(left & set(orders[i])), default=None)
    if best is None or not left & set(orders[best]):
      break
    chosen.add(best)
    left -= set(orders[best])
  rank: dict[str, int] = {}
  for i in sorted(chosen):
    for name in orders[i]:
      rank.setdefault(name, len(rank))
  ordered = sorted(value, key=lambda k: rank.get(k, len(rank)))
  return {k: keys_in_schema_order(value[k], orders) for k in ordered}


def serializations(data, whitespace: str, schema=None) -> list[str]:
  """Distinct texts of the JSON value `data` that the whitespace policy admits, the
  canonical one first.

  Canonical: `json.dumps` compact (`compact`, `flexible`) or spaced (`single`), without
  `ensure_ascii`. Then with `ensure_ascii=True`, integral floats as ints, ints as
  floats, and objects' members in reverse order and (given the schema) in the order
  the schema declares them.
  """
  layouts = {"compact": [(",", ":")], "single": [(", ", ": ")],
             "flexible": [(",", ":"), (", ", ": ")]}[whitespace]
  texts = []
  for numbers in (data, integral_floats_as_ints(data), ints_as_floats(data)):
    orders = [numbers, keys_reversed(numbers)]
    if schema is not None:
      orders.append(keys_in_schema_order(numbers, declared_orders(schema)))
    for value in orders:
      for separators in layouts:
        for ascii_only in (False, True):
          text = json.dumps(value, separators=separators, ensure_ascii=ascii_only)
          if text not in texts:
            texts.append(text)
  return texts


@dataclasses.dataclass
class Speller:
  """Tokenizes texts for one vocabulary: canonically, and in random ways.

  Attributes:
    index: Bytes -> token ids of the vocabulary.
    encode: The vocabulary's own tokenizer (text -> ids), or None for greedy longest match.
    num_random: Random tokenizations per text besides the canonical one.
    rng: Source of the random tokenizations (seeded: runs repeat).
  """

  index: TokenIndex
  encode: object = None
  num_random: int = 0
  rng: random.Random = dataclasses.field(default_factory=lambda: random.Random(0))

  def __post_init__(self):
    self._bytes_of = {i: b for b, ids in self.index.by_bytes.items() for i in ids}

  def canonical(self, text: str) -> list[int]:
    """The tokenizer's ids for `text` when they spell it exactly (a control token such
    as `<start_of_turn>` in the text would not), else greedy longest match."""
    data = text.encode("utf-8")
    if self.encode is not None:
      ids = list(self.encode(text))
      if b"".join(self._bytes_of.get(i, b"\0\0no text") for i in ids) == data:
        return ids
    return self.index.longest_tokenization(data)

  def tokenizations(self, text: str) -> list[list[int]]:
    """The canonical tokenization first, then distinct random ones."""
    out = [self.canonical(text)]
    for _ in range(self.num_random):
      ids = self.index.random_tokenization(text.encode("utf-8"), self.rng)
      if ids not in out:
        out.append(ids)
    return out


def judge_instance(tables, data, valid: bool, speller: Speller, whitespace: str,
                   schema=None) -> dict:
  """The verdict on one instance from its serializations (see the module docstring):
  ok, narrowed (reason `serialization`), rejected_valid, accepted_invalid or
  inconsistent; and the texts accepted."""
  accepted = {}
  for text in serializations(data, whitespace, schema):
    answers = {reference_accepts(tables, ids) for ids in speller.tokenizations(text)}
    if len(answers) > 1:
      return {"verdict": "inconsistent", "text": text, "accepted": []}
    accepted[text] = answers.pop()
  canonical = next(iter(accepted))
  if valid:
    if accepted[canonical]:
      verdict = "ok"
    else:
      verdict = "narrowed" if any(accepted.values()) else "rejected_valid"
  else:
    verdict = "accepted_invalid" if any(accepted.values()) else "ok"
  return {"verdict": verdict, "accepted": [t for t, a in accepted.items() if a],
          "text": canonical, "reason": "serialization" if verdict == "narrowed" else None}


# ---- Documented narrowings that explain a rejected valid instance. ----

# Keyword -> the instance type it applies to. `_json_schema.py`'s docstring: "A schema
# without `type` takes the types its keywords apply to" (written out here, from the
# documentation, so that the measurement does not read the code it measures).
_TYPE_OF_KEYWORD = {
    **dict.fromkeys(("minLength", "maxLength", "pattern", "format"), "string"),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                     "multipleOf"), "number"),
    **dict.fromkeys(("properties", "required", "additionalProperties", "propertyNames",
                     "patternProperties", "unevaluatedProperties", "dependentRequired",
                     "dependentSchemas", "dependencies", "minProperties", "maxProperties"),
                    "object"),
    **dict.fromkeys(("items", "prefixItems", "additionalItems", "unevaluatedItems",
                     "contains", "minContains", "maxContains", "minItems", "maxItems",
                     "uniqueItems"), "array"),
}
# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_SCHEMA_KEYWORDS = ("items", "additionalItems", "additionalProperties", "not", "if", "then",
                    "else", "contains", "propertyNames", "unevaluatedItems",
                    "unevaluatedProperties")
_SCHEMA_LIST_KEYWORDS = ("items", "prefixItems", "allOf", "anyOf", "oneOf")
_SCHEMA_MAP_KEYWORDS = ("properties", "patternProperties", "$defs", "definitions",
                        "dependentSchemas", "dependencies")


def map_subschemas(schema, fn):
  """`schema` with `fn` applied to every schema object in it, innermost first."""
  if not isinstance(schema, dict):
    return schema
  out = dict(schema)
  for key, value in schema.items():
    if key in _SCHEMA_KEYWORDS and isinstance(value, dict):
      out[key] = map_subschemas(value, fn)
    elif key in _SCHEMA_LIST_KEYWORDS and isinstance(value, list):
      out[key] = [map_subschemas(v, fn) for v in value]
    elif key in _SCHEMA_MAP_KEYWORDS and isinstance(value, dict):
      out[key] = {k: map_subschemas(v, fn) for k, v in value.items()}
  return fn(out)


def with_implied_types(schema):
  """`schema` with the narrowing "a schema without `type` takes the types its keywords
  apply to" made explicit (`{"minLength": 2}` -> `{"minLength": 2, "type": "string"}`);
  schemas with `enum` or `const` are left alone."""
  def add_type(s: dict) -> dict:
    if "type" in s or "enum" in s or "const" in s:
      return s
    types = list(dict.fromkeys(_TYPE_OF_KEYWORD[k] for k in s if k in _TYPE_OF_KEYWORD))
    return {**s, "type": types} if types else s
  return map_subschemas(schema, add_type)


def without_unmatched_keys(schema):
  """`schema` with the narrowing "with `patternProperties`, undeclared keys are
  generated only if they match its pattern" made explicit (`additionalProperties:
  false` next to `patternProperties`), implied types too."""
  def forbid(s: dict) -> dict:
    return {**s, "additionalProperties": False} if "patternProperties" in s else s
  return map_subschemas(with_implied_types(schema), forbid)


def without_formats(schema):
  """`schema` with `format` as an annotation (removed), the implied type kept."""
  def drop(s: dict) -> dict:
    if "format" not in s:
      return s
    s = {k: v for k, v in s.items() if k != "format"}
    return s if "type" in s else {**s, "type": "string"}
  return map_subschemas(with_implied_types(schema), drop)


def nesting_depth(value) -> int:
  """Most containers enclosing one another in `value` (`[{"a": 1}]` has 2)."""
  if isinstance(value, dict):
    return 1 + max((nesting_depth(v) for v in value.values()), default=0)
  if isinstance(value, list):
    return 1 + max((nesting_depth(v) for v in value), default=0)
  return 0


class _EcmaPatterns:
  """`re` for `jsonschema`'s `pattern`/`patternProperties`, except that a pattern with an
  ECMAScript property escape (`\\p{Letter}`, which `re` cannot read) is searched with the
  `regex` package when it is installed (an oracle independent of ours)."""

  def search(self, pattern, text):
    if "\\p{" in pattern or "\\P{" in pattern:
      try:
        import regex  # pylint: disable=g-import-not-at-top
      except ImportError:
        pass
      else:
        return regex.search(pattern, text)
    return re.search(pattern, text)

  def __getattr__(self, name):
    return getattr(re, name)


def _validator(draft: str):
  """The `jsonschema` validator class of `draft4`, `draft7` or (else) draft 2020-12
  (patterns searched as `_EcmaPatterns` does)."""
  import jsonschema  # pylint: disable=g-import-not-at-top
  import jsonschema._keywords  # pylint: disable=g-import-not-at-top
  import jsonschema._utils  # pylint: disable=g-import-not-at-top
  for module in (jsonschema._keywords, jsonschema._utils):  # pylint: disable=protected-access
    if getattr(module, "re", None) is re:
      module.re = _EcmaPatterns()
  return {"draft4": jsonschema.Draft4Validator,
          "draft7": jsonschema.Draft7Validator}.get(draft, jsonschema.Draft202012Validator)


def registry(resources=None):
  """A `referencing.Registry` of `resources` (URI -> schema) for `jsonschema`."""
  import referencing  # pylint: disable=g-import-not-at-top
  import referencing.jsonschema  # pylint: disable=g-import-not-at-top
  return referencing.Registry().with_resources(
      (uri, referencing.Resource.from_contents(
          schema, default_specification=referencing.jsonschema.DRAFT202012))
      for uri, schema in (resources or {}).items())


def explain_rejection(compiler: cd.Compiler, schema, data, *, draft: str, whitespace: str,
                      speller: Speller, time_limit: float,
                      implied_types: bool = True, resources=None,
                      free_form_depth: int | None = 2) -> str | None:
  """Which documented narrowing makes a rejected valid instance rejected, or None.

  `implied type`: the instance is invalid (per `jsonschema`) once every untyped schema
  gets the types its keywords imply. `format asserted` / `free-form depth`: the
  instance is accepted when the schema is compiled with `format` as an annotation /
  with `free_form_depth` as deep as the instance (only where `free_form_depth`, the
  depth compiled, is a bound). Both at once: their names joined.
  """
  narrowings = [("patternProperties keys", without_unmatched_keys)]
  if implied_types:
    narrowings.insert(0, ("implied type", with_implied_types))
  for reason, narrowed in narrowings:
    try:
      if not _validator(draft)(narrowed(schema), registry=registry(resources)).is_valid(data):
        return reason
    except Exception:  # pylint: disable=broad-except  # jsonschema cannot read it.
      pass
  # Unbounded free-form values (None) have no depth to raise.
  depth = (free_form_depth if free_form_depth is None
           else max(nesting_depth(data), free_form_depth))
  tried = {(json.dumps(schema), free_form_depth)}  # As compiled: nothing turned off.
  for reason, variant, variant_depth in (
      ("format asserted", without_formats(schema), free_form_depth),
      ("free-form depth", schema, depth),
      ("format asserted, free-form depth", without_formats(schema), depth)):
    key = (json.dumps(variant), variant_depth)
    if key in tried:
      continue
    tried.add(key)
    result = compile_case(compiler, variant, whitespace=whitespace, time_limit=time_limit,
                          free_form_depth=variant_depth, implied_types=implied_types,
                          resources=resources)
    if result["status"] == "compiled" and judge_instance(
        result["tables"], data, True, speller, whitespace, variant)["verdict"] in ("ok", "narrowed"):
      return reason
  return None


# ---- Compiling. ----


def _on_alarm(signum, frame):
  del signum, frame
  raise CaseTimeout()


def compile_case(compiler: cd.Compiler, schema, *, whitespace: str, time_limit: float,
                 free_form_depth: int | None = 2, implied_types: bool = True,
                 resources=None, lenient=False, shared_definitions="inline") -> dict:
  """Compiles one schema: {"status": compiled|refused|crashed, "seconds", "tables",
  "error": "Class: first line", "empty": whether the refusal says that the schema
  accepts nothing}. The limit is `CompileOptions.max_seconds` inside the compiler and
  an alarm around the whole call (lowering included)."""
  start = time.perf_counter()
  status, tables, error, empty = "compiled", None, None, False
  previous = signal.signal(signal.SIGALRM, _on_alarm)
  signal.setitimer(signal.ITIMER_REAL, time_limit * 1.5 + 1)
  try:
    tables = compiler.compile(cd.JsonSchema(schema, whitespace=whitespace,
                                            free_form_depth=free_form_depth,
                                            implied_types=implied_types,
                                            resources=resources, lenient=lenient,
                                            shared_definitions=shared_definitions))
  except CaseTimeout:
    status, error = "refused", f"Timeout: compile ran past {time_limit * 1.5 + 1:.0f} s"
  except cd.ConstraintError as e:
    status, error = "refused", f"{type(e).__name__}: {_first_line(e)}"
    empty = isinstance(e, cd.EmptyConstraintError) or (
        isinstance(e, cd.SchemaError) and "accepts no JSON value" in str(e))
  except Exception as e:  # pylint: disable=broad-except
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    status, error = "crashed", f"{type(e).__name__}: {_first_line(e)}{where}"
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
  return {"status": status, "seconds": time.perf_counter() - start, "tables": tables,
          "error": error, "empty": empty}


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return text.splitlines()[0][:300] if text else ""


# ---- Running files. ----


def run_file(compiler: cd.Compiler, speller: Speller, suite_dir: str, name: str, *,
             whitespace: str = "compact", time_limit: float = 20.0,
             implied_types: bool = True, resources=None,
             free_form_depth: int | None = 2) -> dict:
  """Compiles and checks every case of one test file; returns its report."""
  report = {"file": name, "cases": 0, "compiled": 0, "unsatisfiable": 0, "refused": 0,
            "crashed": 0,
            "instances": 0, "ok": 0, "narrowed": 0, "rejected_valid": 0,
            "accepted_invalid": 0, "inconsistent": 0, "compile_seconds": [],
            "refusals": [], "crashes": [], "wrong": [], "narrowings": [],
            "only_at_depth_2": []}
  explain = dict(draft=name.split("/")[0], whitespace=whitespace, speller=speller,
                 time_limit=time_limit, implied_types=implied_types, resources=resources,
                 free_form_depth=free_form_depth)
  for case in load_cases(suite_dir, name):
    report["cases"] += 1
    result = compile_case(compiler, case["schema"], whitespace=whitespace,
                          time_limit=time_limit, implied_types=implied_types,
                          resources=resources, free_form_depth=free_form_depth)
    where = {"file": name, "case": case["description"]}
    if result["status"] == "refused" and result["empty"]:
      # "Accepts nothing": right if the suite agrees, else each valid instance is wrong.
      result["status"] = "unsatisfiable"
      for test in case["tests"]:
        report["instances"] += 1
        if not test["valid"]:
          report["ok"] += 1
          continue
        detail = {**where, "test": test["description"], "valid": True,
                  "data": test["data"], "text": json.dumps(test["data"]), "accepted": []}
        reason = explain_rejection(compiler, case["schema"], test["data"], **explain)
        if reason is not None:  # E.g. `{"contains": false}` of the implied type array.
          report["narrowed"] += 1
          report["narrowings"].append({**detail, "reason": reason})
          continue
        report["rejected_valid"] += 1
        report["wrong"].append({**detail, "verdict": "rejected_valid",
                                "schema": case["schema"], "error": result["error"]})
    report[result["status"]] += 1
    report["compile_seconds"].append(round(result["seconds"], 4))
    if result["status"] == "unsatisfiable":
      continue
    if result["status"] == "refused":
      # A refusal is no wrong answer, but one that claims the schema accepts nothing
      # while the suite lists valid instances deserves a look: `valid_tests`.
      report["refusals"].append({**where, "error": result["error"],
                                 "valid_tests": sum(t["valid"] for t in case["tests"])})
      if free_form_depth != 2 and compile_case(
          compiler, case["schema"], whitespace=whitespace, time_limit=time_limit,
          implied_types=implied_types, resources=resources)["status"] == "compiled":
        report["only_at_depth_2"].append({**where, "error": result["error"]})
      continue
    if result["status"] == "crashed":
      report["crashes"].append({**where, "error": result["error"], "schema": case["schema"]})
      continue
    for test in case["tests"]:
      report["instances"] += 1
      judged = judge_instance(result["tables"], test["data"], test["valid"], speller,
                              whitespace, case["schema"])
      if judged["verdict"] == "rejected_valid":
        reason = explain_rejection(compiler, case["schema"], test["data"], **explain)
        if reason is not None:
          judged = {**judged, "verdict": "narrowed", "reason": reason}
      report[judged["verdict"]] += 1
      detail = {**where, "test": test["description"], "valid": test["valid"],
                "data": test["data"], "text": judged["text"],
                "accepted": judged.get("accepted", [])}
      if judged["verdict"] in WRONG_VERDICTS:
        report["wrong"].append({**detail, "verdict": judged["verdict"],
                                "schema": case["schema"]})
      elif judged["verdict"] == "narrowed":
        report["narrowings"].append({**detail, "reason": judged["reason"]})
  return report


def num_wrong(report: dict) -> int:
  return sum(report[v] for v in WRONG_VERDICTS)


def percentiles(values: list[float]) -> dict:
  """p50, p90 and max of compile seconds (nearest rank)."""
  if not values:
    return {"p50": None, "p90": None, "max": None}
  ordered = sorted(values)
  rank = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
  return {"p50": statistics.median(ordered), "p90": rank(0.9), "max": ordered[-1]}


def markdown(reports: list[dict]) -> str:
  """One row per file and a total row."""
  head = ("| file | cases | compiled | unsatisfiable | refused | crashed | instances | ok |"
          " narrowed | wrong (acc. invalid / rej. valid / incons.) |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
  keys = ("cases", "compiled", "unsatisfiable", "refused", "crashed", "instances", "ok",
          "narrowed", "accepted_invalid", "rejected_valid", "inconsistent")
  total = {k: sum(r.get(k, 0) for r in reports) for k in keys}
  rows = []
  for r in reports + [{"file": "**total**", **total}]:
    rows.append(f"| {r['file']} | {r['cases']} | {r['compiled']} |"
                f" {r.get('unsatisfiable', 0)} | {r['refused']} |"
                f" {r['crashed']} | {r['instances']} | {r['ok']} | {r['narrowed']} |"
                f" {num_wrong(r)} ({r['accepted_invalid']} / {r['rejected_valid']} /"
                f" {r['inconsistent']}) |")
  return "\n".join([head] + rows)


# ---- Vocabularies. ----


def byte_vocab() -> cd.Vocabulary:
  """256 one-byte tokens and an end-of-sequence token (id 256)."""
  return cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                        eos_ids=[256])


def make_speller(name: str, num_random: int) -> tuple[cd.Vocabulary, Speller]:
  """(vocabulary, speller) for `bytes` or `gemma` (Gemma 3 from the packaged GGUF,
  tokenized canonically by its SentencePiece model)."""
  if name == "bytes":
    vocab = byte_vocab()
    return vocab, Speller(TokenIndex(vocab))  # One tokenization per text exists.
  try:
    from benchmarks import _gemma_vocab  # pylint: disable=g-import-not-at-top
  except ImportError:
    import _gemma_vocab  # pylint: disable=g-import-not-at-top
  from constrained_decoding.vocab._spm_from_gguf import sentencepiece_from_gguf  # pylint: disable=g-import-not-at-top

  path = _gemma_vocab.gemma_gguf_path()
  vocab = cd.Vocabulary.from_gguf(path)
  spm = sentencepiece_from_gguf(path)
  return vocab, Speller(TokenIndex(vocab), encode=spm.EncodeAsIds, num_random=num_random)


def free_form_depth_arg(text: str) -> int | None:
  """`--free-form-depth` value: a non-negative int or 'none'."""
  if text.lower() == "none":
    return None
  depth = int(text)
  if depth < 0:
    raise argparse.ArgumentTypeError(f"{text}: expected a non-negative int or 'none'")
  return depth


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--suite-dir", default=DEFAULT_SUITE_DIR)
  parser.add_argument("--vocab", choices=("gemma", "bytes"), default="gemma")
  parser.add_argument("--whitespace", choices=("compact", "single", "flexible"),
                      default="compact", help="JsonSchema whitespace policy (default compact)")
  parser.add_argument("--drafts", default=",".join(DRAFTS))
  parser.add_argument("--spec-types", action="store_true",
                      help="compile with implied_types=False (untyped schemas accept"
                           " every other type, as the specification says)")
  parser.add_argument("--files", default="",
                      help="comma-separated substrings: only files whose name has one")
  parser.add_argument("--optional", action="store_true", help="also the optional/ files")
  parser.add_argument("--time-limit", type=float, default=20.0,
                      help="seconds per compile (CompileOptions.max_seconds; default 20)")
  parser.add_argument("--random-tokenizations", type=int, default=2,
                      help="random tokenizations per text besides the canonical (gemma)")
  parser.add_argument("--free-form-depth", type=free_form_depth_arg, default=2,
                      help="JsonSchema(free_form_depth=...): an int, or 'none' for calls to"
                      " one JSON rule on the device stack (push-down tables; default 2)")
  parser.add_argument("--cache-dir", default=cd.CompileOptions().cache_dir,
                      help="the compiler's per-vocabulary cache (default: the user's)")
  parser.add_argument("--out", default=None, help="default: benchmarks/results/"
                      "json_schema_suite.json (gemma), json_schema_suite_bytes.json (bytes)")
  args = parser.parse_args(argv)
  if args.out is None:
    suffix = "" if args.vocab == "gemma" else f"_{args.vocab}"
    if args.free_form_depth != 2:
      suffix += f"_free_form_{args.free_form_depth}".lower()
    args.out = os.path.join(_REPO, "benchmarks", "results", f"json_schema_suite{suffix}.json")
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  names = suite_files(args.suite_dir, args.drafts.split(","), optional=args.optional)
  if args.files:
    names = [n for n in names if any(s in n for s in args.files.split(","))]
  if not names:
    print(f"JSON-Schema-Test-Suite not found under {os.path.abspath(args.suite_dir)}"
          " (expected tests/<draft>/*.json); nothing to run. Pass --suite-dir.")
    return 0
  vocab, speller = make_speller(args.vocab, args.random_tokenizations)
  compiler = cd.Compiler(vocab, cd.CompileOptions(max_seconds=args.time_limit,
                                                  cache_dir=args.cache_dir))
  remotes = load_remotes(args.suite_dir)
  start, load_start = time.time(), os.getloadavg()
  reports = []
  for name in names:
    report = run_file(compiler, speller, args.suite_dir, name, whitespace=args.whitespace,
                      time_limit=args.time_limit, implied_types=not args.spec_types,
                      resources=remotes, free_form_depth=args.free_form_depth)
    reports.append(report)
    print(f"{name}: {report['compiled']}/{report['cases']} compiled,"
          f" {report['unsatisfiable']} unsatisfiable, {report['crashed']}"
          f" crashed, {num_wrong(report)} wrong of {report['instances']}", flush=True)
  seconds = [s for r in reports for s in r["compile_seconds"]]
  times = percentiles(seconds)
  print()
  print(markdown(reports))
  print(f"\ncompile seconds per case: p50 {times['p50']:.3f}, p90 {times['p90']:.3f},"
        f" max {times['max']:.3f} ({len(seconds)} cases)")
  wrong = [w for r in reports for w in r["wrong"]]
  crashes = [c for r in reports for c in r["crashes"]]
  reasons = collections.Counter(n["reason"] for r in reports for n in r["narrowings"])
  print(f"narrowed, by reason: {dict(reasons)}")
  for w in wrong:
    print(f"WRONG {w['verdict']}: {w['file']} / {w['case']} / {w['test']}: {w['text'][:80]}")
  for c in crashes:
    print(f"CRASH {c['file']} / {c['case']}: {c['error']}")
  only_at_2 = [o for r in reports for o in r["only_at_depth_2"]]
  if args.free_form_depth != 2:
    print(f"only at free_form_depth=2: {len(only_at_2)} cases")
    for o in only_at_2:
      print(f"ONLY AT 2 {o['file']} / {o['case']}: {o['error'][:120]}")
  meta = {"vocab": args.vocab, "vocab_size": vocab.vocab_size, "whitespace": args.whitespace,
          "implied_types": not args.spec_types, "free_form_depth": args.free_form_depth,
          "time_limit_s": args.time_limit, "random_tokenizations": speller.num_random,
          "suite_dir": os.path.abspath(args.suite_dir), "optional": args.optional,
          "remotes": len(remotes),
          "wall_s": time.time() - start, "load_average_start": load_start,
          "load_average_end": os.getloadavg(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
          "compile_seconds": times}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump({"meta": meta, "files": reports, "wrong": wrong, "crashes": crashes,
               "only_at_depth_2": only_at_2}, f,
              indent=1, ensure_ascii=False)
  print(f"\nwrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
