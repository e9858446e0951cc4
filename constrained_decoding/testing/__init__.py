"""Helpers for testing code that uses constrained_decoding (numpy references, and the
exact distribution of a finite language for grammar-aligned sampling, random
derivations of a grammar)."""

from constrained_decoding.testing._derivations import random_derivation
from constrained_decoding.testing._exact import ExactDistribution
from constrained_decoding.testing._exact import accepted_sequences
from constrained_decoding.testing._exact import empirical_kl
from constrained_decoding.testing._exact import exact_distribution
from constrained_decoding.testing._lexed_rows import run_lexed_rows
from constrained_decoding.testing._reference import TokenIndex
from constrained_decoding.testing._reference import reference_accepts
from constrained_decoding.testing._reference import reference_allowed
from constrained_decoding.testing._reference import reference_end_allowed
from constrained_decoding.testing._reference import reference_step
from constrained_decoding.testing._reference import reference_stack_needs
from constrained_decoding.testing._reference import reference_step_stack
from constrained_decoding.testing._reference import reference_walk
from constrained_decoding.testing._walks import distances_to_accept
from constrained_decoding.testing._walks import random_accepted_bytes

__all__ = [
    "ExactDistribution",
    "TokenIndex",
    "accepted_sequences",
    "distances_to_accept",
    "empirical_kl",
    "exact_distribution",
    "random_derivation",
    "random_accepted_bytes",
    "reference_accepts",
    "reference_allowed",
    "reference_end_allowed",
    "reference_stack_needs",
    "reference_step",
    "reference_step_stack",
    "reference_walk",
    "run_lexed_rows",
]
