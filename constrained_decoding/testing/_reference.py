"""Test helpers: a numpy reference of the device step, and random tokenizations.

Public functions:
  reference_allowed(tables, state, stack)  bool [V] allowed set of one state (and stack).
  reference_step_stack(tables, state, stack, token)  (state, stack) after one token.
  reference_end_allowed(tables, state, stack)  whether end of sequence is allowed.
  reference_walk(tables, tokens, start)   (states, accepted) following tokens with numpy.
  reference_accepts(tables, tokens)       whether the tokens end where end is allowed.
  TokenIndex(vocab)                       bytes -> token ids, for random tokenizations.
"""

import random

import numpy as np

from constrained_decoding.tables import PAD_TOKEN, RELATIVE, ConstraintTables


def _matching_groups(tables: ConstraintTables, state: int, stack: tuple[int, ...]):
  """The groups of `state` whose pops match the top of `stack` (bottom first)."""
  out = []
  for group in np.asarray(tables.state_groups)[state]:
    if group < 0:
      continue
    n = int(np.asarray(tables.group_num_pops)[group])
    pops = tuple(int(x) for x in np.asarray(tables.group_pops)[group, :n])
    if n <= len(stack) and tuple(reversed(stack[len(stack) - n:])) == pops:
      out.append(int(group))
  return out


def _terminals(tables: ConstraintTables, state: int) -> np.ndarray:
  """The terminal entries of `state` (through `state_terminal_rows` when present)."""
  rows = np.asarray(tables.state_terminal_rows)
  return np.asarray(tables.state_terminals)[rows[state] if len(rows) else state]


def reference_end_allowed(tables: ConstraintTables, state: int, stack: tuple[int, ...] = ()) -> bool:
  """Whether end of sequence is allowed: `state` and every state on `stack` accept."""
  accepting = np.asarray(tables.accepting)
  return bool(accepting[state]) and all(bool(accepting[s]) for s in stack)


def reference_allowed(tables: ConstraintTables, state: int,
                      stack: tuple[int, ...] = ()) -> np.ndarray:
  """The allowed-token set of `state` with `stack`, unpacked to bool `[V]`.

  Built from the edges, not from `mask_bits`: the explicit tokens of the matching groups,
  the state's terminal bitmaps and end of sequence where allowed. So it checks the packed
  mask rows (and the device's choice of row) rather than repeating them.
  """
  bits = np.asarray(tables.eos_bits).copy()
  if not reference_end_allowed(tables, state, stack):
    bits[:] = 0
  for terminal, field in _terminals(tables, state):
    if terminal >= 0:
      term = np.asarray(tables.terminal_bits)[terminal]
      if np.asarray(tables.terminal_counts)[terminal, 0] >= 0 and field >= 0:  # Filter.
        term = term & np.asarray(tables.terminal_bits)[field]
      bits |= term
  allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:tables.vocab_size]
  allowed = allowed.astype(bool)
  edge_start = np.asarray(tables.edge_start)
  edge_tokens = np.asarray(tables.edge_tokens)
  for group in _matching_groups(tables, state, stack):
    tokens = edge_tokens[edge_start[group]:edge_start[group + 1]]
    allowed[tokens[tokens < tables.vocab_size]] = True
  return allowed


def reference_step_stack(tables: ConstraintTables, state: int, stack: tuple[int, ...],
                         token: int) -> tuple[int, tuple[int, ...]] | None:
  """(state, stack) after `token`: a linear scan of the matching groups' explicit edges,
  then of the terminal edges; None if the token is not allowed (end of sequence aside)."""
  edge_start = np.asarray(tables.edge_start)
  edge_tokens = np.asarray(tables.edge_tokens)
  for group in _matching_groups(tables, state, stack):
    lo, hi = edge_start[group:group + 2]
    hit = np.nonzero(edge_tokens[lo:hi] == token)[0]
    if len(hit) and token != PAD_TOKEN:
      slot = lo + hit[0]
      n = int(np.asarray(tables.group_num_pops)[group])
      push = int(np.asarray(tables.edge_pushes)[slot])
      length = int(np.asarray(tables.push_lengths)[push])
      pushed = tuple(int(x) for x in np.asarray(tables.push_symbols)[push, :length])
      target = int(np.asarray(tables.edge_targets)[slot])
      if target <= RELATIVE:  # Relative: the state plus RELATIVE - target.
        target = state + RELATIVE - target
      return target, stack[:len(stack) - n] + pushed
  for terminal, target in _terminals(tables, state):
    if terminal >= 0 and 0 <= token < tables.vocab_size:
      word = int(np.asarray(tables.terminal_bits)[terminal, token // 32])
      row, stride, bias = (int(x) for x in np.asarray(tables.terminal_counts)[terminal])
      if row >= 0 and target >= 0:  # A counting entry's filter: both bitmaps hold it.
        word &= int(np.asarray(tables.terminal_bits)[target, token // 32])
      if (word >> (token % 32)) & 1:
        if row >= 0:  # Counting terminal: the state + stride * characters + bias.
          count = int(np.asarray(tables.token_counts)[row, token])
          return state + stride * count + bias, stack
        return int(target), stack
  return None


def reference_step(tables: ConstraintTables, state: int, token: int) -> int | None:
  """The state after `token` for a regular constraint (empty stack), or None."""
  step = reference_step_stack(tables, state, (), token)
  return None if step is None else step[0]


def reference_walk(tables: ConstraintTables, tokens, start: int | None = None,
                   *, with_stacks: bool = False):
  """Follows `tokens` from `start` (default: the first constraint's start).

  Returns:
    (states, ok): the state after each consumed token (with `with_stacks`, a
    (state, stack) pair), and False if a token was forbidden (the walk stops there).
    End-of-sequence tokens are not handled here.
  """
  state = int(np.asarray(tables.start)[0]) if start is None else start
  stack: tuple[int, ...] = ()
  states = []
  for t in tokens:
    nxt = reference_step_stack(tables, state, stack, int(t))
    if nxt is None:
      return states, False
    state, stack = nxt
    states.append((state, stack) if with_stacks else state)
  return states, True


def reference_accepts(tables: ConstraintTables, tokens, start: int | None = None) -> bool:
  """Whether `tokens` (without end of sequence) lead from `start` to where end is allowed."""
  states, ok = reference_walk(tables, tokens, start, with_stacks=True)
  if not ok:
    return False
  first = int(np.asarray(tables.start)[0]) if start is None else start
  state, stack = states[-1] if states else (first, ())
  return reference_end_allowed(tables, state, stack)


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
