"""JSON numbers as constraint IR: the full number syntax, integer and decimal ranges, multiples.

Public names:
  JSON_INTEGER, JSON_NUMBER           canonical JSON integers; any JSON number (RFC 8259).
  integer_range(lo, hi)               canonical decimal integers in [lo, hi] (None: unbounded).
  number_range(lo, hi, ...)           decimal numbers (no exponent) in an interval.
  multiple_of(step)                   decimal texts whose value is a multiple of `step`.
  decimal_digits(x)                   integer part and fraction digits of a finite decimal.

Formatting decisions (see `_json_values`' docstring): integers have no leading zeros, no
`+` and no `-0`; bounded numbers have no exponent and no negative zero, and are compared
with their bounds exactly, as decimals.
"""

import fractions

from constrained_decoding.constraints import _ir as ir

_DIGIT = ir.char_class([(0x30, 0x39)])
_NONZERO_DIGIT = ir.char_class([(0x31, 0x39)])
_MINUS = ir.Bytes(b"-")

JSON_INTEGER = ir.union(ir.Bytes(b"0"), ir.concat(ir.repeat(_MINUS, 0, 1), _NONZERO_DIGIT,
                                                  ir.repeat(_DIGIT, 0, None)))
"""Canonical JSON integers: no leading zeros, no `+`, no `-0`."""

_FRACTION = ir.concat(ir.Bytes(b"."), ir.repeat(_DIGIT, 1, None))
_EXPONENT = ir.concat(ir.char_class([(0x45, 0x45), (0x65, 0x65)]),
                      ir.repeat(ir.char_class([(0x2B, 0x2B), (0x2D, 0x2D)]), 0, 1),
                      ir.repeat(_DIGIT, 1, None))
JSON_NUMBER = ir.concat(
    ir.repeat(_MINUS, 0, 1), ir.union(ir.Bytes(b"0"), ir.concat(_NONZERO_DIGIT,
                                                                ir.repeat(_DIGIT, 0, None))),
    ir.repeat(_FRACTION, 0, 1), ir.repeat(_EXPONENT, 0, 1),
)
"""Any JSON number (RFC 8259 grammar: fraction and exponent allowed)."""

# ---- Integer and number ranges (digit-by-digit automata). ----


def _digit_range(lo: int, hi: int) -> ir.Node:
  return ir.char_class([(0x30 + lo, 0x30 + hi)])


def _same_length(a: str, b: str) -> ir.Node:
  """Digit strings of length len(a) == len(b) between `a` and `b` (inclusive).

  Classic construction: after the common prefix, the range splits into
  `a0 [a_rest..9...9] | [a0+1..b0-1] \\d{n-1} | b0 [0...0..b_rest]`, merging the outer
  parts into the middle when `a_rest` is all zeros or `b_rest` all nines.
  """
  if a == b:
    return ir.Bytes(a.encode())
  k = 0
  while a[k] == b[k]:
    k += 1
  if k:
    return ir.concat(ir.Bytes(a[:k].encode()), _same_length(a[k:], b[k:]))
  if len(a) == 1:
    return _digit_range(int(a), int(b))
  rest = len(a) - 1
  parts = []
  mid_lo, mid_hi = int(a[0]), int(b[0])
  if a[1:] != "0" * rest:
    parts.append(ir.concat(ir.Bytes(a[:1].encode()), _same_length(a[1:], "9" * rest)))
    mid_lo += 1
  if b[1:] != "9" * rest:
    mid_hi -= 1
  if mid_lo <= mid_hi:
    parts.append(ir.concat(_digit_range(mid_lo, mid_hi), ir.repeat(_DIGIT, rest, rest)))
  if b[1:] != "9" * rest:
    parts.append(ir.concat(ir.Bytes(b[:1].encode()), _same_length("0" * rest, b[1:])))
  return ir.union(*parts)


def _natural_range(lo: int, hi: int | None) -> ir.Node:
  """Canonical decimals (no leading zeros) of the integers in [lo, hi], 0 <= lo."""
  if hi is not None and lo > hi:
    return ir.NOTHING
  parts = []
  top = len(str(hi)) if hi is not None else len(str(lo))
  for n in range(len(str(lo)), top + 1):
    a = max(lo, 10 ** (n - 1) if n > 1 else 0)
    b = 10**n - 1 if hi is None else min(hi, 10**n - 1)
    parts.append(_same_length(str(a), str(b)))
  if hi is None:  # Every longer number: a nonzero digit and at least `top` more.
    parts.append(ir.concat(_NONZERO_DIGIT, ir.repeat(_DIGIT, top, None)))
  return ir.union(*parts)


