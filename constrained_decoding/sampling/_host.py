"""Host side of every decode driver: one copy of what runs before and after the loop.

`generate`, `generate_stream`, `evaluate`, `generate_speculative` and
`generate_aligned` all check their arguments, encode and left-pad prompts, compile
specs and stack per-row constraints the same way before their jitted loop, and cut,
decode and parse each row the same way after it. Numpy only: nothing here traces.

Names (package-private; `Completion` is public through `cd.Completion`):
  Completion                        one generated sequence: ids, text, value, how it ended.
  check_request(model, prompts, max_new_tokens, sampling)  the shared entry checks.
  check_prompts / check_max_new_tokens / check_sampling / check_table_bucket /
  check_constraint_ids / check_logits_width   single-argument checks.
  encode_prompts(model, prompts)    token ids per prompt (text through `model.encode`).
  prompt_width(encoded)             the bucketed width prompts are left-padded to.
  left_pad(encoded, width)          (tokens [B, width], lengths [B]) as numpy arrays.
  compile_specs(model, constraint, n)  specs compiled for `model.vocab`; each row's spec.
  stack_constraints(...)            one table set for the batch and each row's id.
  completion(vocab, ids, error, spec, row) / completions(...)  rows after the loop.
  spec_value(spec, text, row)       a finished row's Python value under its spec.
"""

import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from constrained_decoding._stacking import stack_tables
from constrained_decoding.errors import DecodingArgumentError
from constrained_decoding.errors import UnsupportedFeatureError
from constrained_decoding.errors import VocabularyMismatchError
from constrained_decoding.lexed_tables import LexedTables
from constrained_decoding.models import _protocol
from constrained_decoding.sampling._methods import SamplingConfig
from constrained_decoding.tables import DEFAULT_MIN_BUCKET, ConstraintTables, bucket_size
from constrained_decoding.vocab._vocabulary import Vocabulary

# Prompts are left-padded to a power of two of at least this many tokens, so that
# prompts of similar lengths share one compiled prefill.
MIN_PROMPT_BUCKET = 16
# Most tokens one request may generate per row: Gemma 3 270M's context length. The
# token buffer and KV cache are allocated for the whole budget up front.
MAX_NEW_TOKENS = 32_768

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Completion:
  """One generated sequence.

  Attributes:
    token_ids: Generated ids, without the end-of-sequence token.
    text: Their text (invalid UTF-8, possible only without a constraint, is replaced).
    finished: An end-of-sequence token ended the row (else it ran out of tokens).
    error: The constraint saw a forbidden token (never expected; a bug if True).
    value: The output as a Python value, when the row's constraint was given as a spec
      and the row finished without error: the parsed JSON for `JsonSchema` and `Json`
      (an instance of the model for `JsonSchema(pydantic model)`), the instance for
      `Dataclass`, the text for `Regex`, `Grammar` and other specs. None otherwise
      (unfinished row, error, tables or no constraint, or a pydantic model whose own
      validators reject a text its schema accepts: logged as a warning).
  """

  token_ids: tuple[int, ...]
  text: str
  finished: bool
  error: bool
  value: Any = None


# ------------------------------------------------------------------ argument checks


def check_max_new_tokens(max_new_tokens, *, name: str = "max_new_tokens") -> int:
  """`max_new_tokens` as an int, if it is one in [1, MAX_NEW_TOKENS]; else raises.

  The bound keeps a typo from sizing a token buffer and KV cache of billions of
  entries: the cache is allocated for the whole budget before the first token.
  """
  if (not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool)
      or not 1 <= max_new_tokens <= MAX_NEW_TOKENS):
    raise DecodingArgumentError(
        f"{name} {max_new_tokens!r} is out of range. Expected an int in [1, "
        f"{MAX_NEW_TOKENS}] (the KV cache is sized for it before decoding starts).")
  return int(max_new_tokens)


def check_sampling(sampling) -> SamplingConfig:
  """`sampling`, if it is a `SamplingConfig` (whose fields it checked); else raises."""
  if not isinstance(sampling, SamplingConfig):
    raise DecodingArgumentError(f"sampling is a {type(sampling).__name__}. Expected a "
                                f"cd.SamplingConfig(temperature=..., top_k=..., top_p=...).")
  return sampling


