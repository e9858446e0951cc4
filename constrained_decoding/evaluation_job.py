"""The evaluation job behind `python -m constrained_decoding.evaluate --config=FILE`.

`run(config)` runs it from Python (a notebook, another job); `default_config()` is the
config every `configs/*.py` starts from.

One run: read rows from a JSONL file, build each row's prompt (a fixed prefix, such as
an instruction and few-shot examples, then a template filled from the row), its
constraint (the config's, or one the row names) and its reference answer; compile each
distinct constraint once, or load saved tables (`constrained-decoding compile -o`);
decode every row with `cd.evaluate`, sharded over the local devices; write one JSON
line per row to `<output_dir>/results.jsonl` as each batch finishes, then
`<output_dir>/summary.json`.

Resuming: rerun the same config with the same `output_dir` and the rows already in
`results.jsonl` are kept, not decoded again (a line cut short by the interruption is
dropped and its row redone). Each row samples with its index in the data file
(`evaluate(row_ids=)`), so a resumed run writes what an uninterrupted one would. A
config that would change the rows' outputs (data, prompt, constraint, model, decoding)
refuses to resume into an output directory written with another one.

The config is an `ml_collections.ConfigDict`; `default_config()` lists every field
with its meaning, and `configs/*.py` fill them in for the demo tasks.
"""

import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from absl import logging
import ml_collections

from constrained_decoding.errors import EvaluationJobError

RESULTS = "results.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.json"
# Config fields that do not change any row's output: a run may resume with others.
_RUN_ONLY_FIELDS = ("output_dir", "limit", "batch_size", "num_devices")
_CONSTRAINT_KINDS = ("regex", "json_schema", "grammar", "builtin_grammar", "choices", "row")
_ROW_CONSTRAINT_KEYS = ("regex", "json_schema", "grammar", "builtin_grammar", "choices")
# `model` value for random weights of a tiny Gemma 3 with the real vocabulary: checks a
# config end to end in seconds (its answers are noise).
RANDOM_TINY = "random-tiny"


def default_config() -> ml_collections.ConfigDict:
  """Every field of a job config, with defaults; `configs/*.py` start from this."""
  config = ml_collections.ConfigDict()
  config.data_path = ""       # JSONL, one row per line.
  config.limit = 0            # Evaluate the first `limit` rows (0: all).
  config.output_dir = ""      # results.jsonl, summary.json and config.json go here.
  config.model = ""           # "" (the packaged Gemma 3 270M), a GGUF path, or "random-tiny".
  config.chat = False         # Wrap prompts in Gemma's chat template (instruction-tuned).
  # Prompt = prompt_prefix + prompt_template.format(**row); a dict field of the row
  # (multiple-choice options) is written as "KEY. VALUE" lines.
  config.prompt_prefix = ""
  config.prompt_template = "{prompt}"
  # The constraint: kind is one of regex, json_schema, grammar, builtin_grammar, choices
  # (value: the pattern, schema, GBNF text, a cd.Grammar.builtin name such as "python"
  # or "sql" (grammars with a lexer), or comma-separated choices; json_schema_whitespace
  # as in cd.JsonSchema) or "row" (each row names its own under one of the keys regex,
  # json_schema, grammar, builtin_grammar, choices; grammars with a lexer mix only with
  # each other). tables_path: saved tables used instead of compiling.
  config.constraint = ml_collections.ConfigDict(dict(
      kind="regex", value="", json_schema_whitespace="single", tables_path=""))
  config.id_field = "id"
  config.answer_field = "answer"  # The row's reference answer ("" or missing: unscored).
  # The reference is the text after the last `answer_marker` when it has one (GSM8K
  # writes "reasoning #### 72").
  config.answer_marker = "####"
  # The prediction: field `answer_key` of the reply's JSON object, or else group 1 of
  # the first match of `answer_pattern`, or else the whole reply.
  config.answer_key = ""
  config.answer_pattern = ""
  config.numeric_answers = False  # Compare as numbers: "1,234" equals "1234.0".
  config.batch_size = 0       # Rows per sharded call (0: 8 per device).
  config.num_devices = 0      # Devices to shard over (0: every local device).
  config.max_new_tokens = 128
  config.temperature = 0.0    # 0: greedy.
  config.top_k = 0
  config.top_p = 1.0
  config.seed = 0
  return config


