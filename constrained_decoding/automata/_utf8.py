"""UTF-8 byte-range sequences of code point ranges (the byte NFA's character classes).

Public:
  utf8_sequences(lo, hi)  the UTF-8 byte-range sequences encoding scalar values lo..hi.
"""

from constrained_decoding.constraints import _ir as ir

# Boundaries of the UTF-8 encoding lengths: the largest scalar value of 1, 2 and 3 bytes.
_MAX_SCALAR_BY_LENGTH = (0x7F, 0x7FF, 0xFFFF)


def utf8_sequences(lo: int, hi: int) -> tuple[tuple[tuple[int, int], ...], ...]:
  """Splits the scalar values `lo..hi` into UTF-8 byte-range sequences.

  The classic "utf8-ranges" algorithm (as in RE2 and Rust's regex-syntax): each
  sequence is a tuple of inclusive byte ranges `((lo_1, hi_1), ..., (lo_n, hi_n))`,
  denoting the byte strings `b_1 ... b_n` with `lo_i <= b_i <= hi_i`.

  The language: the union of the sequences is exactly
  `{chr(c).encode() for c in range(lo, hi + 1) if c is not a surrogate}`; the sequences
  are pairwise disjoint and come in increasing code point order. This works because,
  once a range is split at the encoding-length boundaries and at multiples of 64**k,
  every byte position of the encodings varies independently over a contiguous range.

  Args:
    lo: First code point (inclusive), >= 0.
    hi: Last code point (inclusive), <= 0x10FFFF.

  Returns:
    The sequences, in increasing order; empty if the range holds no scalar value.
  """
  out = []
  stack = [(lo, hi)]
  while stack:
    lo, hi = stack.pop()
    while True:
      # Surrogates have no UTF-8 encoding: split around them.
      if lo <= ir.SURROGATES[1] and hi >= ir.SURROGATES[0]:
        if hi > ir.SURROGATES[1]:
          stack.append((ir.SURROGATES[1] + 1, hi))
        hi = ir.SURROGATES[0] - 1
      if lo > hi:
        break
      # Split at the encoding-length boundaries.
      split = next((m for m in _MAX_SCALAR_BY_LENGTH if lo <= m < hi), None)
      if split is not None:
        stack.append((split + 1, hi))
        hi = split
        continue
      if hi <= 0x7F:
        out.append(((lo, hi),))
        break
      # Split until all but one byte position vary over a full aligned block.
      for i in range(1, 4):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
          if lo & m:
            stack.append(((lo | m) + 1, hi))
            hi = lo | m
            break
          if hi & m != m:
            stack.append((hi & ~m, hi))
            hi = (hi & ~m) - 1
            break
      else:
        out.append(tuple(zip(chr(lo).encode(), chr(hi).encode())))
        break
  return tuple(out)
