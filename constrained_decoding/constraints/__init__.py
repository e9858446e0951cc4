"""Host side: constraint specs and their front ends (lowering to the constraint IR)."""

from constrained_decoding.constraints._specs import Regex
from constrained_decoding.constraints._specs import Grammar
from constrained_decoding.constraints._grammar import GrammarIR
from constrained_decoding.constraints._lexed_options import Indentation
from constrained_decoding.constraints._lexed_options import Semicolons
from constrained_decoding.constraints._specs_values import JsonSchema
from constrained_decoding.constraints._specs_values import Json
from constrained_decoding.constraints._specs_values import Dataclass
from constrained_decoding.constraints._dataclass import format_dataclass
from constrained_decoding.constraints._dataclass import parse_dataclass

__all__ = [
    "Regex",
    "Grammar",
    "GrammarIR",
    "Indentation",
    "Semicolons",
    "JsonSchema",
    "Json",
    "Dataclass",
    "format_dataclass",
    "parse_dataclass",
]