# ------------------------------------------------------------------------------ rows


@dataclasses.dataclass(frozen=True)
class Row:
  """One input row, prepared: its index in the data file, prompt, constraint and answer."""

  index: int
  id: Any
  prompt: str
  constraint: tuple[str, str]  # (kind, value), the key for compiling once
  answer: str | None


def read_rows(path: str, limit: int = 0) -> list[dict]:
  """The first `limit` (0: all) JSON objects of a JSONL file, blank lines skipped."""
  if not path:
    raise EvaluationJobError("config.data_path is empty. Expected a JSONL file, one JSON "
                             "object per line.")
  try:
    with open(path, encoding="utf-8") as f:
      lines = [(k, line) for k, line in enumerate(f, start=1) if line.strip()]
  except OSError as e:
    raise EvaluationJobError(f"config.data_path {path!r} cannot be read: {e}.") from e
  rows = []
  for number, line in lines[:limit or None]:
    try:
      record = json.loads(line)
    except ValueError as e:
      raise EvaluationJobError(f"{path}:{number} is not JSON ({e}). Expected one JSON "
                               f"object per line.") from None
    if not isinstance(record, dict):
      raise EvaluationJobError(f"{path}:{number} is a JSON {type(record).__name__}. "
                               f"Expected an object.")
    rows.append(record)
  return rows


class _RowFields(dict):
  """`str.format_map` view of a row: dict fields become "KEY. VALUE" lines."""

  def __init__(self, record: dict, where: str):
    super().__init__(record)
    self.where = where

  def __getitem__(self, key):
    if key not in self:
      raise EvaluationJobError(f"{self.where} has no field {key!r} used by "
                               f"config.prompt_template. Expected fields {sorted(self)}.")
    value = super().__getitem__(key)
    if isinstance(value, dict):
      return "".join(f"{k}. {v}\n" for k, v in value.items())
    return value


def format_prompt(prefix: str, template: str, record: dict, where: str) -> str:
  """`prefix` + `template` filled from the row's fields."""
  return prefix + template.format_map(_RowFields(record, where))


def reference_answer(record: dict, field: str, marker: str) -> str | None:
  """The row's answer: the text after the last `marker` if present, stripped."""
  value = record.get(field) if field else None
  if value is None:
    return None
  text = str(value)
  if marker and marker in text:
    text = text.rsplit(marker, 1)[1]
  return text.strip()


def row_constraint(config: ml_collections.ConfigDict, record: dict,
                   where: str) -> tuple[str, str]:
  """(kind, value) of a row's constraint: the config's, or the one the row names."""
  kind = config.constraint.kind
  if kind != "row":
    return kind, str(config.constraint.value)
  named = [k for k in _ROW_CONSTRAINT_KEYS if k in record]
  if len(named) != 1:
    raise EvaluationJobError(f"{where} names {len(named)} constraints {named}. Expected "
                             f"exactly one of {list(_ROW_CONSTRAINT_KEYS)} (constraint.kind "
                             f"is 'row').")
  value = record[named[0]]
  if named[0] == "json_schema" and not isinstance(value, str):
    value = json.dumps(value, sort_keys=True)
  elif named[0] == "choices" and isinstance(value, list):
    value = ",".join(value)
  return named[0], str(value)


