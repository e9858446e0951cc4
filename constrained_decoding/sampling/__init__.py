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

# DeepMind gemma's sampler, constrained; imports gemma (an optional extra) on first use.
_GEMMA_NAMES = ("ConstrainedSampler", "ConstrainedSamplerLoop", "ConstrainedSamplingState")


def __getattr__(name):
  if name in _GEMMA_NAMES:
    try:
      from constrained_decoding.sampling import _gemma_sampler  # pylint: disable=g-import-not-at-top
    except ModuleNotFoundError as e:
      if e.name is None or e.name.split(".")[0] not in ("gemma", "kauldron"):
        raise
      raise ImportError(
          f"cd.sampling.{name} adapts DeepMind's gemma sampler, which is not installed "
          f"({e}). Install the extra: `pip install -e '.[gemma]'` in a clone (the "
          f"distribution is jax-constrained-decoding[gemma]).") from e
    return getattr(_gemma_sampler, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
