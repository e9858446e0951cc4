"""Constrained generation: prefill, then decode inside one `lax.while_loop`.

The constraint state is threaded through the loop carry; each iteration masks the
logits, samples, advances the constraint and runs the model on the new token. No host
callback runs inside the loop: the host work (checking arguments, tokenizing and
left-padding prompts before, detokenizing and parsing after, or between chunks when
streaming) is `_host`'s, shared with the other drivers.

The model is any `models.LanguageModel`: the loop calls `network.init_cache` and
`network.apply` only, with the network static and the params traced.

Public names:
  generate(model, prompts, ...)         -> list[Completion]
  generate_stream(model, prompts, ...)  yields (row, bytes) as tokens are produced, then
                                        (row, Completion) once per row as it ends.

The jitted loop itself is `_loop`'s; the host work before and after it is `_host`'s.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from constrained_decoding.models import _protocol
from constrained_decoding.errors import DecodingArgumentError
from constrained_decoding.sampling import _host
from constrained_decoding.sampling import _loop
from constrained_decoding.sampling._host import Completion
from constrained_decoding.sampling._methods import SamplingConfig
from constrained_decoding.tables import bucket_size

# Re-exported for the modules, tests and benchmarks that imported them from here.
MAX_NEW_TOKENS = _host.MAX_NEW_TOKENS
check_max_new_tokens = _host.check_max_new_tokens
_value = _host.spec_value
DecodeState = _loop.DecodeState


def _prepare(model, prompts, constraint, constraint_ids, max_new_tokens, seed,
             table_bucket: int | None = None):
  """Host preparation (`_host`: encode, left-pad to a bucket, stack per-row constraints,
  padded to `table_bucket` when given; see `generate`), then the prefill.

  Returns:
    (the tables on the device or None, the loop's initial `DecodeState`, eos ids).
  """
  prompts = _host.check_prompts(prompts, model.network.logits_width)
  encoded = _host.encode_prompts(model, prompts)
  width = _host.prompt_width(encoded)
  tokens, lengths = _host.left_pad(encoded, width)
  tables, ids = _host.stack_constraints(model, constraint, constraint_ids, len(encoded),
                                        table_bucket)
  if tables is not None:
    tables = jax.device_put(tables)  # once, not at every call
  buffer = bucket_size(max_new_tokens, 16)
  eos_ids = jnp.asarray(model.vocab.eos_ids, jnp.int32)
  state = _loop.prefill(model.params, tables, jnp.asarray(tokens), jnp.asarray(lengths),
                        jnp.asarray(ids), jax.random.PRNGKey(seed),
                        network=_protocol.decode_network(model), max_new_tokens=buffer,
                        cache_len=width + buffer)
  return tables, state, eos_ids


def _decode_until(model, tables, state: DecodeState, limit: int, eos_ids,
                  sampling: SamplingConfig) -> DecodeState:
  """Runs the jitted loop until `limit` tokens exist (values as arrays: no recompiles)."""
  return _loop.decode(model.params, tables, state, jnp.int32(limit), eos_ids,
                      jnp.float32(sampling.temperature), jnp.float32(sampling.top_p),
                      network=_protocol.decode_network(model),
                      sampling=sampling.static_part())


def _completions(model, state: DecodeState, count: int,
                 specs: Sequence[Any] | None = None) -> list[Completion]:
  """Each row's `Completion` from the loop's final state (its first `count` tokens)."""
  return _host.completions(model.vocab, np.asarray(state.tokens)[:, :count],
                           np.asarray(state.constraint.error), specs)


def generate(
    model,
    prompts: str | Sequence[str] | Sequence[Sequence[int]],
    *,
    constraint: Any = None,
    constraint_ids: Sequence[int] | None = None,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int = 0,
    table_bucket: int | None = None,
) -> list[Completion]:
  """Generates one completion per prompt, each following its constraint.

  ```python
  model = cd.models.Gemma3.from_gguf()
  tables = cd.Compiler(model.vocab).compile(cd.Regex(r"(yes|no)"))
  [answer] = cd.generate(model, "Is water wet? Answer: ", constraint=tables)
  [reply] = cd.generate(model, "JSON: ", constraint=cd.JsonSchema({"type": "integer"}))
  reply.value  # e.g. 42: the parsed output (None if the row did not finish)
  ```

  Args:
    model: A `models.LanguageModel`: `models.Gemma3`, or your own (docs/models.md).
    prompts: Text prompts (BOS is prepended), or lists of token ids used as given.
    constraint: Tables or a spec (`Regex`, `JsonSchema`, `Json`, `Dataclass`,
      `Grammar`) for all rows; a list with one per prompt (stacked here); or None for
      unconstrained decoding. Specs are compiled on the host for `model.vocab` by a
      `Compiler` shared per vocabulary (and memoized there), and give each
      `Completion` its parsed `value`.
    constraint_ids: With stacked tables, which constraint each row follows.
    max_new_tokens: Most tokens to generate per row (the end-of-sequence token counts).
    sampling: Greedy (default), temperature, top-k, top-p.
    seed: Random seed for sampling.
    table_bucket: Smallest padded size of the tables' state, edge-group, edge and mask
      axes (a power of two, e.g. 256), applied here to tables, compiled specs and
      per-row lists alike. Every constraint up to that size then has the same table
      shapes, so the decode loop compiled for one serves the others (see Compilation).
      None (default): tables keep the padding they were compiled with
      (`CompileOptions.min_bucket`, 8 unless set), and per-row lists are stacked with 8.

  Compilation. Each call runs two compiled programs, each compiled on the first call
  with shapes it has not seen and reused after:

  - the prefill, for (batch size, prompt width, output buffer). Prompts are left-padded
    to a power of two of at least 16 tokens, and the token buffer and KV cache are
    sized for `max_new_tokens` rounded up to a power of two of at least 16. It does not
    see the constraint: another constraint never recompiles it.
  - the decode loop, for the same shapes, the table shapes (`tables.shape_key`) and
    the static part of `sampling` (greedy or not, `top_k`, top-p on or off,
    `jump_forward`; temperature and the top-p value are not part of it).

  So a new constraint recompiles only the decode loop, and only when its tables land in
  a bucket not seen before (plus a tiny program that initialises the constraint state).
  With a fixed `table_bucket` that covers every constraint of a job, nothing is
  compiled after the first call, at the cost of padding (device memory: a mask row is
  V / 8 bytes, 32 KiB for Gemma 3). It fixes the axes that grow with a constraint's
  size; tables still differ in shape when they differ in kind: the number of stacked
  constraints (a per-row list has one per row), terminal edges (free text and string
  bodies), counted repetitions (`{n,m}`, `maxLength`), and push-down grammars (stack
  depth). Equal `shape_key`s share one compiled loop.

  Returns:
    One `Completion` per prompt, in order.

  Raises:
    DecodingArgumentError: Bad prompts, `max_new_tokens` outside [1, MAX_NEW_TOKENS],
      `table_bucket` not an int >= 1,
      or `sampling` not a `SamplingConfig` (before any compilation or device work).
    VocabularyMismatchError: Tables for a vocabulary wider than the model's logits.
    ConstraintError: A spec that does not compile (its subclasses say why).
  """
  max_new_tokens = _host.check_request(model, prompts, max_new_tokens, sampling)
  table_bucket = _host.check_table_bucket(table_bucket)
  constraint, specs = _host.compile_specs(model, constraint, _host.num_prompts(prompts))
  tables, state, eos_ids = _prepare(model, prompts, constraint, constraint_ids,
                                    max_new_tokens, seed, table_bucket)
  state = _decode_until(model, tables, state, max_new_tokens, eos_ids, sampling)
  return _completions(model, state, max_new_tokens, specs)


def generate_stream(
    model,
    prompts: str | Sequence[str],
    *,
    constraint: Any = None,
    constraint_ids: Sequence[int] | None = None,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int = 0,
    chunk_size: int = 1,
    table_bucket: int | None = None,
) -> Iterator[tuple[int, bytes | Completion]]:
  """Like `generate`, but yields `(row, new bytes)` every `chunk_size` tokens, and then
  `(row, Completion)` once per row, as soon as that row ends.

  ```python
  for row, item in cd.generate_stream(model, prompts, constraint=spec):
    if isinstance(item, cd.Completion):   # the row is over: item.finished, item.value
      ...
    else:
      buffers[row] += item                # bytes: decode once the row is over
  ```

  The same jitted loop runs with a growing token limit, so the host sees tokens between
  chunks without any callback inside the loop. Bytes (not text) are yielded because a
  token may end inside a multi-byte character; buffer and decode them at the end, or
  take the final `Completion`'s `text`. The final item of each row is its `Completion`,
  exactly as `generate` returns it: `finished` tells a row that produced an
  end-of-sequence token from one cut off by `max_new_tokens` (whose text is only a
  prefix of the constraint's language, so it has no `value`). A row's `Completion` is
  yielded when its end-of-sequence token arrives, or after the last chunk for rows cut
  off; its bytes always come before it. `constraint` and `table_bucket` take what
  `generate` takes (specs are compiled the same way, and the prefill and decode loop
  are compiled and reused as `generate` describes), and arguments are checked as `generate` checks them,
  before anything is compiled.
  """
  max_new_tokens = _host.check_request(model, prompts, max_new_tokens, sampling)
  if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
    raise DecodingArgumentError(f"chunk_size {chunk_size!r} is not a count. Expected an "
                                f"int >= 1.")
  table_bucket = _host.check_table_bucket(table_bucket)
  constraint, specs = _host.compile_specs(model, constraint, _host.num_prompts(prompts))
  tables, state, eos_ids = _prepare(model, prompts, constraint, constraint_ids,
                                    max_new_tokens, seed, table_bucket)
  eos = set(model.vocab.eos_ids)
  batch = state.tokens.shape[0]
  emitted = 0
  ids = [[] for _ in range(batch)]  # each row's tokens so far, up to its end of sequence
  finished = np.zeros(batch, bool)
  while emitted < max_new_tokens and not finished.all():
    limit = min(emitted + chunk_size, max_new_tokens)
    state = _decode_until(model, tables, state, limit, eos_ids, sampling)
    produced = int(state.step)
    new = np.asarray(state.tokens[:, emitted:produced])
    errors = np.asarray(state.constraint.error)
    for row in range(new.shape[0]):
      for t in new[row]:
        if finished[row]:
          break
        ids[row].append(int(t))
        if int(t) in eos:
          finished[row] = True
          yield row, _host.completion(model.vocab, ids[row], errors[row],
                                      specs[row] if specs is not None else None, row)
          break
        yield row, model.vocab.decode([int(t)])
    if produced == emitted:
      break
    emitted = produced
  errors = np.asarray(state.constraint.error)
  for row in np.flatnonzero(~finished):
    yield int(row), _host.completion(model.vocab, ids[row], errors[row],
                                     specs[row] if specs is not None else None, int(row))
