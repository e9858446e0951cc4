"""Host side: constraint specs and their front ends (lowering to the constraint IR)."""

from constrained_decoding.constraints._specs import Regex

__all__ = [
    "Regex",
]