def prepare_rows(config: ml_collections.ConfigDict) -> list[Row]:
  """Every row of the data file (up to `config.limit`), ready to decode."""
  rows = []
  for index, record in enumerate(read_rows(config.data_path, config.limit)):
    where = f"{config.data_path} row {index}"
    rows.append(Row(
        index=index, id=record.get(config.id_field, index),
        prompt=format_prompt(config.prompt_prefix, config.prompt_template, record, where),
        constraint=row_constraint(config, record, where),
        answer=reference_answer(record, config.answer_field, config.answer_marker)))
  return rows


# --------------------------------------------------------------------------- scoring


def _number(text: str) -> float | None:
  try:
    return float(text.replace(",", "").replace("$", "").strip())
  except ValueError:
    return None


def predicted_answer(text: str, value: Any, *, key: str, pattern: str) -> str | None:
  """What a reply answers: a JSON field, a pattern's group 1, or the whole text."""
  if key:
    if not isinstance(value, dict):
      try:
        value = json.loads(text)
      except ValueError:
        return None
    found = value.get(key) if isinstance(value, dict) else None
    return None if found is None else str(found).strip()
  if pattern:
    match = re.search(pattern, text)
    return match.group(1).strip() if match else None
  return text.strip()


def answers_match(predicted: str | None, answer: str, numeric: bool) -> bool:
  """Whether a prediction equals the reference (as numbers when `numeric`)."""
  if predicted is None:
    return False
  if numeric:
    a, b = _number(predicted), _number(answer)
    return a is not None and a == b
  return predicted == answer.strip()


def make_score(config: ml_collections.ConfigDict) -> Callable[[Any, str], bool]:
  """The `score=` function `cd.evaluate` calls per row with an answer."""

  def score(completion, answer: str) -> bool:
    predicted = predicted_answer(completion.text, completion.value, key=config.answer_key,
                                 pattern=config.answer_pattern)
    return answers_match(predicted, answer, config.numeric_answers)

  return score


def check_config(config: ml_collections.ConfigDict) -> None:
  """Typed errors for config values the job cannot use, before anything loads."""
  if config.constraint.kind not in _CONSTRAINT_KINDS:
    raise EvaluationJobError(f"config.constraint.kind is {config.constraint.kind!r}. "
                             f"Expected one of {list(_CONSTRAINT_KINDS)}.")
  if (config.constraint.kind != "row" and not config.constraint.tables_path
      and not config.constraint.value):
    raise EvaluationJobError(f"config.constraint.value is empty. Expected the "
                             f"{config.constraint.kind} every row follows, or "
                             f"constraint.tables_path, or constraint.kind 'row'.")
  if config.constraint.tables_path and config.constraint.kind == "row":
    raise EvaluationJobError("config.constraint.tables_path is set but kind is 'row'. "
                             "Expected saved tables only for one constraint for all rows.")
  if not config.output_dir:
    raise EvaluationJobError("config.output_dir is empty. Expected a directory for "
                             "results.jsonl and summary.json.")
  if config.answer_pattern:
    try:
      groups = re.compile(config.answer_pattern).groups
    except re.error as e:
      raise EvaluationJobError(f"config.answer_pattern {config.answer_pattern!r} is not a "
                               f"regex: {e}.") from None
    if groups < 1:
      raise EvaluationJobError(f"config.answer_pattern {config.answer_pattern!r} has no "
                               f"group. Expected one group around the answer.")
  for name in ("limit", "batch_size", "num_devices"):
    if config[name] < 0:
      raise EvaluationJobError(f"config.{name} is {config[name]}. Expected >= 0.")


# --------------------------------------------------------------------------- resuming


