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


class TablesVocabularyMismatchError(VocabularyMismatchError):
  """A saved tables file was written for another vocabulary; names both fingerprints."""


class TablesFileError(ConstraintError):
  """A file given as saved tables is not one, or is damaged (`cd.load_tables`)."""


class TablesVersionError(TablesFileError):
  """A saved tables file has another format version than this library reads."""


class GrammarError(ConstraintError):
  """A grammar is invalid. `line` and `column` (1-based) locate the problem when known.

  Attributes:
    line: 1-based line of the offending text in the grammar source, or None.
    column: 1-based column (in characters) of the offending text, or None.
  """

  def __init__(self, message: str, *, line: int | None = None, column: int | None = None):
    super().__init__(message)
    self.line = line
    self.column = column


class GrammarSyntaxError(GrammarError):
  """A grammar does not parse, or references a rule it does not define (`line`, `column` set)."""


class UnsupportedGrammarFeatureError(GrammarSyntaxError, UnsupportedFeatureError):
  """A grammar uses syntax this library does not support (Lark templates, priorities, ...)."""


class GrammarRecursionError(GrammarError):
  """A grammar's recursion cannot be handled: left recursion that cannot be eliminated,
  or a `max_depth` too small for the grammar to produce any string."""


class NondeterministicGrammarError(GrammarError):
  """The grammar's token-level push-down automaton is nondeterministic; names the rules."""


class SchemaError(ConstraintError):
  """A JSON Schema (or dataclass) is malformed or accepts no value."""


class UnsupportedSchemaError(UnsupportedFeatureError):
  """A JSON Schema keyword or combination, or a dataclass field type, is not supported.

  The message names the keyword and its JSON pointer (`#/properties/tags/uniqueItems`),
  or the dataclass field.
  """


class DecodingArgumentError(ValueError):
  """An argument of decoding is invalid: a `SamplingConfig` field, `max_new_tokens`,
  prompts, or logits narrower than the constraint's vocabulary. Raised on the host,
  before any device work."""


class StoreMismatchError(DecodingArgumentError):
  """A grammar-aligned sampling store was passed to a call with another prompt,
  constraint or sampling distribution than the one it was built for: its estimates
  are probabilities under those, and would be wrong here."""


class EvaluationJobError(ValueError):
  """An evaluation job (`python -m constrained_decoding.evaluate`) cannot run as
  configured: a bad config field, unreadable data, or an output directory written by
  another config."""
