"""Real public JSON Schemas found on this machine through `cd.JsonSchema`: coverage,
soundness, compile time, sizes.

Issue 14's measure is "schemas as people write them": files published by projects,
not written for us. This machine's Python packages and system data ship some, and
nothing is copied into the project: the script finds them where they are installed
and skips what is absent (so its counts depend on the machine; the result file lists
every file by source and name). Sources (relative globs under each root):

  * metaschemas of JSON Schema drafts 3 to 2020-12 (`jsonschema_specifications`),
  * Jupyter notebook formats v3 and v4.x (`nbformat`), the Debug Adapter Protocol
    (`debugpy`), setuptools' pyproject tables, CMake presets, the iso-codes files,
  * OpenAPI 2.0 / 3.0 / 3.1 / 3.2 document schemas (`openapi_spec_validator`,
    `openapi_schema_validator`), AWS SAM templates (`samtranslator`),
  * AWS CloudFormation template-section and resource-rule schemas (`cfnlint`).

Roots: this interpreter's site-packages, `/usr/share`, and every `--root`. Files with
equal content are counted once.

Other documents are passed as a user would pass them, `JsonSchema(..., resources=)`
(nothing is fetched): every scanned file with an absolute `$id`, and the files under
`RESOURCE_SOURCES` (read as documents only, not measured: the OpenAPI 3.1 base
vocabulary, `https://spec.openapis.org/oas/3.1/meta/base`), under that `$id`; and, for
a schema whose `$ref`s name files next to it (cfnlint's `iam/policy_*.json` refer to
`policy#/...`), those files (`name` or `name.json`, and the files they name in turn)
under the URIs the `$ref`s resolve to. Such a schema's base URI is its retrieval URI,
its file's `file:` URI (joined with its own relative `$id`), written as its `$id`. The
`jsonschema` oracle gets the same schema and documents.

For each schema, with the Gemma 3 vocabulary (`--vocab bytes` for the byte one):
compiled, refused (typed error, grouped by cause) or crashed (any other exception: a
defect), with compile time and table bytes. Soundness, for compiled regular schemas:
`--samples` random texts the byte automaton accepts (`cd.testing.random_accepted_bytes`)
must parse as JSON and be valid for `jsonschema` (every one that is not is a wrong
answer, listed). Completeness where the file gives instances: the root's `examples`
and `default` valid for `jsonschema` must be accepted in their compact `json.dumps`
spelling (`json_schema_suite.judge_instance`; those that are not are listed, with the
verdict, to read: another spelling accepted is a documented narrowing).
Writes `benchmarks/results/public_schemas[_bytes].json`.

  python benchmarks/public_schemas.py --vocab bytes
  python benchmarks/public_schemas.py --root /path/to/other/site-packages
  python benchmarks/public_schemas.py --vocab bytes --lenient uniqueItems --samples 0
"""

import argparse
import collections
import glob
import hashlib
import json
import os
import pathlib
import random
import site
import sys
import time
import urllib.parse
import urllib.request

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # Run as a script from a checkout.

import constrained_decoding as cd  # noqa: E402
from benchmarks import json_schema_suite as suite  # noqa: E402
from benchmarks import schema_corpus  # noqa: E402
from constrained_decoding import testing  # noqa: E402
from constrained_decoding.automata import _fsa  # noqa: E402

# (source, glob relative to a root).
SOURCES = (
    ("json-schema metaschemas", "jsonschema_specifications/schemas/*/metaschema.json"),
    ("json-schema vocabularies", "jsonschema_specifications/schemas/*/vocabularies/*"),
    ("nbformat", "nbformat/v*/nbformat.v*.schema.json"),
    ("debug adapter protocol", "debugpy/**/debugProtocol*.json"),
    ("setuptools", "setuptools/config/*.schema.json"),
    ("openapi", "openapi_spec_validator/resources/schemas/*/schema.json"),
    ("openapi", "openapi_schema_validator/schemas/*/*.json"),
    ("aws sam", "samtranslator/**/*schema*.json"),
    ("cloudformation templates", "cfnlint/data/schemas/other/**/*.json"),
    ("cloudformation rules", "cfnlint/data/schemas/extensions/**/*.json"),
    ("cmake", "cmake-*/Help/manual/presets/schema.json"),
    ("iso-codes", "iso-codes/json/schema-*.json"),
)


