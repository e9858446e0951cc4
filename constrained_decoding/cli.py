"""Command line: `constrained-decoding generate|evaluate|compile ...`.

`generate`: completions go to stdout; logs, progress and errors go to stderr, so the
output can be piped. `--output text` (default) prints the generated text (with
`--batch-size` above 1, each row under a `--- row N ---` line, since texts may hold
newlines); `--output jsonl` prints one JSON object per row (text, token ids, finished,
parsed value).

`evaluate`: prompts and constraints from a JSONL file, results to a JSONL file (one line
per input line, in order), the summary as one JSON object on stdout, a progress bar on
stderr. Exit status: 0 when every line was evaluated, 1 when some lines had an error
(reported on their output line; the others were evaluated), 2 for errors that stop
the job (bad flags, unreadable input, a model that does not load).

`compile`: one constraint compiled for a model's vocabulary and saved with `-o FILE`
(`ConstraintTables.save`, or `LexedTables.save` for a grammar with a lexer:
`--builtin-grammar python|go|sql`, `--grammar FILE.lark --lexer`), for `cd.load_tables`
on machines without pynini.
"""

import argparse
import codecs
import contextlib
import dataclasses
import enum
import functools
import importlib
import json
import logging
import re
import sys
import time

from constrained_decoding import errors


def _log(message: str) -> None:
  print(f"constrained-decoding: {message}", file=sys.stderr, flush=True)


class _StderrHandler(logging.StreamHandler):
  """A handler that writes to whatever `sys.stderr` is when a record is emitted."""

  @property
  def stream(self):
    return sys.stderr

  @stream.setter
  def stream(self, value):
    del value  # Always sys.stderr (tests swap it).


@contextlib.contextmanager
def _library_logs_shown():
  """Shows the library's INFO messages (`logging`) on stderr, as the command's own, while
  the command runs; the logger is left as it was (`main` may run inside a program)."""
  logger = logging.getLogger("constrained_decoding")
  level = logger.level
  handler = None
  if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("constrained_decoding: %(message)s"))
    logger.addHandler(handler)
  if logger.level == logging.NOTSET or logger.level > logging.INFO:
    logger.setLevel(logging.INFO)
  try:
    yield
  finally:
    if handler is not None:
      logger.removeHandler(handler)
    logger.setLevel(level)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="constrained-decoding",
      description="Constrained generation with Gemma 3 (default: the packaged Gemma 3 270M).")
  sub = parser.add_subparsers(dest="command", required=True)
  gen = sub.add_parser("generate", help="generate text that follows a constraint")
  _add_spec_arguments(gen)
  gen.add_argument("--prompt", required=True, help="the prompt (completion style for base models)")
  gen.add_argument("--model", default=None, help="path of a Gemma 3 GGUF (default: packaged 270M)")
  gen.add_argument("--chat", action="store_true",
                   help="wrap the prompt in Gemma's chat template (instruction-tuned weights)")
  gen.add_argument("--max-new-tokens", type=int, default=64)
  gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
  gen.add_argument("--top-k", type=int, default=0)
  gen.add_argument("--top-p", type=float, default=1.0)
  gen.add_argument("--seed", type=int, default=0)
  gen.add_argument("--batch-size", type=int, default=1,
                   help="number of completions of the prompt, decoded as one batch")
  gen.add_argument("--no-stream", action="store_true",
                   help="print completions at the end instead of token by token")
  gen.add_argument("--output", choices=("text", "jsonl"), default="text",
                   help="text (default): the completions' text; jsonl: one JSON object per "
                        "row with row, completion, token_ids, finished, constraint_error, "
                        "value (streamed: each row's line as the row ends)")
  _add_evaluate_parser(sub)
  _add_compile_parser(sub)
  return parser


