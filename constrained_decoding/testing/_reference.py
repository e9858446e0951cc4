"""Test helpers: a numpy reference of the device step, and random tokenizations.

Public functions:
  reference_allowed(tables, state)        bool [V] allowed set of one automaton state.
  reference_walk(tables, tokens, start)   (states, accepted) following tokens with numpy.
  reference_accepts(tables, tokens)       whether the tokens end in an accepting state.
  TokenIndex(vocab)                       bytes -> token ids, for random tokenizations.
"""

import random

import numpy as np

from constrained_decoding.tables import PAD_TOKEN, ConstraintTables


def reference_allowed(tables: ConstraintTables, state: int) -> np.ndarray:
  """The allowed-token set of `state`, unpacked to bool `[V]`."""
  bits = np.asarray(tables.mask_bits)[int(np.asarray(tables.state_mask)[state])]
  return np.unpackbits(bits.view(np.uint8), bitorder="little")[:tables.vocab_size].astype(bool)


def reference_step(tables: ConstraintTables, state: int, token: int) -> int | None:
  """The state after `token` (a linear scan of explicit, then terminal edges), or None."""
  lo, hi = np.asarray(tables.edge_start)[state:state + 2]
  tokens = np.asarray(tables.edge_tokens)[lo:hi]
  hit = np.nonzero(tokens == token)[0]
  if len(hit) and token != PAD_TOKEN:
    return int(np.asarray(tables.edge_targets)[lo + hit[0]])
  for terminal, target in np.asarray(tables.state_terminals)[state]:
    if terminal >= 0 and 0 <= token < tables.vocab_size:
      word = int(np.asarray(tables.terminal_bits)[terminal, token // 32])
      if (word >> (token % 32)) & 1:
        return int(target)
  return None


def reference_walk(tables: ConstraintTables, tokens, start: int | None = None):
  """Follows `tokens` from `start` (default: the first constraint's start).

  Returns:
    (states, ok): the state after each consumed token, and False if a token was
    forbidden (the walk stops there). End-of-sequence tokens are not handled here.
  """
  state = int(np.asarray(tables.start)[0]) if start is None else start
  states = []
  for t in tokens:
    nxt = reference_step(tables, state, int(t))
    if nxt is None:
      return states, False
    state = nxt
    states.append(state)
  return states, True


def reference_accepts(tables: ConstraintTables, tokens, start: int | None = None) -> bool:
  """Whether `tokens` (without end of sequence) lead from `start` to an accepting state."""
  states, ok = reference_walk(tables, tokens, start)
  final = states[-1] if states else (int(np.asarray(tables.start)[0]) if start is None
                                     else start)
  return ok and bool(np.asarray(tables.accepting)[final])


class TokenIndex:
  """Maps byte strings to the token ids spelling them, to draw random tokenizations."""

  def __init__(self, vocab):
    self.by_bytes: dict[bytes, list[int]] = {}
    for i, b in enumerate(vocab.token_bytes):
      if b is not None:
        self.by_bytes.setdefault(b, []).append(i)
    self.max_len = max(len(b) for b in self.by_bytes)

  def random_tokenization(self, data: bytes, rng: random.Random) -> list[int]:
    """A uniformly chosen token at each position among those that fit (non-canonical).

    Raises:
      ValueError: If `data` cannot be spelled with this vocabulary.
    """
    # Positions from which the rest of `data` can be tokenized, to never dead-end.
    n = len(data)
    ok = [False] * (n + 1)
    ok[n] = True
    for i in range(n - 1, -1, -1):
      ok[i] = any(ok[i + k] and data[i:i + k] in self.by_bytes
                  for k in range(1, min(self.max_len, n - i) + 1))
    if not ok[0]:
      raise ValueError(f"{data!r} cannot be spelled with this vocabulary.")
    out, i = [], 0
    while i < n:
      choices = [k for k in range(1, min(self.max_len, n - i) + 1)
                 if ok[i + k] and data[i:i + k] in self.by_bytes]
      k = rng.choice(choices)
      out.append(rng.choice(self.by_bytes[data[i:i + k]]))
      i += k
    return out

  def longest_tokenization(self, data: bytes) -> list[int]:
    """Greedy longest-match tokenization (close to what a BPE tokenizer produces)."""
    out, i = [], 0
    while i < len(data):
      for k in range(min(self.max_len, len(data) - i), 0, -1):
        ids = self.by_bytes.get(data[i:i + k])
        if ids:
          out.append(ids[0])
          i += k
          break
      else:
        raise ValueError(f"{data!r} cannot be spelled with this vocabulary.")
    return out