# Documents other schemas refer to by `$id`, read as resources only (same form).
RESOURCE_SOURCES = (
    ("openapi vocabularies", "openapi_schema_validator/schemas/*/vocabularies/*"),
)
# Keywords whose values are JSON data, not subschemas.
_DATA_KEYWORDS = ("enum", "const", "default", "examples")


def default_roots() -> list[str]:
  roots = [*site.getsitepackages(), site.getusersitepackages(), "/usr/share"]
  return [r for r in dict.fromkeys(roots) if os.path.isdir(r)]


def find_schemas(roots: list[str], sources=SOURCES) -> list[dict]:
  """[{"source", "name", "path", "schema"}], one per distinct content, sorted."""
  found, seen = [], set()
  for root in roots:
    for source, pattern in sources:
      for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
        try:
          with open(path, "rb") as f:
            raw = f.read()
          schema = json.loads(raw)
        except (OSError, ValueError):
          continue
        digest = hashlib.sha256(raw).hexdigest()
        if digest in seen or not isinstance(schema, (dict, bool)):
          continue
        seen.add(digest)
        found.append({"source": source, "name": os.path.relpath(path, root),
                      "path": path, "schema": schema})
  return sorted(found, key=lambda e: (e["source"], e["name"]))


def resources_for(entries: list[dict]) -> dict:
  """`$id` -> schema for every found file that declares one (other documents a `$ref`
  may name, e.g. the 2020-12 metaschema's vocabularies)."""
  out = {}
  for entry in entries:
    schema = entry["schema"]
    uri = schema.get("$id", schema.get("id")) if isinstance(schema, dict) else None
    if isinstance(uri, str) and "://" in uri:
      out.setdefault(uri.split("#")[0], schema)
  return out


def _own_id(schema) -> str | None:
  ident = schema.get("$id", schema.get("id")) if isinstance(schema, dict) else None
  return ident if isinstance(ident, str) and not ident.startswith("#") else None


def document_refs(schema, base: str) -> set[str]:
  """The documents (absolute URIs, no fragment) that the `$ref`s in `schema` name,
  resolved against `base` and the `$id`s on the way."""
  out, todo = set(), [(schema, base, True)]
  while todo:
    node, base, top = todo.pop()
    if isinstance(node, list):
      todo += [(v, base, False) for v in node]
      continue
    if not isinstance(node, dict):
      continue
    if _own_id(node) and not top:
      base = urllib.parse.urljoin(base, _own_id(node))
    for key in ("$ref", "$dynamicRef", "$recursiveRef"):
      if isinstance(node.get(key), str):
        out.add(urllib.parse.urljoin(base, node[key]).partition("#")[0])
    todo += [(v, base, False) for k, v in node.items() if k not in _DATA_KEYWORDS]
  return out


def with_neighbours(entry: dict, resources: dict) -> tuple[object, dict]:
  """(schema, resources) for one entry: when its `$ref`s name files next to it, the
  schema with its base URI (file URI joined with its own `$id`) as `$id`, and those
  files, and the files they name in turn, added to `resources` under the URIs the
  `$ref`s resolve to (`name`, else `name.json`). Otherwise as they are."""
  schema = entry["schema"]
  if not isinstance(schema, dict):
    return schema, resources
  retrieval = pathlib.Path(os.path.abspath(entry["path"])).as_uri()
  base = urllib.parse.urljoin(retrieval, _own_id(schema) or "").partition("#")[0]
  found, todo = {}, sorted(document_refs(schema, base))
  while todo:
    uri = todo.pop()
    if uri == base or uri in found or uri in resources or not uri.startswith("file:"):
      continue
    path = urllib.request.url2pathname(urllib.parse.urlparse(uri).path)
    for candidate in (path, path + ".json"):
      try:
        with open(candidate, encoding="utf-8") as f:
          document = json.load(f)
      except (OSError, ValueError):
        continue
      found[uri] = document
      todo += sorted(document_refs(
          document, urllib.parse.urljoin(uri, _own_id(document) or "")))
      break
  if not found:
    return schema, resources
  return {**schema, "$id": base}, {**resources, **found}


