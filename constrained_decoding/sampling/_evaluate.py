"""Batch evaluation: many prompts, each with its own constraint, sharded over devices.

The rows of a batch are split over a 1-D device mesh with `jax.shard_map`: the model's
weights and the (stacked) constraint tables are replicated, and each device runs the
same prefill and `lax.while_loop` decode as `generate` on its share of the rows (no
communication until the results are gathered). Every row samples with its own key,
`fold_in(PRNGKey(seed), row index)`, so a row's output does not depend on how many
devices there are, on the batch size, or on which other rows share its batch: the
sharded job returns what the single-device job returns.

Public names:
  evaluate(model, prompts, constraints, ...)  -> Evaluation
  Evaluation       per-row results and the conformance summary.
  EvaluationRow    one prompt's completion, whether the constraint accepts it, and
                   whether it matches the reference answer.

Scoring: by default a row is correct when its text, stripped, equals the reference
answer; `answer_key="Final Answer"` compares that field of the row's JSON object instead
(`{"Final Answer": "B", ...}` against `B`), and `score=fn` lets `fn(completion, answer)`
decide (e.g. a number after `####`).
"""

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from constrained_decoding.errors import DecodingArgumentError, UnsupportedFeatureError
from constrained_decoding.models import _protocol
from constrained_decoding.sampling import _loop
from constrained_decoding.sampling import _host
from constrained_decoding.sampling._host import Completion
from constrained_decoding.sampling._methods import SamplingConfig
from constrained_decoding._stacking import stack_tables
from constrained_decoding.lexed_tables import LexedTables
from constrained_decoding.tables import ConstraintTables, bucket_size

_AXIS = "rows"
_ROWS_PER_DEVICE = 8  # default batch per device


@dataclasses.dataclass(frozen=True)
class EvaluationRow:
  """The result for one prompt.

  Attributes:
    completion: The generated tokens and text (see `Completion`).
    conforms: The constraint accepts the whole output: the row ended with end of
      sequence where the constraint allows the input to end, and saw no forbidden
      token. False for a row that ran out of tokens.
    correct: Whether the completion matches the reference answer (see `evaluate`'s
      `score` and `answer_key`; by default the stripped text equals the stripped
      answer); None when no answer was given.
  """

  completion: Completion
  conforms: bool
  correct: bool | None = None


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """Per-row results of `evaluate`, in prompt order, and their summary.

  ```python
  result = cd.evaluate(model, prompts, tables, answers=answers)
  result.summary()   # {'rows': 64, 'conformance': 1.0, 'accuracy': 0.25, ...}
  ```

  Attributes:
    rows: One `EvaluationRow` per prompt.
    devices: Number of devices the rows were sharded over.
    model_calls: Decode-loop model calls, summed over batches and devices (prefill
      excluded); with jump-forward it is below the number of generated tokens.
  """

  rows: tuple[EvaluationRow, ...]
  devices: int
  model_calls: int

  def summary(self) -> dict:
    """Conformance figures: fractions of rows and counts (accuracy: None without answers)."""
    n = len(self.rows)
    answered = [r.correct for r in self.rows if r.correct is not None]
    return {
        "rows": n,
        "conformance": sum(r.conforms for r in self.rows) / n if n else 0.0,
        "finished": sum(r.completion.finished for r in self.rows),
        "unfinished": sum(not r.completion.finished for r in self.rows),
        "constraint_errors": sum(r.completion.error for r in self.rows),
        "answered": len(answered),
        "accuracy": sum(answered) / len(answered) if answered else None,
        "mean_tokens": (sum(len(r.completion.token_ids) for r in self.rows) / n) if n else 0.0,
        "devices": self.devices,
        "model_calls": self.model_calls,
    }


@functools.partial(jax.jit, static_argnames=("mesh", "network", "sampling", "buffer",
                                             "cache_len"))
