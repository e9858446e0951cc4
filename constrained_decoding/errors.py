"""Errors raised on the host while building constraints.

Device code never raises: a forbidden token sets `ConstraintState.error` instead.
Messages follow "<what> <value> <problem>. Expected <expectation>. <how to fix>".
"""


class ConstraintError(ValueError):
  """Base class for errors building a constraint."""


class UnsupportedFeatureError(ConstraintError):
  """The constraint uses a feature this library does not support."""


class UnsupportedRegexError(UnsupportedFeatureError):
  """The regex uses a construct that is not regular or not supported (lookaround, ...)."""


class RegexSyntaxError(ConstraintError):
  """The regex does not parse."""


class EmptyConstraintError(ConstraintError):
  """No token sequence of this vocabulary satisfies the constraint."""


class CompileBudgetError(ConstraintError):
  """Compilation exceeded its state or time budget (see `CompileOptions`)."""


class VocabularyError(ValueError):
  """A tokenizer or vocabulary could not be loaded or is inconsistent."""


class VocabularyMismatchError(ConstraintError):
  """Tables or caches were built for another vocabulary."""
