"""Device side: the jitted decode loop and sampling methods."""

from constrained_decoding.sampling._generate import Completion
from constrained_decoding.sampling._generate import DecodeState
from constrained_decoding.sampling._generate import generate
from constrained_decoding.sampling._generate import generate_stream
from constrained_decoding.sampling._methods import SamplingConfig
from constrained_decoding.sampling._methods import sample_tokens

__all__ = [
    "Completion",
    "DecodeState",
    "SamplingConfig",
    "generate",
    "generate_stream",
    "sample_tokens",
]
