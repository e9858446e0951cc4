"""generate compiles the model's prefill once per prompt shape, whatever the constraint,
and nothing at all for another constraint once the table bucket is fixed.

Compilations are counted, not timed: every XLA compilation reports
`/jax/core/compile/backend_compile_duration` to `jax.monitoring` with the name of the
jitted function, and the tests collect those names around the second call.
"""

import contextlib
import re

import jax
import pytest

import constrained_decoding as cd
from constrained_decoding.errors import DecodingArgumentError

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_SMALL = r"(yes|no)"
_LARGE = r"Red|Orange|Yellow|Green|Blue|Indigo|Violet"


@contextlib.contextmanager
def _compiles():
  """Yields the list of names of the functions XLA compiles inside the block."""
  names = []

  def listen(event, duration, **kwargs):
    del duration
    if event == _BACKEND_COMPILE:
      names.append(str(kwargs.get("fun_name", "?")))

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    yield names
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


@pytest.fixture(scope="module")
def small_and_large(byte_compiler):
  small = byte_compiler.compile(cd.Regex(_SMALL))
  large = byte_compiler.compile(cd.Regex(_LARGE))
  # Different buckets with the default padding: the decode loop compiles for each.
  assert small.shape_key != large.shape_key
  return small, large


def test_another_table_bucket_compiles_the_decode_loop_but_not_the_prefill(
    byte_model, small_and_large):
  small, large = small_and_large
  cd.generate(byte_model, "prefill once", constraint=small, max_new_tokens=6)
  with _compiles() as names:
    [out] = cd.generate(byte_model, "prefill once", constraint=large, max_new_tokens=6)
  assert not [n for n in names if "prefill" in n], names
  assert [n for n in names if "decode" in n], names  # the loop depends on the table shapes
  assert not out.error and (not out.finished or re.fullmatch(_LARGE, out.text))


def test_a_fixed_table_bucket_compiles_nothing_for_another_constraint(
    byte_model, small_and_large):
  small, large = small_and_large
  first = cd.generate(byte_model, ["fixed", "bucket"], constraint=small, max_new_tokens=7,
                      table_bucket=64)
  with _compiles() as names:
    second = cd.generate(byte_model, ["fixed", "bucket"], constraint=large,
                         max_new_tokens=7, table_bucket=64)
  assert names == []
  # Padding changes no output: the same rows as without a fixed bucket.
  assert first == cd.generate(byte_model, ["fixed", "bucket"], constraint=small,
                              max_new_tokens=7)
  assert second == cd.generate(byte_model, ["fixed", "bucket"], constraint=large,
                               max_new_tokens=7)


def test_a_fixed_table_bucket_compiles_nothing_for_other_per_row_constraints(
    byte_model, small_and_large):
  # Per-row constraints stack one table set per batch: same batch size, same bucket.
  small, large = small_and_large
  prompts = ["per", "row"]
  same = cd.generate(byte_model, prompts, constraint=[small, small], max_new_tokens=7,
                     table_bucket=64)
  with _compiles() as names:
    mixed = cd.generate(byte_model, prompts, constraint=[large, small], max_new_tokens=7,
                        table_bucket=64)
  assert names == []
  assert mixed[1] == same[1]
  assert [mixed[0]] == cd.generate(byte_model, prompts[:1], constraint=large,
                                   max_new_tokens=7)


def test_a_fixed_table_bucket_holds_for_streaming(byte_model, small_and_large):
  small, large = small_and_large
  items = list(cd.generate_stream(byte_model, "s", constraint=large, max_new_tokens=5,
                                  table_bucket=64))
  [final] = [item for _, item in items if isinstance(item, cd.Completion)]
  assert [final] == cd.generate(byte_model, "s", constraint=large, max_new_tokens=5)
  del small


@pytest.mark.parametrize("bucket", [0, -8, True])
def test_table_bucket_must_be_a_positive_int(byte_model, small_and_large, bucket):
  with pytest.raises(DecodingArgumentError, match="table_bucket"):
    cd.generate(byte_model, "x", constraint=small_and_large[0], table_bucket=bucket)