def integer_range(lo: int | None, hi: int | None) -> ir.Node:
  """Canonical decimal integers n with lo <= n <= hi (None: unbounded on that side).

  Exact: the language is `{str(n) : lo <= n <= hi}` (no `+`, no leading zeros, no
  `-0`); its size is linear in the number of digits of the bounds.
  """
  if lo is not None and hi is not None and lo > hi:
    return ir.NOTHING
  parts = []
  if hi is None or hi >= 0:
    parts.append(_natural_range(max(lo, 0) if lo is not None else 0, hi))
  if lo is None or lo < 0:
    magnitude_lo = 1 if hi is None or hi >= 0 else -hi
    parts.append(ir.concat(_MINUS, _natural_range(magnitude_lo,
                                                   None if lo is None else -lo)))
  return ir.union(*parts)


_ANY_FRACTION = ir.repeat(_FRACTION, 0, 1)


def decimal_digits(x: fractions.Fraction) -> tuple[int, str]:
  """(integer part, fraction digits without trailing zeros) of a finite decimal x >= 0.

  Raises:
    ValueError: x has no finite decimal expansion (a denominator with a prime factor
      other than 2 and 5); JSON numbers always have one.
  """
  q = x.denominator
  for p in (2, 5):
    while q % p == 0:
      q //= p
  if q != 1:
    raise ValueError(f"{x} has no finite decimal expansion")
  whole, rest = divmod(x.numerator, x.denominator)
  digits = []
  while rest:
    digit, rest = divmod(10 * rest, x.denominator)
    digits.append(str(digit))
  return whole, "".join(digits)


def _fraction_digits(lo, hi, memo: dict) -> tuple[ir.Node, bool]:
  """Digit strings F whose value 0.F is within the bounds, as (the IR of the non-empty
  ones, whether the empty string is one).

  `lo`/`hi` are None (unbounded) or (d, strict): 0.F >= 0.d (> when strict) and
  0.F <= 0.d (<), d without trailing zeros. Digit by digit: a first digit above lo's
  (below hi's) frees the rest from that bound; an equal one passes the rest of d on.
  """
  if lo is not None and not lo[0] and not lo[1]:
    lo = None  # 0.F >= 0 always holds.
  if hi is not None and not hi[0] and hi[1]:
    return ir.NOTHING, False  # 0.F < 0 never does.
  key = (lo, hi)
  if key in memo:
    return memo[key]
  empty_ok = lo is None  # 0 meets every remaining upper bound, and no lower one.
  if lo is None and hi is None:
    node = ir.repeat(_DIGIT, 1, None)
  elif lo is not None and not lo[0] and hi is None:  # Some nonzero digit.
    node = ir.concat(ir.repeat(ir.Bytes(b"0"), 0, None), _NONZERO_DIGIT,
                     ir.repeat(_DIGIT, 0, None))
  elif lo is None and not hi[0]:  # Zeros only.
    node = ir.repeat(ir.Bytes(b"0"), 1, None)
  elif lo is not None and hi is not None and not lo[0] and not hi[0]:
    node = ir.NOTHING  # Nonzero and all zeros.
  else:
    low = int(lo[0][0]) if lo is not None and lo[0] else 0
    high = int(hi[0][0]) if hi is not None and hi[0] else 0 if hi is not None else 9
    by_rest: dict = {}
    for c in range(low if lo is not None else 0, high + 1):
      rest_lo = None if lo is None or c > low else (lo[0][1:], lo[1])
      rest_hi = None if hi is None or c < high else (hi[0][1:], hi[1])
      by_rest.setdefault((rest_lo, rest_hi), []).append(c)
    parts = []
    for (rest_lo, rest_hi), digits in by_rest.items():
      rest, rest_empty = _fraction_digits(rest_lo, rest_hi, memo)
      tail = ir.union(ir.EPSILON, rest) if rest_empty else rest
      parts.append(ir.concat(ir.char_class([(0x30 + d, 0x30 + d) for d in digits]), tail))
    node = ir.union(*parts)
  memo[key] = node, empty_ok
  return memo[key]


def _fraction_part(lo, hi) -> ir.Node:
  """`(.F)?` texts, F within the bounds of `_fraction_digits` (no part: F empty)."""
  digits, empty_ok = _fraction_digits(lo, hi, {})
  dotted = ir.concat(ir.Bytes(b"."), digits)
  return ir.union(ir.EPSILON, dotted) if empty_ok else dotted