def cause(error: str) -> str:
  """A refusal grouped by its cause: the error class and the keyword it names."""
  kind, _, message = error.partition(": ")
  words = message.split()
  keyword = words[0] if words else ""
  if kind in ("CompileBudgetError", "Timeout"):
    return kind
  if keyword.startswith(("JsonSchema(", "Determinizing")):
    return f"{kind}: budget"
  return f"{kind}: {keyword.strip(':')}"


def instances(schema) -> list:
  """The root's `examples` and `default` (the instances a file gives, if any)."""
  if not isinstance(schema, dict):
    return []
  given = list(schema.get("examples", [])) if isinstance(schema.get("examples"), list) else []
  if "default" in schema:
    given.append(schema["default"])
  return given


def sample_texts(spec: cd.JsonSchema, count: int, seed: int) -> list[bytes] | None:
  """`count` random texts of the spec's byte automaton (None: recursive, or too large
  to build whole)."""
  if count <= 0 or spec.pushdown_grammar() is not None:
    return None
  try:  # The whole byte DFA; the compiler may have built it in pieces (counted chains).
    dfa = _fsa.compile_byte_dfa(spec.to_ir())
  except cd.CompileBudgetError:
    return None
  rng = random.Random(seed)
  return [testing.random_accepted_bytes(dfa, rng, soft_limit=400) for _ in range(count)]


def run_schema(compiler, speller, entry: dict, *, args, resources: dict) -> dict:
  """Compiles one schema, samples and checks; returns its row."""
  schema, resources = with_neighbours(entry, resources)
  row = {"source": entry["source"], "name": entry["name"], "wrong": [], "rejected_given": []}
  lenient = tuple(args.lenient) or False
  result = suite.compile_case(compiler, schema, whitespace="compact",
                              time_limit=args.time_limit, resources=resources or None,
                              lenient=lenient, shared_definitions=args.shared_definitions)
  row.update(status=result["status"], error=result["error"], compile_s=result["seconds"])
  if result["status"] != "compiled":
    return row
  row["table_bytes"] = cd.tables_nbytes(result["tables"])["total"]
  spec = cd.JsonSchema(schema, resources=resources or None, lenient=lenient)
  row["ignored_keywords"] = len(spec.ignored_keywords())
  draft = schema_corpus.draft_of(schema)
  validator = suite._validator(draft)  # pylint: disable=protected-access
  registry = _registry(resources)
  check = validator(schema, **({"registry": registry} if registry is not None else {}))
  texts = sample_texts(spec, args.samples, args.seed)
  row["sampled"] = 0 if texts is None else len(texts)
  for text in texts or ():
    try:
      value = json.loads(text)
      valid = check.is_valid(value)
    except ValueError:
      valid = False
    except Exception as e:  # pylint: disable=broad-except  # The oracle failed, not us.
      row.setdefault("oracle_errors", []).append(f"{type(e).__name__}: {str(e)[:100]}")
      continue
    if not valid:
      row["wrong"].append(text.decode("utf-8", "replace")[:300])
  for value in instances(schema):
    try:
      if not check.is_valid(value):
        continue
    except Exception:  # pylint: disable=broad-except
      continue
    judged = suite.judge_instance(result["tables"], value, True, speller, "compact", schema)
    if judged["verdict"] != "ok":
      row["rejected_given"].append(f"{judged['verdict']}: {judged['text'][:300]}")
  return row


def _registry(resources: dict):
  if not resources:
    return None
  try:
    import referencing  # pylint: disable=g-import-not-at-top
    import referencing.jsonschema  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return referencing.Registry().with_resources(
      (uri, referencing.jsonschema.DRAFT202012.create_resource(s) if isinstance(s, bool)
       else referencing.Resource.from_contents(
           s, default_specification=referencing.jsonschema.DRAFT202012))
      for uri, s in resources.items())


