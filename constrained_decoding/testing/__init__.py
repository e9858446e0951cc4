"""Helpers for testing code that uses constrained_decoding (numpy references)."""

from constrained_decoding.testing._reference import TokenIndex
from constrained_decoding.testing._reference import reference_allowed
from constrained_decoding.testing._reference import reference_step
from constrained_decoding.testing._reference import reference_walk

__all__ = [
    "TokenIndex",
    "reference_allowed",
    "reference_step",
    "reference_walk",
]