def check_prompts(prompts, vocab_size: int) -> list:
  """`prompts` as a non-empty list of strings or token-id lists, checked; else raises."""
  if isinstance(prompts, str):
    prompts = [prompts]
  if not isinstance(prompts, Sequence) or isinstance(prompts, bytes):
    raise DecodingArgumentError(f"prompts is a {type(prompts).__name__}. Expected a string "
                                f"or a list of strings (or of token-id lists).")
  if not prompts:
    raise DecodingArgumentError("Got no prompts. Expected a string or a non-empty list of "
                                "strings.")
  for row, prompt in enumerate(prompts):
    if isinstance(prompt, str):
      continue
    if not isinstance(prompt, (list, tuple, np.ndarray)):
      raise DecodingArgumentError(f"Prompt {row} is a {type(prompt).__name__}. Expected a "
                                  f"string or a list of token ids.")
    ids = np.asarray(prompt)
    if ids.ndim != 1 or not len(ids) or (ids.dtype.kind not in "iu") or (
        ids.min() < 0 or ids.max() >= vocab_size):
      raise DecodingArgumentError(
          f"Prompt {row} {prompt!r:.80} is not a non-empty list of token ids. Expected "
          f"ints in [0, {vocab_size}).")
  return list(prompts)


def check_table_bucket(table_bucket) -> int | None:
  """`table_bucket` if it is None or an int >= 1; else raises."""
  if table_bucket is not None and (
      not isinstance(table_bucket, (int, np.integer)) or isinstance(table_bucket, bool)
      or table_bucket < 1):
    raise DecodingArgumentError(
        f"table_bucket {table_bucket!r} is not a size. Expected None or an int >= 1 (a "
        f"power of two such as 256: the smallest padded size of the table axes).")
  return None if table_bucket is None else int(table_bucket)


def check_constraint_ids(constraint_ids, batch: int, num_constraints: int) -> np.ndarray:
  """`constraint_ids` as int32 [batch], each naming one of the stacked constraints.

  Out-of-range ids would be clamped on the device: the row would silently follow
  another constraint.
  """
  ids = np.asarray(constraint_ids)
  if ids.shape != (batch,) or ids.dtype.kind not in "iu" or (
      batch and (ids.min() < 0 or ids.max() >= num_constraints)):
    raise DecodingArgumentError(
        f"constraint_ids {constraint_ids!r:.80} do not name a constraint per row. "
        f"Expected {batch} ints in [0, {num_constraints}).")
  return ids.astype(np.int32)


def check_logits_width(tables: ConstraintTables | LexedTables, model, where: str = "The constraint") -> None:
  """Raises unless the tables were compiled for the model's vocabulary (fingerprints,
  when both are known) and its logits cover every token id of the tables' vocabulary.

  Wider logits are fine (padded embeddings: `mask_logits` forbids the extra columns);
  narrower ones would cut the mask, so a row could have no allowed token.
  """
  model_vocab = getattr(model, "vocab", None)
  fingerprint = getattr(model_vocab, "fingerprint", "")
  if tables.vocab_fingerprint and fingerprint and tables.vocab_fingerprint != fingerprint:
    raise VocabularyMismatchError(
        f"{where} was compiled for the vocabulary with fingerprint "
        f"{tables.vocab_fingerprint}, but the model's vocabulary has {fingerprint}. "
        f"Expected tables compiled for this model's vocabulary (cd.Compiler(model.vocab)).")
  width = model.network.logits_width
  if tables.vocab_size > width:
    raise VocabularyMismatchError(
        f"{where} was compiled for a vocabulary of {tables.vocab_size} tokens but the "
        f"model has {width} logits. Expected tables compiled for this "
        f"model's vocabulary (cd.Compiler(model.vocab)), whose width is at most the "
        f"logits'.")


def check_request(model, prompts, max_new_tokens, sampling) -> int:
  """The host-boundary checks shared by every entry point; returns max_new_tokens.

  The model first (`models.check_model`): every later check reads its protocol.
  """
  _protocol.check_model(model)
  check_prompts(prompts, model.network.logits_width)
  check_sampling(sampling)
  return check_max_new_tokens(max_new_tokens)


def num_prompts(prompts) -> int:
  """How many prompts `prompts` holds (a lone string is one)."""
  return 1 if isinstance(prompts, str) else len(prompts)


# ------------------------------------------------------------------ before the loop