def summarize(rows: list[dict]) -> dict:
  compiled = [r for r in rows if r["status"] == "compiled"]
  by_source = collections.defaultdict(collections.Counter)
  for r in rows:
    by_source[r["source"]][r["status"]] += 1
  return {
      "schemas": len(rows),
      "compiled": len(compiled),
      "refused": sum(r["status"] == "refused" for r in rows),
      "crashed": sum(r["status"] == "crashed" for r in rows),
      "by_source": {k: dict(v) for k, v in sorted(by_source.items())},
      "refusal_causes": dict(collections.Counter(
          cause(r["error"]) for r in rows if r["status"] == "refused").most_common()),
      "compile_seconds_compiled": schema_corpus.percentiles([r["compile_s"] for r in compiled]),
      "compile_seconds_all": schema_corpus.percentiles([r["compile_s"] for r in rows]),
      "table_mib": schema_corpus.percentiles([r["table_bytes"] / 2**20 for r in compiled]),
      "sampled_texts": sum(r.get("sampled", 0) for r in compiled),
      "wrong_samples": sum(len(r["wrong"]) for r in compiled),
      "given_instances_rejected": sum(len(r["rejected_given"]) for r in compiled),
  }


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--root", action="append", default=[],
                      help="another directory to search (repeatable)")
  parser.add_argument("--vocab", choices=("gemma", "bytes"), default="gemma")
  parser.add_argument("--time-limit", type=float, default=30.0,
                      help="seconds per compile (CompileOptions.max_seconds; default 30)")
  parser.add_argument("--samples", type=int, default=20,
                      help="random accepted texts checked per compiled schema")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--lenient", action="append", default=[], metavar="KEYWORD",
                      help="compile with JsonSchema(lenient=(KEYWORD, ...)): ignore this"
                      " unsupported keyword (repeatable). Sampled texts may then violate"
                      " it: pass --samples 0")
  parser.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                      help="measure only the files whose name contains it (repeatable;"
                      " all files are still read as resources)")
  parser.add_argument("--shared-definitions", choices=("inline", "call"),
                      default="inline", help="JsonSchema(shared_definitions=...)")
  parser.add_argument("--cache-dir", default=cd.CompileOptions().cache_dir)
  parser.add_argument("--out", default=None,
                      help="default: benchmarks/results/public_schemas[_bytes].json")
  args = parser.parse_args(argv)
  if args.out is None:
    suffix = ("" if args.vocab == "gemma" else f"_{args.vocab}") + "".join(
        f"_lenient_{k}" for k in args.lenient)
    args.out = os.path.join(_REPO, "benchmarks", "results", f"public_schemas{suffix}.json")
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  roots = [*default_roots(), *args.root]
  entries = find_schemas(roots)
  if not entries:
    print(f"No public schemas found under {roots}; nothing to measure.")
    return 0
  resources = resources_for(entries + find_schemas(roots, RESOURCE_SOURCES))
  if args.only:
    entries = [e for e in entries if any(o in e["name"] for o in args.only)]
  vocab, speller = suite.make_speller(args.vocab, 0)
  compiler = cd.Compiler(vocab, cd.CompileOptions(max_seconds=args.time_limit,
                                                  cache_dir=args.cache_dir))
  compiler.compile(cd.JsonSchema(schema_corpus._WARM_UP))  # pylint: disable=protected-access
  load_start, start = os.getloadavg(), time.time()
  rows = []
  for entry in entries:
    row = run_schema(compiler, speller, entry, args=args, resources=resources)
    rows.append(row)
    extra = (f" ({len(row['wrong'])} wrong of {row.get('sampled', 0)} sampled)"
             if row["status"] == "compiled" else f" {row['error'][:160]}")
    print(f"{row['compile_s']:7.2f} s {row['status']:8s} {entry['source']}: {entry['name']}"
          f"{extra}", flush=True)
  summary = summarize(rows)
  meta = {"vocab": args.vocab, "shared_definitions": args.shared_definitions,
          "roots": roots, "time_limit_s": args.time_limit,
          "lenient": args.lenient,
          "samples": args.samples, "wall_s": time.time() - start,
          "load_average_start": load_start, "load_average_end": os.getloadavg(),
          "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump({"meta": meta, "summary": summary, "rows": rows}, f, indent=1)
  print(json.dumps(summary, indent=1))
  print(f"wrote {args.out}")
  return 1 if summary["crashed"] or summary["wrong_samples"] else 0


if __name__ == "__main__":
  sys.exit(main())
