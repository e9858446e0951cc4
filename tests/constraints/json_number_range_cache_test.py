"""Numeric bounds and `multipleOf` lowered once per distinct bounds (`_range_language`):
the cached language against Python's arithmetic, and errors that still name each place."""

import random

import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.constraints import _intersect
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_scalar_schemas as scalars


def _holds(node: ir.Node, text: str) -> bool:
  return _intersect.intersect_text(ir.Bytes(text.encode()), node) != ir.NOTHING


@pytest.mark.parametrize("schema, member", [
    ({"minimum": 100, "maximum": 6000, "multipleOf": 100},
     lambda n: 100 <= n <= 6000 and n % 100 == 0),
    ({"exclusiveMinimum": -7, "maximum": 300, "multipleOf": 6},
     lambda n: -7 < n <= 300 and n % 6 == 0),
    ({"minimum": 0.5, "exclusiveMaximum": 90.5}, lambda n: 1 <= n <= 90),
])
def test_integer_ranges_match_python_when_lowered_again(schema, member):
  rng = random.Random(5)
  first = scalars.lower_number("integer", dict(schema), "#/a")
  again = scalars.lower_number("integer", dict(schema), "#/b")  # From the cache.
  assert again is first
  values = list(range(-20, 320)) + [rng.randrange(-100, 7000) for _ in range(200)]
  for n in values:
    assert _holds(again, str(n)) == member(n), n


def test_equal_bounds_spelled_differently_share_one_language():
  a = scalars.lower_number("number", {"minimum": 1, "maximum": 2.5}, "#")
  b = scalars.lower_number("number", {"minimum": 1.0, "maximum": 2.50}, "#")
  assert a is b
  for text, holds in (("1", True), ("2.5", True), ("2.51", False), ("0.99", False)):
    assert _holds(b, text) == holds, text


def test_integer_and_number_with_equal_bounds_differ():
  integer = scalars.lower_number("integer", {"minimum": 0, "maximum": 3}, "#")
  number = scalars.lower_number("number", {"minimum": 0, "maximum": 3}, "#")
  assert _holds(number, "1.5") and not _holds(integer, "1.5")


def test_a_too_large_step_names_each_place_it_is_met():
  for key in ("a", "b", "a"):  # The error is not cached: each place is named.
    schema = {"type": "object", "properties": {key: {"type": "integer",
                                                     "multipleOf": 1000003}}}
    with pytest.raises(errors.UnsupportedSchemaError,
                       match=rf"multipleOf 1000003 at #/properties/{key}/multipleOf with"
                             " these bounds is too large an automaton"):
      cd.JsonSchema(schema).to_ir()