def _run_sharded(params, tables, prompt_tokens, prompt_lengths, constraint_ids, keys, limit,
                 eos_ids, temperature, top_p, *, mesh, network, sampling, buffer, cache_len):
  """Prefill and decode, each device on its rows; returns per-row results, gathered."""

  def shard(params, tables, prompt_tokens, prompt_lengths, constraint_ids, keys, limit,
            eos_ids, temperature, top_p):
    state = _loop.prefill(params, tables, prompt_tokens, prompt_lengths, constraint_ids,
                          keys, network=network, max_new_tokens=buffer, cache_len=cache_len)
    state = _loop.decode(params, tables, state, limit, eos_ids, temperature, top_p,
                         network=network, sampling=sampling)
    return (state.tokens, state.constraint.done, state.constraint.error, state.calls[None])

  rows, whole = PartitionSpec(_AXIS), PartitionSpec()
  # No collectives inside, so the replicated/varying type check (which would ask for
  # `pcast`s on the loop carry's fresh arrays) buys nothing here.
  return jax.shard_map(
      shard, mesh=mesh,
      in_specs=(whole, whole, rows, rows, rows, rows, whole, whole, whole, whole),
      out_specs=rows, check_vma=False)(params, tables, prompt_tokens, prompt_lengths, constraint_ids, keys,
                      limit, eos_ids, temperature, top_p)


def _stack_per_row(constraints, n: int, model
                   ) -> tuple[ConstraintTables | LexedTables, np.ndarray]:
  """One table set for the whole job (distinct tables stacked once) and each row's id.

  Grammars with a lexer (`LexedTables`) stack only with each other
  (`UnsupportedFeatureError` names the first row of the other kind)."""
  if isinstance(constraints, (ConstraintTables, LexedTables)):
    constraints = [constraints] * n
  constraints = list(constraints)
  if len(constraints) != n:
    raise ValueError(f"Got {len(constraints)} constraints for {n} prompts. Expected one "
                     f"per prompt (or a single ConstraintTables for all).")
  index: dict[int, int] = {}
  distinct = []
  ids = np.zeros(n, np.int32)
  for row, tables in enumerate(constraints):
    if not isinstance(tables, (ConstraintTables, LexedTables)):
      raise TypeError(f"Constraint of prompt {row} is a {type(tables).__name__}. Expected "
                      f"ConstraintTables from cd.Compiler(vocab).compile(spec), or a spec "
                      f"(cd.Regex, cd.JsonSchema, cd.Json, cd.Dataclass, cd.Grammar).")
    _host.check_logits_width(tables, model, f"The constraint of prompt {row}")
    if tables.num_constraints != 1:
      raise ValueError(f"Constraint of prompt {row} stacks {tables.num_constraints} "
                       f"constraints. Expected one compiled constraint per prompt (evaluate "
                       f"stacks them itself).")
    if id(tables) not in index:
      index[id(tables)] = len(distinct)
      distinct.append(tables)
    ids[row] = index[id(tables)]
  kinds = [isinstance(t, LexedTables) for t in distinct]
  if not all(kinds) and any(kinds):
    row = int(np.flatnonzero(np.asarray(kinds)[ids] != kinds[0])[0])
    raise UnsupportedFeatureError(
        f"The constraint of prompt {row} differs from prompt 0's in kind in a job that "
        f"holds a grammar with a lexer (LexedTables): one is, the other is not. Expected "
        f"grammars with a lexer for every row or for none: they are stepped by their own "
        f"runtime and stack only with each other. Evaluate those rows in a job of their "
        f"own.")
  return (distinct[0] if len(distinct) == 1 else stack_tables(distinct)), ids


Scorer = Callable[[Completion, str], bool]


def exact_match(completion: Completion, answer: str) -> bool:
  """The default score: the completion's text, stripped, equals the answer, stripped."""
  return completion.text.strip() == str(answer).strip()


def _field(value: Any, key: str) -> Any:
  """`value[key]` of a mapping, `value.key` of an object (dataclass, pydantic), or None."""
  if isinstance(value, dict):
    return value.get(key)
  return getattr(value, key, None) if not isinstance(value, (str, bytes, list)) else None


def field_match(key: str) -> Scorer:
  """A score comparing field `key` of the completion's JSON object with the answer.

  The object is the row's parsed `value` when it has one (rows given as a spec), else
  `json.loads` of its text; a row that is not such an object, or lacks the field, is
  wrong. Values compare as stripped strings, so `{"Final Answer": 42}` matches "42".
  """

  def score(completion: Completion, answer: str) -> bool:
    value = completion.value
    if value is None or isinstance(value, str):
      try:
        value = json.loads(completion.text)
      except ValueError:
        return False
    found = _field(value, key)
    return found is not None and str(found).strip() == str(answer).strip()

  return score


