"""Device side: stepping constraints inside jit (no pynini, no host callbacks)."""

from constrained_decoding.runtime._runtime import ConstraintState
from constrained_decoding.runtime._runtime import advance
from constrained_decoding.runtime._runtime import allowed_tokens
from constrained_decoding.runtime._runtime import init_state
from constrained_decoding.runtime._runtime import mask_logits

__all__ = [
    "ConstraintState",
    "advance",
    "allowed_tokens",
    "init_state",
    "mask_logits",
]