def encode_prompts(model, prompts) -> list[list[int]]:
  """Token ids of each prompt: text through `model.encode`, id lists as ints.

  Raises:
    ValueError: A text prompt that encodes to no token.
  """
  if isinstance(prompts, str):
    prompts = [prompts]
  encoded = [model.encode(p) if isinstance(p, str) else p for p in prompts]
  encoded = [[int(t) for t in ids] for ids in encoded]
  for row, ids in enumerate(encoded):
    if not ids:
      raise ValueError(f"Prompt {row} has no tokens. Expected at least one token.")
  return encoded


def prompt_width(encoded: Sequence[Sequence[int]]) -> int:
  """The width prompts are left-padded to: the longest, rounded up to a power of two
  of at least `MIN_PROMPT_BUCKET` (so that similar prompts share a compiled prefill)."""
  return bucket_size(max(map(len, encoded)), MIN_PROMPT_BUCKET)


def left_pad(encoded: Sequence[Sequence[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens int32 [B, width] with each prompt at the right end, lengths int32 [B]).

  Left padding puts every row's last prompt token in the last column, where the
  prefill reads the next-token logits; the padding gets position -1 there.
  """
  tokens = np.zeros((len(encoded), width), np.int32)
  for i, ids in enumerate(encoded):
    tokens[i, width - len(ids):] = ids
  return tokens, np.array([len(ids) for ids in encoded], np.int32)


def is_spec(constraint) -> bool:
  """Whether `constraint` is a spec (anything `Compiler.compile` takes), not tables."""
  return (not isinstance(constraint, (ConstraintTables, LexedTables))
          and callable(getattr(constraint, "to_ir", None))
          and callable(getattr(constraint, "describe", None)))


def compile_specs(model, constraint, count: int):
  """Compiles spec constraints for the model's vocabulary (host, memoized per vocabulary).

  Returns:
    (constraint with every spec replaced by its tables, the spec of each of the
    `count` rows or None when no spec was given).
  """
  if isinstance(constraint, (list, tuple)):
    if not any(is_spec(c) for c in constraint):
      return constraint, None
    # A lazy import: host code, loaded only when a spec is given (no pynini until a
    # spec is actually compiled), so that importing `sampling` stays device-only.
    from constrained_decoding import _compiler  # pylint: disable=g-import-not-at-top

    compiler = _compiler.compiler_for(model.vocab)
    tables = [compiler.compile(c) if is_spec(c) else c for c in constraint]
    return tables, [c if is_spec(c) else None for c in constraint]
  if not is_spec(constraint):
    return constraint, None
  from constrained_decoding import _compiler  # pylint: disable=g-import-not-at-top

  return _compiler.compiler_for(model.vocab).compile(constraint), [constraint] * count


def stack_constraints(model, constraint, constraint_ids, batch: int,
                      table_bucket: int | None = None):
  """One table set for the batch, and the constraint id of each row.

  Args:
    model: The model (its vocabulary and logits width are checked against the tables).
    constraint: Tables for all rows, a list with one per row (stacked here), or None.
    constraint_ids: With stacked tables, which constraint each row follows.
    batch: Number of rows.
    table_bucket: Pads the tables to this bucket when given (see `generate`).

  Returns:
    (tables or None, int32 [batch] ids: zeros when unconstrained).

  Raises:
    UnsupportedFeatureError: A per-row list that holds `LexedTables` (a grammar with a
      lexer) beside other constraints: they stack only with each other. `table_bucket`
      does not pad `LexedTables`.
  """
  constraint, lexed_ids = _lexed_rows(constraint)
  if lexed_ids is not None:
    if len(lexed_ids) != batch:
      raise ValueError(
          f"Got {len(lexed_ids)} constraints for {batch} prompts. Expected one per prompt "
          f"(or a single LexedTables for all).")
    constraint_ids = lexed_ids
  elif isinstance(constraint, (list, tuple)):
    if len(constraint) != batch:
      raise ValueError(
          f"Got {len(constraint)} constraints for {batch} prompts. Expected one per prompt "
          f"(or a single ConstraintTables for all).")
    constraint = stack_tables(constraint, min_bucket=table_bucket or DEFAULT_MIN_BUCKET)
    constraint_ids = np.arange(batch, dtype=np.int32)
  elif isinstance(constraint, ConstraintTables) and table_bucket is not None:
    constraint = stack_tables([constraint], min_bucket=table_bucket)  # pads, keeps ids
  if constraint is None:
    return None, np.zeros(batch, np.int32)
  if not isinstance(constraint, (ConstraintTables, LexedTables)):
    raise TypeError(f"constraint is a {type(constraint).__name__}. Expected "
                    f"ConstraintTables from cd.Compiler(vocab).compile(spec), a spec "
                    f"(cd.Regex, cd.JsonSchema, cd.Json, cd.Dataclass, cd.Grammar), or a "
                    f"list of them with one per prompt.")
  check_logits_width(constraint, model)
  if constraint_ids is None:
    constraint_ids = np.zeros(batch, np.int32)
  return constraint, check_constraint_ids(constraint_ids, batch, constraint.num_constraints)


def _lexed_rows(constraint):
  """A per-row list of grammars with a lexer as (tables, each row's constraint id): each
  distinct `LexedTables` stacked once (a spec repeated per row compiles to one memoized
  object), one alone as it is; anything else as (`constraint`, None).

  Raises:
    UnsupportedFeatureError: the list mixes `LexedTables` with other constraints.
  """
  if not isinstance(constraint, (list, tuple)) or not any(
      isinstance(c, LexedTables) for c in constraint):
    return constraint, None
  kinds = [isinstance(c, LexedTables) for c in constraint]
  if not all(kinds):
    row = next(i for i, k in enumerate(kinds) if k != kinds[0])
    raise UnsupportedFeatureError(
        f"Constraint {row} differs from constraint 0 in kind in a per-row list that holds"
        f" tables of a grammar with a lexer (LexedTables): one is, the other is not."
        f" Expected grammars with a lexer for every row or for none: they are stepped by"
        f" their own runtime and stack only with each other. Run the rows in separate"
        f" generate calls.")
  index: dict[int, int] = {}
  distinct = []
  for c in constraint:
    if id(c) not in index:
      index[id(c)] = len(distinct)
      distinct.append(c)
  ids = np.asarray([index[id(c)] for c in constraint], np.int32)
  return (distinct[0] if len(distinct) == 1 else stack_tables(distinct)), ids


# ------------------------------------------------------------------- after the loop


def spec_value(spec, text: str, row: int):
  """The Python value of a finished row's text under `spec` (see `Completion.value`)."""
  from constrained_decoding import constraints  # pylint: disable=g-import-not-at-top

  if not isinstance(spec, (constraints.JsonSchema, constraints.Json, constraints.Dataclass)):
    return text
  try:
    if isinstance(spec, constraints.JsonSchema) and spec.model is not None:
      json.loads(text)  # Not JSON: a bug, reported below. JSON the model rejects: None.
      try:
        return spec.parse(text)
      except ValueError as e:
        _LOG.warning("Row %d: %s rejects the generated JSON %r (validators its JSON "
                     "Schema does not express): %s", row, spec.model.__name__, text[:60], e)
        return None
    return spec.parse(text)
  except ValueError as e:
    raise ValueError(
        f"Row {row} finished under {spec.describe()} but its text {text[:60]!r} does not "
        f"parse: {e}. Expected every finished row to parse; this is a bug in the "
        f"constraint, please report it with the spec.") from e


def completion(vocab: Vocabulary, ids: Sequence[int] | np.ndarray, error: bool | np.bool_,
               spec, row: int) -> Completion:
  """Row `row`'s `Completion` from its generated ids (cut at the first end of sequence)."""
  eos = set(vocab.eos_ids)
  ids = [int(t) for t in ids]
  end = next((k for k, t in enumerate(ids) if t in eos), None)
  kept = tuple(ids if end is None else ids[:end])
  text = vocab.decode(kept).decode("utf-8", errors="replace")
  value = None
  if spec is not None and end is not None and not error:
    value = spec_value(spec, text, row)
  return Completion(token_ids=kept, text=text, finished=end is not None, error=bool(error),
                    value=value)


def completions(vocab: Vocabulary, tokens: np.ndarray, errors: np.ndarray,
                specs: Sequence[Any] | None = None) -> list[Completion]:
  """One `Completion` per row of `tokens` [B, N] (the loop's buffer, cut to the budget)."""
  return [completion(vocab, row, err, specs[i] if specs is not None else None, i)
          for i, (row, err) in enumerate(zip(tokens, errors))]