def _add_spec_arguments(parser, *, required: bool = False) -> None:
  """The constraint flags shared by `generate` and `compile` (at most one of them)."""
  spec = parser.add_mutually_exclusive_group(required=required)
  spec.add_argument("--regex", help="the output must fully match this regex (Python syntax)")
  spec.add_argument("--choices", help="comma-separated list; the output is exactly one of them")
  spec.add_argument("--json-schema", metavar="FILE", help="the output is JSON valid under it")
  spec.add_argument("--grammar", metavar="FILE",
                    help="GBNF (or Lark, for a .lark file) grammar; see --max-depth")
  spec.add_argument("--json", action="store_true",
                    help="the output is any JSON value (the built-in JSON grammar)")
  spec.add_argument("--builtin-grammar", choices=("python", "go", "sql"), default=None,
                    help="the output is a program in this language (a built-in grammar "
                         "with a lexer, cd.Grammar.builtin)")
  spec.add_argument("--dataclass", metavar="MODULE:NAME",
                    help="the output is a constructor call of this dataclass")
  parser.add_argument("--lexer", action="store_true",
                      help="--grammar FILE.lark is read with a lexer: its terminals are "
                           "lexemes, %%ignore'd ones skipped between them (cd.Grammar("
                           "lexer=True))")
  parser.add_argument("--max-depth", type=int, default=None,
                      help="nesting bound that makes a recursive --grammar or --json regular "
                           "(default: unbounded, with the nesting stack on the device)")
  parser.add_argument("--unicode", action="store_true",
                      help="\\d \\w \\s are Unicode classes (default: ASCII, as re.ASCII)")
  parser.add_argument("--strict-properties", action="store_true",
                      help="--json-schema: no properties beyond the declared ones (unless "
                           "additionalProperties is a schema)")
  parser.add_argument("--whitespace", choices=("compact", "single", "flexible"), default=None,
                      help="--json-schema: compact (default, none), single (one space after "
                           ": and ,) or flexible (short runs anywhere)")


def _add_compile_parser(sub) -> None:
  comp = sub.add_parser(
      "compile", help="compile a constraint once and save its tables to one file",
      description="Compile a constraint for a model's vocabulary and save the tables "
                  "(cd.load_tables reads them, also where pynini is not installed).")
  _add_spec_arguments(comp, required=True)
  comp.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="where to write the tables (e.g. tables.cdt)")
  comp.add_argument("--model", default=None,
                    help="GGUF whose vocabulary the tables are for (default: packaged 270M)")


_EVALUATE_HELP = """\
Each input line is a JSON object: {"prompt": "...", <one constraint>, "answer": "..."}
where the constraint is one of
  "regex": "..."            (+ "unicode": true for Unicode \\d \\w \\s)
  "choices": ["a", "b"]     (or "a,b": the output is exactly one of them)
  "json_schema": {...}      (a schema object, or its JSON text)
  "grammar": "..."          (GBNF text; + "syntax": "lark", + "max_depth": N)
  "dataclass": "MODULE:NAME"
"answer" (optional) is compared with the stripped completion for accuracy; "id"
(optional) is copied to the output line. Output lines: line, id, completion,
token_ids, finished, constraint_error, conforms, correct, value (the parsed output:
JSON for json_schema, the dataclass as an object, else the text; null when the row
did not finish), error (a message when the line could not be evaluated, else null).

exit status: 0 every line evaluated; 1 some lines had errors (see their "error");
2 the job could not run (bad flags, unreadable input, model not loaded)."""


