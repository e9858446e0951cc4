"""Constraint specs: frozen, hashable values describing what the output must match.

Each spec lowers itself to the constraint IR with `to_ir()`; `Compiler.compile` does
the rest. Specs are cache keys, so they hold only immutable values.
"""

import dataclasses

from constrained_decoding.constraints import _ir as ir


@dataclasses.dataclass(frozen=True)
class Regex:
  """The output must fully match a regular expression.

  ```python
  spec = Regex(r"\\d{4}-\\d{2}-\\d{2}")
  ```

  Syntax and semantics are Python's `re` with full-match semantics, over the UTF-8
  bytes of the text (a token may end in the middle of a multi-byte character).
  See `constraints/_regex.py` for the supported constructs.

  Attributes:
    pattern: The regular expression.
    unicode: If False (default), `\\d \\w \\s` are ASCII classes, exactly as Python's
      `re.ASCII` (`\\d` = `[0-9]`, as in JSON Schema's ECMAScript patterns). If True,
      they are Python's Unicode classes. `.` and negated classes always range over all
      of Unicode.
  """

  pattern: str
  unicode: bool = False

  def __post_init__(self):
    if not isinstance(self.pattern, str):
      raise TypeError(
          f"Regex pattern {self.pattern!r} is a {type(self.pattern).__name__}. "
          f"Expected str; decode bytes patterns first."
      )

  def to_ir(self) -> ir.Node:
    from constrained_decoding.constraints._regex import parse_regex  # pylint: disable=g-import-not-at-top

    return parse_regex(self.pattern, unicode=self.unicode)

  def describe(self) -> str:
    return f"Regex({self.pattern!r})"