def _scorer(score: Any, answer_key: Any) -> Scorer:
  """The row scorer for `evaluate`'s `score` / `answer_key` (at most one of them).

  Takes `Any`: it checks what users pass, so a wrong type is its error to report.
  """
  if score is not None and answer_key is not None:
    raise DecodingArgumentError(
        f"evaluate got both score={score!r} and answer_key={answer_key!r}. Expected at "
        f"most one: answer_key compares a JSON field, score decides by itself.")
  if score is not None and not callable(score):
    raise DecodingArgumentError(f"score is a {type(score).__name__}. Expected a function "
                                f"(completion, answer) -> bool.")
  if answer_key is not None:
    if not isinstance(answer_key, str):
      raise DecodingArgumentError(f"answer_key is {answer_key!r}. Expected a string, the "
                                  f"name of a field of the JSON answer.")
    return field_match(answer_key)
  return score or exact_match


def _row_result(model, tokens: np.ndarray, done: bool, error: bool, answer: str | None,
                spec: Any, row: int, scorer: Scorer = exact_match) -> EvaluationRow:
  """One row's `Completion` (built as every driver builds it), conformance and score."""
  completion = _host.completion(model.vocab, tokens, error, spec, row)
  correct = None if answer is None else bool(scorer(completion, answer))
  return EvaluationRow(completion=completion, conforms=bool(done and not error),
                       correct=correct)


def _check_row_ids(row_ids: Sequence[int] | None, n: int) -> np.ndarray:
  """`row_ids` as int32 `[n]` (default 0..n-1); DecodingArgumentError when malformed."""
  if row_ids is None:
    return np.arange(n, dtype=np.int32)
  ids = np.asarray(row_ids)
  if ids.shape != (n,) or not np.issubdtype(ids.dtype, np.integer) or (
      n and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max)):
    raise DecodingArgumentError(
        f"row_ids has shape {ids.shape} and dtype {ids.dtype}. Expected {n} non-negative "
        f"int32 indices, one per prompt.")
  return ids.astype(np.int32)


