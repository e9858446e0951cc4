"""Device side: the jitted decode loop and sampling methods."""

from constrained_decoding.sampling._aligned import AlignedStore
from constrained_decoding.sampling._aligned import generate_aligned
from constrained_decoding.sampling._evaluate import Evaluation
from constrained_decoding.sampling._evaluate import EvaluationRow
from constrained_decoding.sampling._evaluate import evaluate
from constrained_decoding.sampling._host import Completion
from constrained_decoding.sampling._loop import DecodeState
from constrained_decoding.sampling._generate import generate
from constrained_decoding.sampling._generate import generate_stream
from constrained_decoding.sampling._methods import SamplingConfig
from constrained_decoding.sampling._methods import filter_logits
from constrained_decoding.sampling._methods import sample_tokens
from constrained_decoding.sampling._speculative import NGramDrafter
from constrained_decoding.sampling._speculative import SpeculativeStats
from constrained_decoding.sampling._speculative import generate_speculative

__all__ = [
    "AlignedStore",
    "Completion",
    "DecodeState",
    "Evaluation",
    "EvaluationRow",
    "NGramDrafter",
    "SamplingConfig",
    "SpeculativeStats",
    "evaluate",
    "filter_logits",
    "generate",
    "generate_aligned",
    "generate_speculative",
    "generate_stream",
    "sample_tokens",
]
