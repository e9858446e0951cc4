"""Host side: vocabularies (token id -> bytes) and their loaders."""

from constrained_decoding.vocab._vocabulary import Vocabulary

__all__ = [
    "Vocabulary",
]
