"""minLength/maxLength folded into a pattern's unbounded run (`length_bounded`).

Oracles: `jsonschema` on random strings through the compiled tables, and the IR shape
(a bounded run the compiler counts, not a product with a length automaton).
"""

import json
import random

import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_formats
from constrained_decoding.constraints import _json_scalar_schemas as scalars
from constrained_decoding.testing import _reference as ref


def test_username_pattern_becomes_a_bounded_run():
  text = _json_formats.pattern_ir("^[a-z][a-z0-9_]*$")
  bounded = scalars.length_bounded(text, 3, 32)
  assert bounded == ir.concat(ir.char_class([(97, 122)]),
                              ir.repeat(text.parts[1].node, 2, 31))


@pytest.mark.parametrize("pattern", ["abc", "^[a-z]{2,5}$", "^[a-z]*[0-9]*$", "x.*y"])
def test_other_shapes_are_left_to_the_intersection(pattern):
  assert scalars.length_bounded(_json_formats.pattern_ir(pattern), 1, 9) is None


_CASES = [
    ("^[a-z][a-z0-9_]*$", 3, 12),
    ("^[a-z]+$", 0, 4),
    ("^(ab|cd)[0-9]*x$", 4, 9),
    ("^(a[0-9]*|bb[a-z]*)$", 2, 6),
    ("^é[a-z]*$", 3, None),
    ("^[a-z]{2}-[a-z]*$", 6, 8),
]


@pytest.mark.parametrize("pattern, low, high", _CASES)
def test_lengths_and_pattern_match_jsonschema(pattern, low, high, byte_compiler, byte_vocab):
  schema = {"type": "string", "pattern": pattern, "minLength": low}
  if high is not None:
    schema["maxLength"] = high
  tables = byte_compiler.compile(cd.JsonSchema(schema))
  validator = jsonschema.Draft202012Validator(schema)
  index = ref.TokenIndex(byte_vocab)
  rng = random.Random(pattern)
  alphabet = "abcdxyz019_-é"
  samples = [_sample(rng, pattern) for _ in range(150)]
  samples += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
              for _ in range(150)]
  accepted = 0
  for value in samples:
    tokens = index.random_tokenization(json.dumps(value, ensure_ascii=False).encode(), rng)
    valid = validator.is_valid(value)
    assert ref.reference_accepts(tables, tokens) == valid, (value, valid)
    accepted += valid
  assert accepted >= 10  # The oracle saw both sides.


def _sample(rng, pattern: str) -> str:
  """A string of about the pattern's shape, of random length (valid or not)."""
  head = {"^[a-z][a-z0-9_]*$": "a", "^[a-z]+$": "", "^(ab|cd)[0-9]*x$": rng.choice(["ab", "cd"]),
          "^(a[0-9]*|bb[a-z]*)$": rng.choice(["a", "bb"]), "^é[a-z]*$": "é",
          "^[a-z]{2}-[a-z]*$": "ab-"}[pattern]
  letters = "abz" if "[a-z]*$" in pattern or "[a-z]+$" in pattern else "abz09_"
  body = "".join(rng.choice(letters) for _ in range(rng.randint(0, 12)))
  tail = "x" if pattern == "^(ab|cd)[0-9]*x$" else ""
  if pattern in ("^(ab|cd)[0-9]*x$", "^(a[0-9]*|bb[a-z]*)$") and head != "bb":
    body = "".join(rng.choice("0123") for _ in range(rng.randint(0, 12)))
  return head + body + tail
