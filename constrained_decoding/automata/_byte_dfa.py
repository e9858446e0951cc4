"""`ByteDfa`: a deterministic automaton over bytes, as plain numpy arrays.

It is the hand-off between the pynini back end (regex IR -> minimal byte DFA) and the
token-level composition with the vocabulary trie (`automata/_compose.py`).

Besides bytes, its alphabet has one symbol per token class of `ir.TOKEN_CLASSES`
(`(?P<TEXT_TOKEN>)`, ...): such a *token-class arc* is read by exactly one whole token of
the class, and composition turns it into a terminal edge (Sec. 2.5.1). Before splicing
(`_splice.py`), it may also have one symbol per shared fragment (`ir.Fragment`).
"""

import dataclasses
import functools

import numpy as np

NO_STATE = -1


def _no_token_arcs() -> np.ndarray:
  return np.zeros((0, 3), np.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class ByteDfa:
  """A deterministic, trimmed automaton over the 256 byte values and the token classes.

  Attributes:
    transitions: int32 `[Q, 256]`; `transitions[q, b]` is the state after byte `b`, or
      `NO_STATE` (-1) when `b` is not allowed in `q`.
    accepting: bool `[Q]`; whether the input may end in each state.
    start: The start state (0 <= start < Q). A DFA for the empty language has Q == 0
      and start == NO_STATE.
    token_arcs: int32 `[A, 3]`; (state, token class, target) sorted by (state, class):
      one whole token of class `ir.TOKEN_CLASSES[token class]` leads from state to
      target. Empty for pure byte languages.
    class_edges: Optional byte classes, see `byte_classes`.
    fragment_arcs: int32 `[F, 3]`; (state, fragment index, target): a text of
      `fragments[fragment index]` leads from state to target. Only from
      `_fsa.compile_byte_dfa(..., fragments=True)`, until `_splice.py` replaces them.
    fragments: The `ir.Fragment` of each fragment index.
    marker_arcs: int32 `[M, 3]`; (state, marker index, target): the register operation
      `markers[marker index]` (an `ir.Marker`) leads from state to target reading no
      byte. Only until `_registers.contract` folds them into byte arcs.
    markers: The `ir.Marker` of each marker index.
  """

  transitions: np.ndarray
  accepting: np.ndarray
  start: int
  token_arcs: np.ndarray = dataclasses.field(default_factory=_no_token_arcs)
  class_edges: np.ndarray | None = None
  fragment_arcs: np.ndarray = dataclasses.field(default_factory=_no_token_arcs)
  fragments: tuple = ()
  marker_arcs: np.ndarray = dataclasses.field(default_factory=_no_token_arcs)
  markers: tuple = ()

  @property
  def num_states(self) -> int:
    return int(self.accepting.shape[0])

  @functools.cached_property
  def byte_classes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(table int32 `[Q, C]`, first byte `[C]`, size `[C]`) of the byte classes.

    `class_edges` (optional, int `[C + 1]` from 0 to 256) splits the bytes into ranges
    `class_edges[k]..class_edges[k+1]-1` that every state treats alike (the compiler
    knows them for free); then `table[:, k]` is the transition on each byte of class k.
    Without it, every byte is a class. Analyses that count or compare bytes per state
    read this `[Q, C]` table instead of `[Q, 256]`, with C ~ 50-70 for JSON schemas.
    """
    edges = np.arange(257) if self.class_edges is None else np.asarray(self.class_edges)
    first = edges[:-1]
    return (np.ascontiguousarray(self.transitions[:, first]), first, np.diff(edges))

  @functools.cached_property
  def register_walker(self):
    """The `_registers.ByteWalker` of a DFA with register markers (built once)."""
    from constrained_decoding.automata import _registers  # pylint: disable=g-import-not-at-top

    return _registers.ByteWalker(self)

  def accepts(self, data: bytes) -> bool:
    """Whether the byte string `data` is in the language (a reference, not fast).

    Only byte paths count: a language that needs a token-class arc accepts no bytes.
    With register markers, their operations apply (`_registers.ByteWalker`).
    """
    if len(self.marker_arcs):
      return self.register_walker.accepts(data)
    state = self.start
    for b in data:
      if state == NO_STATE:
        return False
      state = int(self.transitions[state, b])
    return state != NO_STATE and bool(self.accepting[state])
