"""Difference of ASCII languages given as IR (numbers: "these, but not those").

JSON Schema negation (`_json_negation.py`) needs "a canonical number that is not one of
these values" and "a number that is not a multiple of this step". Both are differences
of regular languages over ASCII, which the IR cannot state, so they are built here as a
product of the two minimal DFAs (from `automata._fsa`) and returned as an `ir.Graph`
whose arcs are character classes: a text IR, like `_intersect.intersect_text`'s result,
that the string and number lowerings combine further.

Public names:
  ascii_difference(a, b, max_states)   L(a) minus L(b), as an `ir.Graph`.
  CANONICAL_NUMBER                     JSON numbers written one way per value.
  canonical_number(value)              that spelling of an int, float or Fraction.
"""

import decimal
import fractions

import numpy as np

from constrained_decoding.constraints import _ir as ir

_DIGIT = ir.char_class([(0x30, 0x39)])
_NONZERO = ir.char_class([(0x31, 0x39)])
_SIGN = ir.repeat(ir.Bytes(b"-"), 0, 1)
_FRACTION = ir.concat(ir.Bytes(b"."), ir.repeat(_DIGIT, 0, None), _NONZERO)

CANONICAL_NUMBER = ir.union(
    ir.Bytes(b"0"),
    ir.concat(_SIGN, _NONZERO, ir.repeat(_DIGIT, 0, None), ir.repeat(_FRACTION, 0, 1)),
    ir.concat(_SIGN, ir.Bytes(b"0"), _FRACTION),
)
"""Decimal JSON numbers without exponent, leading zeros, trailing fraction zeros or `-0`:
one spelling per value (exact decimal semantics, as elsewhere in the JSON Schema lowering)."""


def canonical_number(value) -> str:
  """The `CANONICAL_NUMBER` spelling of `value` (a float as the decimal it prints as)."""
  if isinstance(value, float):
    exact = decimal.Decimal(repr(value))
  elif isinstance(value, fractions.Fraction):
    exact = decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator)
  else:
    exact = decimal.Decimal(int(value))
  text = format(exact.normalize(), "f")
  if "." in text:
    text = text.rstrip("0").rstrip(".")
  return "0" if text in ("-0", "") else text


def ascii_difference(a: ir.Node, b: ir.Node, max_states: int = 100_000) -> ir.Node:
  """L(a) minus L(b) for languages over ASCII, as a Graph of character classes.

  Raises:
    ValueError: the product exceeds `max_states` states, or a language reads a
      non-ASCII byte.
  """
  # Imported here: `automata` imports this package (`_utf8` -> `_ir`), so a module-level
  # import would make `import constrained_decoding.automata._nfa` alone fail.
  from constrained_decoding.automata import _fsa  # pylint: disable=g-import-not-at-top
  dfa_a, dfa_b = _fsa.compile_byte_dfa(a), _fsa.compile_byte_dfa(b)
  if dfa_a.num_states == 0:
    return ir.NOTHING
  for dfa in (dfa_a, dfa_b):
    if dfa.num_states and (dfa.transitions[:, 128:256] >= 0).any():
      raise ValueError("ascii_difference reads only ASCII languages")
  ta = dfa_a.transitions[:, :128]
  tb = dfa_b.transitions[:, :128] if dfa_b.num_states else None
  dead = -1  # b has rejected the prefix: every continuation stays outside L(b).
  start = (dfa_a.start, dfa_b.start if dfa_b.num_states else dead)
  index = {start: 0}
  todo = [start]
  arcs, finals = [], []
  while todo:
    pair = todo.pop()
    qa, qb = pair
    here = index[pair]
    if dfa_a.accepting[qa] and (qb == dead or not dfa_b.accepting[qb]):
      finals.append(here)
    next_a = ta[qa]
    next_b = tb[qb] if qb != dead else np.full(128, dead)
    by_target: dict[tuple[int, int], list[int]] = {}
    for byte in np.nonzero(next_a >= 0)[0].tolist():
      by_target.setdefault((int(next_a[byte]), int(next_b[byte])), []).append(byte)
    for target, byte_list in by_target.items():
      if target not in index:
        if len(index) >= max_states:
          raise ValueError(f"the difference exceeds {max_states} states")
        index[target] = len(index)
        todo.append(target)
      ranges = ir.normalize_ranges((x, x) for x in byte_list)
      arcs.append((here, ir.CharClass(ranges), index[target]))
  if not finals:
    return ir.NOTHING
  return ir.Graph(num_states=len(index), arcs=tuple(arcs), finals=tuple(sorted(finals)))