def output_key(config: ml_collections.ConfigDict) -> str:
  """Digest of the fields that decide the rows' outputs (not limit, batching, devices)."""
  fields = json.loads(config.to_json())
  for name in _RUN_ONLY_FIELDS:
    fields.pop(name, None)
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def finished_rows(output_dir: str, key: str) -> dict[int, dict]:
  """Result lines already written (by row index); checks they came from this config.

  Drops a trailing line cut short by an interruption (the file is truncated to the last
  complete line).
  """
  results = os.path.join(output_dir, RESULTS)
  if not os.path.exists(results):
    return {}
  saved = os.path.join(output_dir, CONFIG)
  previous = None
  if os.path.exists(saved):
    with open(saved, encoding="utf-8") as f:
      previous = json.load(f).get("output_key")
  if previous != key:
    raise EvaluationJobError(
        f"{output_dir!r} holds results of another config (output key {previous} vs "
        f"{key}). Expected the same data, prompt, constraint, model and decoding settings "
        f"to resume; use another output_dir for a new run.")
  done, keep = {}, 0
  with open(results, "rb") as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:
        break
      if not line.endswith(b"\n"):
        break
      done[record["row"]] = record
      keep += len(line)
  with open(results, "rb+") as f:
    f.truncate(keep)
  return done


# ---------------------------------------------------------------------------- running


def _load_model(name: str):
  """The packaged Gemma 3 (""), a GGUF path, or random tiny weights (`RANDOM_TINY`)."""
  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

  if name != RANDOM_TINY:
    return cd.models.Gemma3.from_gguf(name or None, progress=False)
  from constrained_decoding.vocab._spm_from_gguf import sentencepiece_from_gguf  # pylint: disable=g-import-not-at-top

  path = cd.models.default_gguf_path()
  vocab = cd.Vocabulary.from_gguf(path)
  tokenizer = sentencepiece_from_gguf(path)
  config = cd.models.Gemma3Config.tiny(vocab_size=vocab.vocab_size)
  return cd.models.Gemma3.random(config, tokenizer=tokenizer, vocab=vocab,
                                 bos_id=tokenizer.bos_id(), seed=0)


def _spec(kind: str, value: str, whitespace: str):
  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

  if kind == "regex":
    return cd.Regex(value)
  if kind == "json_schema":
    return cd.JsonSchema(value, whitespace=whitespace)
  if kind == "grammar":
    return cd.Grammar(value)
  if kind == "builtin_grammar":
    try:
      return cd.Grammar.builtin(value)
    except ValueError as e:
      raise EvaluationJobError(f"builtin_grammar {value!r}: {e}") from None
  items = value.split(",")
  if not all(items):
    raise EvaluationJobError(f"choices {value!r} has an empty choice. Expected 'a,b,c'.")
  return cd.Regex("|".join(re.escape(c) for c in items))


def compile_constraints(config: ml_collections.ConfigDict, rows: Sequence[Row],
                        vocab) -> dict[tuple[str, str], Any]:
  """Tables per distinct (kind, value) among `rows`: compiled once each, or loaded."""
  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

  distinct = sorted({row.constraint for row in rows})
  if config.constraint.tables_path and distinct:
    tables = cd.load_tables(config.constraint.tables_path, vocab=vocab)
    logging.info("loaded tables %s (%s)", config.constraint.tables_path,
                 cd.read_tables_header(config.constraint.tables_path).description)
    return {key: tables for key in distinct}
  compiler = cd.Compiler(vocab) if distinct else None
  compiled = {}
  for kind, value in distinct:
    started = time.perf_counter()
    compiled[kind, value] = compiler.compile(
        _spec(kind, value, config.constraint.json_schema_whitespace))
    logging.info("compiled %s constraint in %.2f s: %r", kind, time.perf_counter() - started,
                 compiled[kind, value])
  lexed = [key for key, tables in compiled.items() if isinstance(tables, cd.LexedTables)]
  if lexed and len(lexed) < len(compiled):
    other = next(key for key in compiled if key not in lexed)
    raise EvaluationJobError(
        f"The rows name the grammar with a lexer {lexed[0][0]} {lexed[0][1][:40]!r} and "
        f"the {other[0]} {other[1][:40]!r}, which has none. Expected grammars with a lexer"
        f" for every row or for none: their tables (LexedTables) are not stacked with "
        f"others, only with each other. Run those rows in a job of their own.")
  return compiled