def evaluate(
    model,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    constraints: Any,
    *,
    answers: Sequence[str | None] | None = None,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int = 0,
    batch_size: int | None = None,
    devices: Sequence[jax.Device] | None = None,
    on_batch: Callable[[int, Sequence[EvaluationRow]], None] | None = None,
    score: Scorer | None = None,
    answer_key: str | None = None,
    row_ids: Sequence[int] | None = None,
) -> Evaluation:
  """Decodes every prompt under its constraint, sharded over devices, and scores it.

  ```python
  tables = [compiler.compile(cd.Regex(r"\\d+")), compiler.compile(cd.Regex("yes|no"))]
  result = cd.evaluate(model, ["2 + 2 = ", "Is ice cold? "], tables, answers=["4", "yes"])
  print(result.summary()["conformance"], result.rows[0].completion.text)
  ```

  Prompts are processed `batch_size` at a time (rounded up to a multiple of the device
  count; the last batch is padded with copies of its last row), and every batch has the
  same shapes, so the job compiles once. All distinct constraints are stacked into one
  table set up front (`stack_tables`), replicated on every device; each row follows its
  own through `constraint_ids`.

  Args:
    model: A `models.LanguageModel` (`models.Gemma3`, or your own: docs/models.md).
    prompts: Text prompts (BOS is prepended) or lists of token ids used as given.
    constraints: One constraint per prompt, or one for all: `ConstraintTables`, or a
      spec (`Regex`, `JsonSchema`, `Json`, `Dataclass`, `Grammar`), compiled on the host
      for `model.vocab` as `generate` does; rows with a spec get a parsed `value`.
      Grammars with a lexer (`LexedTables`) mix only with each other.
    answers: Optional reference answers (None entries: no answer for that row).
    max_new_tokens: Most tokens per row (the end-of-sequence token counts).
    sampling: Greedy (default), temperature, top-k, top-p, jump-forward.
    seed: Row i samples with `fold_in(PRNGKey(seed), row_ids[i])`.
    batch_size: Rows per sharded call (default: 8 per device).
    devices: Devices to shard over (default: `jax.devices()`).
    on_batch: Called after each batch with the index of its first row and its results
      (for progress bars and incremental output).
    score: `score(completion, answer) -> bool` decides `correct` for rows with an
      answer (default: stripped text equals stripped answer).
    answer_key: Compare this field of the row's JSON object with the answer instead of
      the whole text (`field_match`); not together with `score`.
    row_ids: Each row's sampling index (default: 0..n-1), so that a job that resumes
      with the rows left over samples them as the full run would.

  Returns:
    An `Evaluation`: one row per prompt, in order, and `summary()`.

  Raises:
    DecodingArgumentError: Bad prompts, `max_new_tokens` outside [1, MAX_NEW_TOKENS]
      or a bad `sampling` (before any compilation).
    VocabularyMismatchError: Tables for a vocabulary wider than the model's logits.
    UnsupportedFeatureError: Grammars with a lexer for some rows and other
      constraints for others (they stack only with each other).
    ValueError, TypeError: On mismatched counts or other bad arguments (before any
      decoding).
  """
  _protocol.check_model(model)
  prompts = _host.check_prompts(prompts, model.network.logits_width)
  n = len(prompts)
  max_new_tokens = _host.check_max_new_tokens(max_new_tokens)
  _host.check_sampling(sampling)
  scorer = _scorer(score, answer_key)
  row_ids = _check_row_ids(row_ids, n)
  if answers is not None and len(answers) != n:
    raise ValueError(f"Got {len(answers)} answers for {n} prompts. Expected one per prompt "
                     f"(None where there is no answer).")
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError("evaluate got an empty device list. Expected at least one device.")
  if batch_size is not None and batch_size < 1:
    raise ValueError(f"batch_size {batch_size} is below 1. Expected >= 1.")
  constraints, specs = _host.compile_specs(model, constraints, n)
  tables, constraint_ids = _stack_per_row(constraints, n, model)

  encoded = _host.encode_prompts(model, prompts)
  width = _host.prompt_width(encoded)
  buffer = bucket_size(max_new_tokens, 16)
  num_devices = len(devices)
  per_call = batch_size or _ROWS_PER_DEVICE * num_devices
  per_call = -(-per_call // num_devices) * num_devices  # a multiple of the device count

  mesh = Mesh(np.array(devices), (_AXIS,))
  replicated = NamedSharding(mesh, PartitionSpec())
  params = jax.device_put(model.params, replicated)
  tables = jax.device_put(tables, replicated)
  eos_ids = jnp.asarray(model.vocab.eos_ids, jnp.int32)
  base_key = jax.random.PRNGKey(seed)
  keys = np.asarray(jax.vmap(lambda i: jax.random.fold_in(base_key, i))(jnp.asarray(row_ids)))
  static = dict(mesh=mesh, network=_protocol.decode_network(model),
                sampling=sampling.static_part(),
                buffer=buffer, cache_len=width + buffer)

  results: list[EvaluationRow] = []
  calls = 0
  for start in range(0, n, per_call):
    rows = list(range(start, min(start + per_call, n)))
    rows += [rows[-1]] * (per_call - len(rows))  # same shapes for every batch
    prompt_tokens, lengths = _host.left_pad([encoded[row] for row in rows], width)
    tokens, done, error, batch_calls = _run_sharded(
        params, tables, prompt_tokens, lengths, constraint_ids[rows], keys[rows],
        jnp.int32(max_new_tokens), eos_ids, jnp.float32(sampling.temperature),
        jnp.float32(sampling.top_p), **static)
    tokens, done, error = (np.asarray(x) for x in (tokens, done, error))
    calls += int(np.asarray(batch_calls).sum())
    count = min(per_call, n - start)
    batch = [_row_result(model, tokens[i, :max_new_tokens], bool(done[i]), bool(error[i]),
                         None if answers is None else answers[start + i],
                         None if specs is None else specs[start + i], start + i, scorer)
             for i in range(count)]
    results.extend(batch)
    if on_batch is not None:
      on_batch(start, batch)
  return Evaluation(rows=tuple(results), devices=num_devices, model_calls=calls)