def _add_evaluate_parser(sub) -> None:
  ev = sub.add_parser(
      "evaluate", help="decode a JSONL file of prompts and constraints; write JSONL results",
      description="Decode every prompt of a JSONL file under its own constraint, sharded "
                  "over the available devices, and report conformance (and accuracy).",
      epilog=_EVALUATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  ev.add_argument("--input", required=True, metavar="FILE", help="JSONL prompts and constraints")
  ev.add_argument("--output", required=True, metavar="FILE", help="JSONL results, one per line")
  ev.add_argument("--model", default=None, help="path of a Gemma 3 GGUF (default: packaged 270M)")
  ev.add_argument("--chat", action="store_true",
                  help="wrap prompts in Gemma's chat template (instruction-tuned weights)")
  ev.add_argument("--batch-size", type=int, default=None,
                  help="rows per sharded call, rounded up to a multiple of the device count "
                       "(default: 8 per device)")
  ev.add_argument("--max-new-tokens", type=int, default=64)
  ev.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
  ev.add_argument("--top-k", type=int, default=0)
  ev.add_argument("--top-p", type=float, default=1.0)
  ev.add_argument("--seed", type=int, default=0, help="row i samples with fold_in(seed, i)")
  ev.add_argument("--jump-forward", type=int, default=0, metavar="N",
                  help="feed up to N forced tokens per model call (0: off)")
  ev.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _choices_regex(choices: str) -> str:
  items = [c for c in choices.split(",")]
  if not all(items):
    raise ValueError(f"--choices {choices!r} has an empty choice. Expected 'a,b,c'.")
  return "|".join(re.escape(c) for c in items)


def _spec(args, cd):
  """The constraint spec named on the command line, or None."""
  if args.max_depth is not None and args.grammar is None and not args.json:
    raise ValueError(f"--max-depth {args.max_depth} applies to --grammar and --json only. "
                     f"Expected it with one of them, or no --max-depth.")
  if args.lexer and (args.grammar is None or not args.grammar.endswith(".lark")):
    raise ValueError("--lexer applies to a Lark grammar only. Expected it with --grammar "
                     "FILE.lark, or no --lexer.")
  if args.lexer and args.max_depth is not None:
    raise ValueError(f"--max-depth {args.max_depth} does not apply with --lexer (the "
                     f"parser's stack is on the device). Expected one of them.")
  for flag, given in (("--strict-properties", args.strict_properties),
                      ("--whitespace", args.whitespace is not None)):
    if given and args.json_schema is None:
      raise ValueError(f"{flag} applies to --json-schema only. Expected it with "
                       f"--json-schema FILE, or no {flag}.")
  if args.json:
    return cd.Grammar.builtin("json", max_depth=args.max_depth)
  if args.builtin_grammar is not None:
    return cd.Grammar.builtin(args.builtin_grammar)
  if args.choices is not None:
    return cd.Regex(_choices_regex(args.choices))
  if args.regex is not None:
    return cd.Regex(args.regex, unicode=args.unicode)
  if args.json_schema is not None:
    with open(args.json_schema, encoding="utf-8") as f:
      return cd.JsonSchema(f.read(), whitespace=args.whitespace or "compact",
                           strict_properties=args.strict_properties)
  if args.grammar is not None:
    with open(args.grammar, encoding="utf-8") as f:
      syntax = "lark" if args.grammar.endswith(".lark") else "gbnf"
      if args.lexer:
        return cd.Grammar(f.read(), syntax="lark", lexer=True)
      return cd.Grammar(f.read(), syntax=syntax, max_depth=args.max_depth)
  if args.dataclass is not None:
    return _dataclass_spec(args.dataclass, cd, "--dataclass")
  return None


def _dataclass_spec(target: str, cd, where: str):
  """`cd.Dataclass` of the class named `MODULE:NAME` (`where` names the input in errors)."""
  module_name, _, name = target.partition(":")
  if not name:
    raise ValueError(f"{where} {target!r} has no class name. Expected "
                     f"MODULE:NAME, e.g. mypackage.types:Answer.")
  try:
    cls = getattr(importlib.import_module(module_name), name)
  except (ImportError, AttributeError) as e:
    raise ValueError(f"{where} {target!r} could not be imported: {e}.") from e
  return cd.Dataclass(cls)


# Most rows one command decodes at once (`--batch-size`): each row has its own KV cache.
_MAX_BATCH_SIZE = 1024


def _flag_error(error: Exception) -> ValueError:
  """A sampling error reworded with the flag's name: `top_p 2.0 ...` -> `--top-p 2.0 ...`."""
  field, _, rest = str(error).partition(" ")
  return type(error)(f"--{field.replace('_', '-')} {rest}")


def _decoding_flags(args, cd):
  """The `SamplingConfig` of the flags, after checking every decoding flag.

  Runs first, before the vocabulary, a constraint or the weights are loaded, so that a
  typo (`--max-new-tokens 0`, `--temperature nan`) costs milliseconds.
  """
  from constrained_decoding.sampling import _generate  # pylint: disable=g-import-not-at-top

  try:
    _generate.check_max_new_tokens(args.max_new_tokens, name="--max-new-tokens")
    sampling = cd.SamplingConfig(temperature=args.temperature, top_k=args.top_k,
                                 top_p=args.top_p,
                                 jump_forward=getattr(args, "jump_forward", 0))
  except errors.DecodingArgumentError as e:
    if str(e).startswith("--"):
      raise
    raise _flag_error(e) from None
  if args.batch_size is not None and not 1 <= args.batch_size <= _MAX_BATCH_SIZE:
    raise errors.DecodingArgumentError(
        f"--batch-size {args.batch_size} is out of range. Expected an int in "
        f"[1, {_MAX_BATCH_SIZE}].")
  return sampling


def _row_header(row: int, batch_size: int) -> str:
  """The line before each row's text in text output (none for a single row)."""
  return f"--- row {row} ---\n" if batch_size > 1 else ""


def _row_value(completion, *, is_json: bool = False):
  """A completion's parsed value: `Completion.value`, or the JSON of a `--json` row (the
  built-in JSON grammar's value is its text). None for an unfinished row."""
  if is_json and completion.finished and not completion.error:
    return json.loads(completion.text)
  return completion.value


def _jsonable(value):
  """`value` as JSON data: dataclass instances as objects, enums as their values,
  tuples and sets as lists, pydantic models through `model_dump(mode="json")`."""
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
  if isinstance(value, enum.Enum):
    return _jsonable(value.value)
  if isinstance(value, (list, tuple, set, frozenset)):
    return [_jsonable(v) for v in value]
  if isinstance(value, dict):
    return {_jsonable(k): _jsonable(v) for k, v in value.items()}
  if callable(getattr(value, "model_dump", None)):
    return value.model_dump(mode="json")
  return value


def _jsonl_line(fields: dict, completion, value) -> str:
  """One JSONL result line: `fields`, then the completion, its flags and parsed value."""
  line = dict(fields, completion=completion.text, token_ids=list(completion.token_ids),
              finished=completion.finished, constraint_error=completion.error,
              value=_jsonable(value))
  return json.dumps(line, ensure_ascii=False) + "\n"


def _log_value(row: int, value, finished: bool) -> None:
  if finished:
    _log(f"row {row} value: {value!r}")
  else:
    _log(f"row {row} value: none (the row ran out of tokens before finishing)")


def _generate(args) -> int:
  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

  sampling = _decoding_flags(args, cd)
  spec = _spec(args, cd)
  if isinstance(spec, cd.Regex):  # Syntax and size errors before the vocabulary loads.
    spec.to_ir()
  path = args.model or cd.models.default_gguf_path()
  if spec is not None:  # Before loading weights, so that a bad constraint fails fast.
    from constrained_decoding import _compiler  # pylint: disable=g-import-not-at-top

    started = time.perf_counter()
    vocab = cd.Vocabulary.from_gguf(path)
    # The shared compiler memoizes it: `generate(constraint=spec)` below reuses the tables.
    tables = _compiler.compiler_for(vocab).compile(spec)
    _log(f"constraint compiled in {1e3 * (time.perf_counter() - started):.1f} ms: {tables!r}")
  started = time.perf_counter()
  model = _load_model(path)
  _log(f"model loaded in {time.perf_counter() - started:.1f} s")
  prompt = model.chat_prompt(args.prompt) if args.chat else args.prompt
  prompts = [prompt] * args.batch_size
  kwargs = dict(constraint=spec, max_new_tokens=args.max_new_tokens, sampling=sampling,
                seed=args.seed)
  # Text output: parsed values (JSON, dataclass instances) are logged, stdout keeps the
  # text only. JSONL output: each row's value is in its line.
  show_values = args.json_schema is not None or args.dataclass is not None or args.json
  value_of = functools.partial(_row_value, is_json=args.json)
  started = time.perf_counter()
  if args.output == "jsonl":
    completions = (enumerate(cd.generate(model, prompts, **kwargs)) if args.no_stream else
                   ((row, item) for row, item in cd.generate_stream(model, prompts, **kwargs)
                    if isinstance(item, cd.Completion)))
    for row, completion in completions:  # streamed: in the order the rows end
      sys.stdout.write(_jsonl_line(dict(row=row), completion, value_of(completion)))
      sys.stdout.flush()
  elif args.no_stream:
    for row, completion in enumerate(cd.generate(model, prompts, **kwargs)):
      sys.stdout.write(_row_header(row, len(prompts)) + completion.text + "\n")
      if show_values:
        _log_value(row, value_of(completion), completion.finished)
  else:
    sys.stdout.write(_row_header(0, len(prompts)))
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    finals = {}
    for row, item in cd.generate_stream(model, prompts, **kwargs):
      if isinstance(item, cd.Completion):
        finals[row] = item
      elif row == 0:  # the first row streams; the others are printed when all are done
        sys.stdout.write(decoder.decode(item))
        sys.stdout.flush()
    sys.stdout.write(decoder.decode(b"", final=True) + "\n")
    for row in range(1, len(prompts)):
      sys.stdout.write(_row_header(row, len(prompts)) + finals[row].text + "\n")
    if show_values:
      sys.stdout.flush()
      for row in range(len(prompts)):
        _log_value(row, value_of(finals[row]), finals[row].finished)
  sys.stdout.flush()
  _log(f"generated in {time.perf_counter() - started:.1f} s")
  return 0


def _compile(args) -> int:
  """`compile`: the constraint's tables, saved with the vocabulary's fingerprint."""
  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

  spec = _spec(args, cd)
  if isinstance(spec, cd.Regex):  # Syntax and size errors before the vocabulary loads.
    spec.to_ir()
  started = time.perf_counter()
  vocab = cd.Vocabulary.from_gguf(args.model or cd.models.default_gguf_path())
  tables = cd.Compiler(vocab).compile(spec)
  tables.save(args.output, vocab=vocab, description=spec.describe())
  _log(f"compiled in {time.perf_counter() - started:.1f} s: {tables!r}; wrote "
       f"{args.output} (vocabulary {vocab.fingerprint[:12]})")
  return 0


_CONSTRAINT_KEYS = ("regex", "choices", "json_schema", "grammar", "dataclass")
_LINE_KEYS = frozenset({"prompt", "answer", "id", "unicode", "syntax", "max_depth",
                        *_CONSTRAINT_KEYS})


def _line_option(record: dict, key: str, default, kind: type, expected: str):
  """`record[key]` (or `default` when absent or null), if it is a `kind`; else raises.

  No coercion: `"unicode": "false"` is a string, and `bool("false")` is True.
  """
  value = record.get(key)
  if value is None:
    return default
  if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
    raise ValueError(f"{key!r} is {value!r}. Expected {expected}.")
  return value


def _line_spec(record, cd):
  """The constraint spec of one `evaluate` input line; raises naming the problem."""
  if not isinstance(record, dict):
    raise ValueError(f"The line is a JSON {type(record).__name__}. Expected an object "
                     f"such as {{\"prompt\": \"...\", \"regex\": \"...\"}}.")
  unknown = sorted(set(record) - _LINE_KEYS)
  if unknown:
    raise ValueError(f"Unknown key {unknown[0]!r}. Expected keys among "
                     f"{sorted(_LINE_KEYS)}.")
  if not isinstance(record.get("prompt"), str):
    raise ValueError(f"\"prompt\" is {record.get('prompt')!r}. Expected a string.")
  named = [k for k in _CONSTRAINT_KEYS if k in record]
  if len(named) != 1:
    raise ValueError(f"The line names {len(named)} constraints {named}. Expected exactly "
                     f"one of {list(_CONSTRAINT_KEYS)}.")
  key = named[0]
  value = record[key]
  if key == "choices":
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(
        isinstance(c, str) and c for c in items):
      raise ValueError(f"\"choices\" {value!r} is not a list of non-empty strings. Expected "
                       f"[\"a\", \"b\"] or \"a,b\".")
    return cd.Regex("|".join(re.escape(c) for c in items))
  if key == "json_schema":
    return cd.JsonSchema(value)
  if not isinstance(value, str):
    raise ValueError(f"{key!r} is a {type(value).__name__}. Expected a string.")
  if key == "regex":
    return cd.Regex(value, unicode=_line_option(record, "unicode", False, bool, "true or false"))
  if key == "grammar":
    return cd.Grammar(value, syntax=_line_option(record, "syntax", "gbnf", str, "a string"),
                      max_depth=_line_option(record, "max_depth", None, int, "an integer"))
  return _dataclass_spec(value, cd, '"dataclass"')


def _load_model(path: str):
  """The model for `evaluate` (a function of its own so that tests can pass a small one)."""
  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top
  return cd.models.Gemma3.from_gguf(path)


def _read_lines(path: str) -> list[tuple[int, str]]:
  """(line number, text) of the non-blank lines of a JSONL file."""
  with open(path, encoding="utf-8") as f:
    lines = [(k, text) for k, text in enumerate(f, start=1) if text.strip()]
  if not lines:
    raise ValueError(f"--input {path!r} has no lines. Expected one JSON object per line.")
  return lines


def _compile_lines(lines, compiler, cd, args, tqdm) -> list[dict]:
  """One entry per input line: its record and tables, or the error that stops it."""
  compiled = {}  # spec -> tables: one table set per distinct constraint
  entries = []
  for number, text in tqdm.tqdm(lines, desc="compile", unit="line", file=sys.stderr,
                                disable=args.no_progress):
    entry = dict(line=number, record=None, spec=None, tables=None, error=None, result=None)
    try:
      entry["record"] = json.loads(text)
      spec = entry["spec"] = _line_spec(entry["record"], cd)
      if spec not in compiled:
        compiled[spec] = compiler.compile(spec)
      entry["tables"] = compiled[spec]
    except Exception as e:  # pylint: disable=broad-except  (one line must not stop the job)
      entry["error"] = f"{type(e).__name__}: {e}"
      tqdm.tqdm.write(f"constrained-decoding: {args.input}:{number}: {entry['error']}",
                      file=sys.stderr)
    entries.append(entry)
  return entries


def _output_line(entry: dict) -> str:
  """The JSONL result of one input line (its completion, or its error)."""
  record = entry["record"] if isinstance(entry["record"], dict) else {}
  line = {"line": entry["line"], "id": record.get("id")}
  row = entry["result"]
  if row is None:
    line.update(completion=None, error=entry["error"])
  else:
    c = row.completion
    line.update(completion=c.text, token_ids=list(c.token_ids), finished=c.finished,
                constraint_error=c.error, conforms=row.conforms, correct=row.correct,
                value=_jsonable(_line_value(entry["spec"], c, entry["line"])), error=None)
  return json.dumps(line, ensure_ascii=False) + "\n"


def _line_value(spec, completion, line: int):
  """The parsed value of an `evaluate` row (its tables were decoded, so it is parsed
  here with the line's spec): JSON for json_schema, the instance for dataclass, the
  text for regex, choices and grammar; None for an unfinished row."""
  if completion.value is not None or spec is None:
    return completion.value
  if not completion.finished or completion.error:
    return None
  from constrained_decoding.sampling import _generate  # pylint: disable=g-import-not-at-top

  try:
    return _generate._value(spec, completion.text, line)  # pylint: disable=protected-access
  except ValueError as e:  # a bug (the constraint accepted what its spec cannot parse)
    _log(f"line {line}: {e}")
    return None


def _evaluate(args) -> int:
  import tqdm  # pylint: disable=g-import-not-at-top  (a dependency of gguf, used by loading)

  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

  sampling = _decoding_flags(args, cd)
  lines = _read_lines(args.input)
  path = args.model or cd.models.default_gguf_path()
  entries = _compile_lines(lines, cd.Compiler(cd.Vocabulary.from_gguf(path)), cd, args, tqdm)
  valid = [e for e in entries if e["error"] is None]
  position = {id(e): k for k, e in enumerate(entries)}
  result = None
  with open(args.output, "w", encoding="utf-8") as out:
    written = 0

    def write_through(end: int) -> None:
      """Writes the output lines of entries[written:end], in input order."""
      nonlocal written
      out.writelines(_output_line(e) for e in entries[written:end])
      out.flush()
      written = max(written, end)

    if valid:
      started = time.perf_counter()
      model = _load_model(path)
      _log(f"model loaded in {time.perf_counter() - started:.1f} s")
      bar = tqdm.tqdm(total=len(valid), desc="evaluate", unit="row", file=sys.stderr,
                      disable=args.no_progress)

      def on_batch(start, rows):
        for entry, row in zip(valid[start:start + len(rows)], rows):
          entry["result"] = row
        write_through(position[id(valid[start + len(rows) - 1])] + 1)
        bar.update(len(rows))

      prompts = [e["record"]["prompt"] for e in valid]
      answers = [e["record"].get("answer") for e in valid]
      started = time.perf_counter()
      result = cd.evaluate(
          model, [model.chat_prompt(p) if args.chat else p for p in prompts],
          [e["tables"] for e in valid],
          answers=[None if a is None else str(a) for a in answers],
          max_new_tokens=args.max_new_tokens, sampling=sampling, seed=args.seed,
          batch_size=args.batch_size, on_batch=on_batch)
      bar.close()
      _log(f"evaluated {len(valid)} rows in {time.perf_counter() - started:.1f} s")
    write_through(len(entries))

  summary = {"lines": len(entries), "line_errors": len(entries) - len(valid)}
  if result is not None:
    summary.update(result.summary())
  print(json.dumps(summary), flush=True)
  return 1 if len(valid) < len(entries) else 0


# Longest error message printed, in characters (a message may quote a huge pattern).
_MAX_MESSAGE = 500


def _one_line(error: BaseException) -> str:
  """`Type: message` on one line, shortened to `_MAX_MESSAGE` characters."""
  text = " ".join(f"{type(error).__name__}: {error}".split())
  return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE - 3] + "..."


def main(argv: list[str] | None = None) -> int:
  """Runs the command; returns the exit status (2: bad input, reported in one line)."""
  args = _parser().parse_args(argv)
  try:
    with _library_logs_shown():
      if args.command == "evaluate":
        return _evaluate(args)
      if args.command == "compile":
        return _compile(args)
      return _generate(args)
  except (ValueError, TypeError, OSError) as e:  # includes every ConstraintError
    _log(f"error: {_one_line(e)}")
    return 2
  except (RecursionError, OverflowError, MemoryError) as e:  # A bug, but a clear one.
    _log(f"error: {_one_line(e)} (an input the library failed to reject cleanly; please "
         f"report it)")
    return 2


if __name__ == "__main__":
  sys.exit(main())
