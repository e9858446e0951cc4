"""`ByteDfa`: a deterministic automaton over bytes, as plain numpy arrays.

It is the hand-off between the pynini back end (regex IR -> minimal byte DFA) and the
token-level composition with the vocabulary trie (`automata/_compose.py`).
"""

import dataclasses

import numpy as np

NO_STATE = -1


@dataclasses.dataclass(frozen=True, eq=False)
class ByteDfa:
  """A deterministic, trimmed automaton over the 256 byte values.

  Attributes:
    transitions: int32 `[Q, 256]`; `transitions[q, b]` is the state after byte `b`, or
      `NO_STATE` (-1) when `b` is not allowed in `q`.
    accepting: bool `[Q]`; whether the input may end in each state.
    start: The start state (0 <= start < Q). A DFA for the empty language has Q == 0
      and start == NO_STATE.
  """

  transitions: np.ndarray
  accepting: np.ndarray
  start: int

  @property
  def num_states(self) -> int:
    return int(self.accepting.shape[0])

  def accepts(self, data: bytes) -> bool:
    """Whether the byte string `data` is in the language (a reference, not fast)."""
    state = self.start
    for b in data:
      if state == NO_STATE:
        return False
      state = int(self.transitions[state, b])
    return state != NO_STATE and bool(self.accepting[state])
