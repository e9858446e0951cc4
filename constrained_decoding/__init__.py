"""constrained_decoding: make a language model's output follow a formal language.

```python
import constrained_decoding as cd

vocab = cd.Vocabulary.from_gguf(cd.models.default_gguf_path())
tables = cd.Compiler(vocab).compile(cd.Regex(r"\\d{4}-\\d{2}-\\d{2}"))
state = cd.init_state(tables, batch_size=1)
logits = cd.mask_logits(tables, state, logits)   # inside your jitted step
state = cd.advance(tables, state, tokens)
```

Names are loaded lazily, so that importing the device side (`constrained_decoding.runtime`)
never imports pynini. The host side imports jax only to register `ConstraintTables` as a
pytree where it is defined, so compiled tables work in any jitted function.
"""

import importlib
import sys
import types

_EXPORTS = {
    # Host: vocabularies, specs, compilation, tables.
    "Vocabulary": "constrained_decoding.vocab",
    "Regex": "constrained_decoding.constraints",
    "Compiler": "constrained_decoding._compiler",
    "CompileOptions": "constrained_decoding._compiler",
    "CompileInfo": "constrained_decoding._compiler",
    "ConstraintTables": "constrained_decoding.tables",
    "stack_tables": "constrained_decoding._stacking",
    "tables_nbytes": "constrained_decoding.tables",
    "load_tables": "constrained_decoding._tables_file",
    "read_tables_header": "constrained_decoding._tables_file",
    "TablesHeader": "constrained_decoding._tables_file",
    # Device: runtime.
    "ConstraintState": "constrained_decoding.runtime",
    "init_state": "constrained_decoding.runtime",
    "allowed_tokens": "constrained_decoding.runtime",
    "allowed_bits": "constrained_decoding.runtime",
    "mask_logits": "constrained_decoding.runtime",
    "advance": "constrained_decoding.runtime",
    "forced_tokens": "constrained_decoding.runtime",
    "allowed_or_lowest": "constrained_decoding.runtime",
    "ConstraintHistory": "constrained_decoding.runtime",
    "init_history": "constrained_decoding.runtime",
    "record": "constrained_decoding.runtime",
    "rewind": "constrained_decoding.runtime",
    # Device: decoding.
    "generate": "constrained_decoding.sampling",
    "generate_stream": "constrained_decoding.sampling",
    "generate_aligned": "constrained_decoding.sampling",
    "AlignedStore": "constrained_decoding.sampling",
    "evaluate": "constrained_decoding.sampling",
    "Evaluation": "constrained_decoding.sampling",
    "EvaluationRow": "constrained_decoding.sampling",
    "generate_speculative": "constrained_decoding.sampling",
    "NGramDrafter": "constrained_decoding.sampling",
    "SpeculativeStats": "constrained_decoding.sampling",
    "SamplingConfig": "constrained_decoding.sampling",
    "Completion": "constrained_decoding.sampling",
    # Errors.
    "ConstraintError": "constrained_decoding.errors",
    "UnsupportedFeatureError": "constrained_decoding.errors",
    "UnsupportedRegexError": "constrained_decoding.errors",
    "RegexSyntaxError": "constrained_decoding.errors",
    "EmptyConstraintError": "constrained_decoding.errors",
    "CompileBudgetError": "constrained_decoding.errors",
    "VocabularyError": "constrained_decoding.errors",
    "VocabularyMismatchError": "constrained_decoding.errors",
    "TablesVocabularyMismatchError": "constrained_decoding.errors",
    "TablesFileError": "constrained_decoding.errors",
    "TablesVersionError": "constrained_decoding.errors",
    "DecodingArgumentError": "constrained_decoding.errors",
    "EvaluationJobError": "constrained_decoding.errors",
    "StoreMismatchError": "constrained_decoding.errors",
    # Grammars.
    "Grammar": "constrained_decoding.constraints",
    "GrammarIR": "constrained_decoding.constraints",
    "Indentation": "constrained_decoding.constraints",
    "Semicolons": "constrained_decoding.constraints",
    "LexedTables": "constrained_decoding.lexed_tables",
    "GrammarError": "constrained_decoding.errors",
    "GrammarSyntaxError": "constrained_decoding.errors",
    "UnsupportedGrammarFeatureError": "constrained_decoding.errors",
    "GrammarRecursionError": "constrained_decoding.errors",
    "NondeterministicGrammarError": "constrained_decoding.errors",
    # JSON Schema, schema-free JSON, dataclasses.
    "JsonSchema": "constrained_decoding.constraints",
    "Json": "constrained_decoding.constraints",
    "Dataclass": "constrained_decoding.constraints",
    "format_dataclass": "constrained_decoding.constraints",
    "parse_dataclass": "constrained_decoding.constraints",
    "SchemaError": "constrained_decoding.errors",
    "UnsupportedSchemaError": "constrained_decoding.errors",
}
_SUBMODULES = ("models", "runtime", "sampling", "tables", "lexed_tables", "errors", "vocab",
               "constraints", "automata")

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str):
  if name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
  elif name in _SUBMODULES:
    value = importlib.import_module(f"constrained_decoding.{name}")
  else:
    raise AttributeError(f"module 'constrained_decoding' has no attribute {name!r}")
  globals()[name] = value
  return value


def __dir__():
  return __all__


def _installed_version() -> str:
  """The installed distribution's version, else the source tree's constant."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  version = importlib.import_module("constrained_decoding._version")
  try:
    return metadata.version(version.DISTRIBUTION)
  except metadata.PackageNotFoundError:
    return version.__version__


__version__ = _installed_version()


class _Package(types.ModuleType):
  """The package's module type, so that `cd.evaluate` stays the function.

  `constrained_decoding/evaluate.py` is the evaluation job (`python -m
  constrained_decoding.evaluate`). Importing it as a module would make the import
  system set the package attribute `evaluate` to that module, replacing the function
  `sampling.evaluate`; this property keeps the function and ignores that assignment
  (other assignments, e.g. a test's monkeypatch, still take effect).
  """

  @property
  def evaluate(self):
    if "_evaluate_override" in self.__dict__:
      return self.__dict__["_evaluate_override"]
    return importlib.import_module("constrained_decoding.sampling").evaluate

  @evaluate.setter
  def evaluate(self, value):
    if not isinstance(value, types.ModuleType):  # A module: the job, bound by an import.
      self.__dict__["_evaluate_override"] = value

  @evaluate.deleter
  def evaluate(self):
    self.__dict__.pop("_evaluate_override", None)


sys.modules[__name__].__class__ = _Package