def result_line(row: Row, result) -> dict:
  """The JSON line of one decoded row (no timings: equal runs write equal lines)."""
  c = result.completion
  return {"row": row.index, "id": row.id, "completion": c.text, "token_ids": list(c.token_ids),
          "finished": c.finished, "constraint_error": c.error, "conforms": result.conforms,
          "answer": row.answer, "correct": result.correct}


def summarize(lines: Sequence[dict]) -> dict:
  """Conformance and accuracy over result lines."""
  n = len(lines)
  answered = [line["correct"] for line in lines if line["correct"] is not None]
  return {
      "rows": n,
      "conformance": sum(line["conforms"] for line in lines) / n if n else 0.0,
      "accuracy": sum(answered) / len(answered) if answered else None,
      "answered": len(answered),
      "finished": sum(line["finished"] for line in lines),
      "constraint_errors": sum(line["constraint_error"] for line in lines),
      "mean_tokens": sum(len(line["token_ids"]) for line in lines) / n if n else 0.0,
  }


def run(config: ml_collections.ConfigDict, *, model=None) -> dict:
  """Runs (or resumes) the job; returns the summary it writes to summary.json.

  Args:
    config: See `default_config`.
    model: A loaded model to use instead of `config.model` (tests, notebooks).
  """
  import jax  # pylint: disable=g-import-not-at-top

  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

  started = time.perf_counter()
  check_config(config)
  rows = prepare_rows(config)
  key = output_key(config)
  os.makedirs(config.output_dir, exist_ok=True)
  done = finished_rows(config.output_dir, key)
  with open(os.path.join(config.output_dir, CONFIG), "w", encoding="utf-8") as f:
    json.dump({"output_key": key, "config": json.loads(config.to_json())}, f, indent=1)
  todo = [row for row in rows if row.index not in done]
  logging.info("%d rows: %d already in %s, %d to decode", len(rows), len(rows) - len(todo),
               config.output_dir, len(todo))
  devices = jax.local_devices()[:config.num_devices or None]
  if todo:
    if model is None:
      model = _load_model(config.model)
    tables = compile_constraints(config, todo, model.vocab)
    sampling = cd.SamplingConfig(temperature=config.temperature, top_k=config.top_k,
                                 top_p=config.top_p)
    _decode(config, model, todo, tables, sampling, devices, done)
  lines = [done[row.index] for row in rows if row.index in done]
  summary = summarize(lines)
  summary.update(devices=len(devices), resumed_rows=len(rows) - len(todo),
                 seconds=round(time.perf_counter() - started, 2))
  with open(os.path.join(config.output_dir, SUMMARY), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  return summary


def _decode(config, model, todo: Sequence[Row], tables: dict, sampling, devices,
            done: dict[int, dict]) -> None:
  """Decodes `todo` with `cd.evaluate`, appending each batch's lines as it finishes."""
  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

  started = time.perf_counter()
  with open(os.path.join(config.output_dir, RESULTS), "a", encoding="utf-8") as out:

    def on_batch(start: int, results) -> None:
      for row, result in zip(todo[start:start + len(results)], results):
        done[row.index] = result_line(row, result)
        out.write(json.dumps(done[row.index], ensure_ascii=False) + "\n")
      out.flush()
      count = start + len(results)
      logging.info("%d/%d rows decoded (%.1f s)", count, len(todo),
                   time.perf_counter() - started)

    prompts = [model.chat_prompt(row.prompt) if config.chat else row.prompt for row in todo]
    cd.evaluate(model, prompts, [tables[row.constraint] for row in todo],
                answers=[row.answer for row in todo], max_new_tokens=config.max_new_tokens,
                sampling=sampling, seed=config.seed, batch_size=config.batch_size or None,
                devices=devices, on_batch=on_batch, score=make_score(config),
                row_ids=[row.index for row in todo])
