"""Helpers for testing code that uses constrained_decoding (numpy references)."""

from constrained_decoding.testing._reference import TokenIndex
from constrained_decoding.testing._reference import reference_accepts
from constrained_decoding.testing._reference import reference_allowed
from constrained_decoding.testing._reference import reference_end_allowed
from constrained_decoding.testing._reference import reference_step
from constrained_decoding.testing._reference import reference_step_stack
from constrained_decoding.testing._reference import reference_walk
from constrained_decoding.testing._walks import distances_to_accept
from constrained_decoding.testing._walks import random_accepted_bytes

__all__ = [
    "TokenIndex",
    "distances_to_accept",
    "random_accepted_bytes",
    "reference_accepts",
    "reference_allowed",
    "reference_end_allowed",
    "reference_step",
    "reference_step_stack",
    "reference_walk",
]