def _magnitude(lo: fractions.Fraction, lo_exclusive: bool, hi: fractions.Fraction | None,
               hi_exclusive: bool) -> ir.Node:
  """Decimals `I(.F)?` (canonical I) whose value m satisfies lo <(=) m <(=) hi, lo >= 0.

  The integer part I decides everything but at the bounds' own integer parts, where the
  fraction is compared with the bound's fraction digit by digit (`_fraction_digits`).
  """
  low, low_digits = decimal_digits(lo)
  low_bound = (low_digits, lo_exclusive)
  if hi is None:
    return ir.union(ir.concat(_natural_range(low + 1, None), _ANY_FRACTION),
                    ir.concat(ir.Bytes(str(low).encode()), _fraction_part(low_bound, None)))
  high, high_digits = decimal_digits(hi)
  high_bound = (high_digits, hi_exclusive)
  if low > high:
    return ir.NOTHING
  if low == high:
    return ir.concat(ir.Bytes(str(low).encode()), _fraction_part(low_bound, high_bound))
  return ir.union(ir.concat(_natural_range(low + 1, high - 1), _ANY_FRACTION),
                  ir.concat(ir.Bytes(str(low).encode()), _fraction_part(low_bound, None)),
                  ir.concat(ir.Bytes(str(high).encode()), _fraction_part(None, high_bound)))


def number_range(lo, hi, *, lo_exclusive: bool = False, hi_exclusive: bool = False
                 ) -> ir.Node:
  """Decimal numbers `-?I(.F)?` (no exponent) with value in an interval.

  `lo` and `hi` are ints, `fractions.Fraction`s with a finite decimal expansion (every
  JSON number has one), or None for an unbounded side. Exact for that format: every such
  text whose value v satisfies `lo <= v` (`lo < v` if `lo_exclusive`) and `v <= hi`
  (`v < hi`), except negative zeros (`-0`, `-0.0`).
  """
  lo = None if lo is None else fractions.Fraction(lo)
  hi = None if hi is None else fractions.Fraction(hi)
  parts = []
  if hi is None or hi > 0 or (hi == 0 and not hi_exclusive):
    if lo is None or lo < 0:
      low, low_exclusive = fractions.Fraction(0), False
    else:
      low, low_exclusive = lo, lo_exclusive
    parts.append(_magnitude(low, low_exclusive, hi, hi_exclusive))
  if lo is None or lo < 0:  # v = -m with m > 0.
    if hi is None or hi >= 0:
      m_lo, m_lo_exclusive = fractions.Fraction(0), True
    else:
      m_lo, m_lo_exclusive = -hi, hi_exclusive
    m_hi = None if lo is None else -lo
    parts.append(ir.concat(_MINUS, _magnitude(m_lo, m_lo_exclusive, m_hi, lo_exclusive)))
  return ir.union(*parts)


def multiple_of(step: fractions.Fraction, *, max_states: int = 100_000) -> ir.Node:
  """Decimal texts `-?D+(.D+)?` whose value is an integer multiple of `step` > 0.

  Permissive on form (leading zeros, `-0`): intersect it with a canonical number IR.
  With step = p/q in lowest terms and s its number of decimal places, every multiple
  has at most s significant fraction digits, and x is one exactly when X = x * 10^s
  (an integer) is divisible by D = p * 10^s / q. The automaton reads X's digits
  keeping X mod D; after s fraction digits only zeros may follow, and at the end the
  missing places count as zeros.

  Raises:
    ValueError: step has no finite decimal expansion, or D would exceed `max_states`.
  """
  _, digits = decimal_digits(step)
  places = len(digits)
  divisor = step.numerator * 10**places // step.denominator
  num_states = 2 + divisor * (places + 3)
  if num_states > max_states:
    raise ValueError(f"multipleOf {step} needs {num_states} states")
  # States: 0 start, 1 after '-'; with X mod D = r so far: integer part, f fraction
  # digits read (f = 0..places), and zeros past the places (at least one read).
  def integer(r):
    return 2 + r

  def fraction(r, f):
    return 2 + divisor * (1 + f) + r

  def zeros(r):
    return 2 + divisor * (places + 2) + r

  arcs, finals = [(0, ir.Bytes(b"-"), 1)], []

  def digit_arcs(source, target_of):
    by_target: dict[int, list] = {}
    for d in range(10):
      target = target_of(d)
      if target is not None:
        by_target.setdefault(target, []).append((0x30 + d, 0x30 + d))
    arcs.extend((source, ir.char_class(ranges), target) for target, ranges in by_target.items())

  for source in (0, 1):
    digit_arcs(source, lambda d: integer(d % divisor))
  for r in range(divisor):
    digit_arcs(integer(r), lambda d, r=r: integer((10 * r + d) % divisor))
    arcs.append((integer(r), ir.Bytes(b"."), fraction(r, 0)))
    if r * 10**places % divisor == 0:
      finals.append(integer(r))
    for f in range(places):
      digit_arcs(fraction(r, f), lambda d, r=r, f=f: fraction((10 * r + d) % divisor, f + 1))
    for f in range(1, places + 1):
      if r * 10**(places - f) % divisor == 0:
        finals.append(fraction(r, f))
    arcs += [(fraction(r, places), ir.Bytes(b"0"), zeros(r)), (zeros(r), ir.Bytes(b"0"), zeros(r))]
    if r % divisor == 0:
      finals.append(zeros(r))
  return ir.Graph(num_states=num_states, arcs=tuple(arcs), finals=tuple(finals))
