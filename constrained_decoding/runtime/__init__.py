"""Device side: stepping constraints inside jit (no pynini, no host callbacks).

`init_state`, `allowed_tokens`, `allowed_bits`, `mask_logits` and `advance` check their
arguments' dtypes and shapes (at trace time inside jit) and, outside jit, the values of
token ids and `constraint_ids`, raising `errors.DecodingArgumentError` (`_runtime.py`).

They take `ConstraintTables` (regular and push-down constraints, `_runtime.py`) or
`LexedTables` (grammars with a lexer, `_lexed.py`): which one is a Python type check at
trace time, so each kind compiles only its own code.
"""

from constrained_decoding.runtime._forced import allowed_or_lowest
from constrained_decoding.runtime._forced import forced_tokens
from constrained_decoding.runtime._rewind import ConstraintHistory
from constrained_decoding.runtime._rewind import init_history
from constrained_decoding.runtime._rewind import record
from constrained_decoding.runtime._rewind import rewind
from constrained_decoding.runtime._runtime import ConstraintState
from constrained_decoding.runtime._runtime import advance
from constrained_decoding.runtime._runtime import allowed_bits
from constrained_decoding.runtime._runtime import allowed_tokens
from constrained_decoding.runtime._runtime import init_state
from constrained_decoding.runtime._runtime import mask_logits

__all__ = [
    "ConstraintHistory",
    "ConstraintState",
    "advance",
    "allowed_bits",
    "allowed_or_lowest",
    "allowed_tokens",
    "forced_tokens",
    "init_history",
    "init_state",
    "mask_logits",
    "record",
    "rewind",
]
