"""Test helpers: a numpy reference of the device step, and random tokenizations.

Public functions:
  reference_allowed(tables, state, stack)  bool [V] allowed set of one state (and stack).
  reference_step_stack(tables, state, stack, token)  (state, stack) after one token.
  reference_end_allowed(tables, state, stack)  whether end of sequence is allowed.
  reference_stack_needs(tables)           need(q): stack height a state needs to finish.
  reference_walk(tables, tokens, start)   (states, accepted) following tokens with numpy.
  reference_accepts(tables, tokens)       whether the tokens end where end is allowed.
  assert_same_walks(a, b, eos_ids, ...)    random walks: two tables allow the same sets.
  TokenIndex(vocab)                       bytes -> token ids, for random tokenizations.

Register tables (objects whose keys the device checks, `tables.py`): `reference_allowed`
and `reference_step_stack` take the row's register words (`registers=`, zeros when
omitted; `reference_step_stack` then also returns them), and `reference_walk` /
`reference_accepts` thread them. Guards are evaluated by `tables.apply_guard`, the host
definition, independently of the device code.
"""

import random

import numpy as np

from constrained_decoding.tables import (AT_MOST, HASH_PRIME, PAD_TOKEN, RELATIVE,
                                         ConstraintTables, apply_guard)


def zero_registers(tables: ConstraintTables) -> tuple[int, ...]:
  """A row's register words at the start (empty for tables without registers)."""
  return (0,) * int(np.shape(tables.register_init)[0])


def _guard_of(tables: ConstraintTables, group: int, slot) -> int:
  """The guard id of explicit edge `slot` of `group`, -1 for none."""
  if not tables.has_registers:
    return -1
  row = int(np.asarray(tables.group_guarded)[group])
  listed = np.flatnonzero(np.asarray(tables.guarded_slots)[row] == slot)
  return int(np.asarray(tables.guarded_ids)[row, listed[0]]) if len(listed) else -1


def _after_guard(tables: ConstraintTables, guard: int, registers: tuple[int, ...]):
  """The registers after guard `guard` (-1: none), or None when the guard fails."""
  if guard < 0:
    return registers
  return apply_guard(np.asarray(tables.guard_ops)[guard].tolist(), registers,
                     np.asarray(tables.hash_consts).tolist())


def _extended(tables: ConstraintTables, state: int, token: int, registers: tuple[int, ...]):
  """The registers after an unguarded `token` from `state`: a state inside a string item
  of distinct strings extends its block's running hash by the token's `token_hash` row
  (`tables.py`, "Distinct strings"), with Python integers."""
  if not tables.has_hashes or int(np.asarray(tables.state_hashing)[state]) < 0:
    return registers
  block = int(np.asarray(tables.state_hashing)[state])
  m0, a0, m1, a1 = (int(x) for x in np.asarray(tables.token_hash)[token])
  out = list(registers)
  out[block] = (out[block] * m0 + a0) % HASH_PRIME
  out[block + 1] = (out[block + 1] * m1 + a1) % HASH_PRIME
  return tuple(out)


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
                      stack: tuple[int, ...] = (), registers=None) -> np.ndarray:
  """The allowed-token set of `state` with `stack`, unpacked to bool `[V]`.

  Built from the edges, not from `mask_bits`: the explicit tokens of the matching groups,
  the state's terminal bitmaps and end of sequence where allowed. So it checks the packed
  mask rows (and the device's choice of row) rather than repeating them. For push-down
  tables with stack-aware masks, tokens after which the row could not finish within
  `stack_depth` are left out, judged from need(q) recomputed here from the edges
  (`reference_stack_needs`), not from the packed `capped_*` rows.
  """
  bits = np.asarray(tables.eos_bits).copy()
  if not reference_end_allowed(tables, state, stack):
    bits[:] = 0
  for terminal, field in _terminals(tables, state):
    if terminal >= 0:
      term = np.asarray(tables.terminal_bits)[terminal]
      row = np.asarray(tables.terminal_counts)[terminal, 0]
      if row >= 0 and field >= 0:  # Filter.
        term = term & np.asarray(tables.terminal_bits)[field]
      if row >= 0 and field <= AT_MOST:  # Bound: at most AT_MOST - field characters.
        fits = np.zeros(32 * len(term), bool)
        fits[:tables.vocab_size] = np.asarray(tables.token_counts)[row] <= AT_MOST - field
        term = term & np.packbits(fits, bitorder="little").view(np.uint32)
      bits |= term
  allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:tables.vocab_size]
  allowed = allowed.astype(bool)
  edge_start = np.asarray(tables.edge_start)
  edge_tokens = np.asarray(tables.edge_tokens)
  capped = np.asarray(tables.capped_limits).shape[-1] > 0 and tables.stack_depth > 0
  too_deep = []
  registers = zero_registers(tables) if registers is None else tuple(registers)
  for group in _matching_groups(tables, state, stack):
    lo, hi = edge_start[group:group + 2]
    tokens = edge_tokens[lo:hi]
    slots = np.arange(lo, hi)
    if tables.has_registers:  # Register tables: guards decide.
      row = int(np.asarray(tables.group_guarded)[group])
      listed = dict(zip(np.asarray(tables.guarded_slots)[row].tolist(),
                        np.asarray(tables.guarded_ids)[row].tolist()))
      passing = np.array([_after_guard(tables, listed.get(slot, -1), registers) is not None
                          for slot in range(lo, hi)], bool)
      tokens = tokens[passing] if len(tokens) else tokens
      slots = slots[passing] if len(slots) else slots
    allowed[tokens[tokens < tables.vocab_size]] = True
    if capped:  # Guarded tokens too (push-down tables with registers).
      base = len(stack) - int(np.asarray(tables.group_num_pops)[group])
      heights = _edge_heights(tables, slots)
      too_deep.append(tokens[(base + heights > tables.stack_depth)
                             & (tokens < tables.vocab_size)])
  if capped:
    need, _ = reference_stack_needs(tables)
    for term, target in _terminal_moves(tables, state):
      # A terminal edge pushes nothing; tokens an explicit edge takes are judged above.
      if len(stack) + need[target] > tables.stack_depth:
        explicit = np.zeros(tables.vocab_size, bool)
        for group in _matching_groups(tables, state, stack):
          tokens = edge_tokens[edge_start[group]:edge_start[group + 1]]
          explicit[tokens[tokens < tables.vocab_size]] = True
        allowed[term & ~explicit] = False
    for tokens in too_deep:
      allowed[tokens] = False
  return allowed


def _terminal_moves(tables: ConstraintTables, state: int) -> list[tuple[np.ndarray, int]]:
  """(bool [V] tokens, target) of `state`'s terminal entries: a plain entry's bitmap and
  target, a counting entry's tokens split by their target (state + stride * characters
  + bias; push-down counted chains have no filter, -1)."""
  out = []
  for terminal, field in _terminals(tables, state):
    row, stride, bias = (int(x) for x in np.asarray(tables.terminal_counts)[terminal])
    if terminal < 0 or (row < 0 and field < 0):
      continue
    term = np.unpackbits(np.asarray(tables.terminal_bits)[terminal].view(np.uint8),
                         bitorder="little")[:tables.vocab_size].astype(bool)
    if row < 0:
      out.append((term, int(field)))
      continue
    assert field == -1, "a filtered counting entry in push-down tables"
    counts = np.asarray(tables.token_counts)[row].astype(np.int64)
    for c in np.unique(counts[term]).tolist():
      out.append((term & (counts == c), state + stride * c + bias))
  return out


_NEEDS_CACHE: dict[int, tuple[ConstraintTables, tuple[np.ndarray, np.ndarray]]] = {}


def reference_stack_needs(tables: ConstraintTables) -> tuple[np.ndarray, np.ndarray]:
  """(need [S], need_return [S]) of push-down tables, recomputed from the packed arrays
  state by state and group by group (the definitions of `_packing.stack_needs`): need(q) is
  0 if q accepts, else the least height q's pop-free explicit or terminal edges need;
  need_return(s) is 0 if s accepts, else the largest, over accepting states with a group
  popping exactly (s,), of that group's least edge height."""
  cached = _NEEDS_CACHE.get(id(tables))
  if cached is not None and cached[0] is tables:
    return cached[1]
  never = 1 << 30
  accepting = np.asarray(tables.accepting)
  num_states = len(accepting)
  groups = np.asarray(tables.state_groups)
  num_pops = np.asarray(tables.group_num_pops)
  group_pops = np.asarray(tables.group_pops)
  edge_start = np.asarray(tables.edge_start)
  pop_free, returning = [], []  # (state, edges), (return address, edges)
  for q in range(num_states):
    for g in groups[q]:
      edges = np.arange(edge_start[g], edge_start[g + 1]) if g >= 0 else None
      if g >= 0 and num_pops[g] == 0:
        pop_free.append((q, edges))
      elif g >= 0 and num_pops[g] == 1 and accepting[q] and len(edges):
        returning.append((int(group_pops[g, 0]), edges))
  counting = np.asarray(tables.terminal_counts)[:, 0] >= 0
  terms = [(q, int(target)) for q in range(num_states)
           for terminal, target in _terminals(tables, q)
           if terminal >= 0 and target >= 0 and not counting[terminal]]
  terms += [(q, target) for q in range(num_states)  # Counting entries, per count.
            for terminal, _ in _terminals(tables, q) if terminal >= 0 and counting[terminal]
            for _, target in _terminal_moves(tables, q)]
  need = np.where(accepting, 0, never).astype(np.int64)
  need_return = need.copy()
  while True:
    new_need = np.full(num_states, never, np.int64)
    for q, edges in pop_free:
      if len(edges):
        new_need[q] = min(new_need[q], _edge_heights(tables, edges, (need, need_return)).min())
    for q, target in terms:
      new_need[q] = min(new_need[q], need[target])
    new_return = np.full(num_states, -1, np.int64)
    for s, edges in returning:
      new_return[s] = max(new_return[s], _edge_heights(tables, edges, (need, need_return)).min())
    new_return[new_return < 0] = never
    new_need[accepting] = 0
    new_return[accepting] = 0
    new_need, new_return = np.minimum(new_need, never), np.minimum(new_return, never)
    if np.array_equal(new_need, need) and np.array_equal(new_return, need_return):
      break
    need, need_return = new_need, new_return
  _NEEDS_CACHE[id(tables)] = (tables, (need, need_return))
  return need, need_return


def _edge_heights(tables: ConstraintTables, edges: np.ndarray,
                  needs: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
  """Per edge, the stack height above its base (the depth after its pops) that it needs
  so the row, and every return address it pushes once popped, can still finish."""
  need, need_return = reference_stack_needs(tables) if needs is None else needs
  pushes = np.asarray(tables.edge_pushes)[edges]
  lengths = np.asarray(tables.push_lengths)[pushes].astype(np.int64)
  height = lengths + need[np.asarray(tables.edge_targets)[edges]]
  symbols = np.asarray(tables.push_symbols)[pushes]
  for j in range(symbols.shape[1]):
    present = symbols[:, j] >= 0
    height = np.where(
        present, np.maximum(height, j + need_return[np.maximum(symbols[:, j], 0)]), height)
  return height


def reference_step_stack(tables: ConstraintTables, state: int, stack: tuple[int, ...],
                         token: int, registers=None):
  """(state, stack) after `token`: a linear scan of the matching groups' explicit edges,
  then of the terminal edges; None if the token is not allowed (end of sequence aside).
  With `registers` given: (state, stack, registers)."""
  with_registers = registers is not None
  registers = zero_registers(tables) if registers is None else tuple(registers)
  step = _step(tables, state, stack, token, registers)
  if step is None or with_registers:
    return step
  return step[:2]


def _step(tables: ConstraintTables, state: int, stack: tuple[int, ...], token: int,
          registers: tuple[int, ...]):
  edge_start = np.asarray(tables.edge_start)
  edge_tokens = np.asarray(tables.edge_tokens)
  for group in _matching_groups(tables, state, stack):
    lo, hi = edge_start[group:group + 2]
    hit = np.nonzero(edge_tokens[lo:hi] == token)[0]
    if len(hit) and token != PAD_TOKEN:
      slot = lo + hit[0]
      guard = _guard_of(tables, group, slot)
      after = _after_guard(tables, guard, registers)
      if after is None:
        break  # A failing guard: the token may still be a terminal's.
      registers = after if guard >= 0 else _extended(tables, state, token, after)
      n = int(np.asarray(tables.group_num_pops)[group])
      push = int(np.asarray(tables.edge_pushes)[slot])
      length = int(np.asarray(tables.push_lengths)[push])
      pushed = tuple(int(x) for x in np.asarray(tables.push_symbols)[push, :length])
      target = int(np.asarray(tables.edge_targets)[slot])
      if target <= RELATIVE:  # Relative: the state plus RELATIVE - target.
        target = state + RELATIVE - target
      return target, stack[:len(stack) - n] + pushed, registers
  for terminal, target in _terminals(tables, state):
    if terminal >= 0 and 0 <= token < tables.vocab_size:
      word = int(np.asarray(tables.terminal_bits)[terminal, token // 32])
      row, stride, bias = (int(x) for x in np.asarray(tables.terminal_counts)[terminal])
      if row >= 0 and target >= 0:  # A counting entry's filter: both bitmaps hold it.
        word &= int(np.asarray(tables.terminal_bits)[target, token // 32])
      if row >= 0 and target <= AT_MOST:  # A bound: at most AT_MOST - target characters.
        if int(np.asarray(tables.token_counts)[row, token]) > AT_MOST - target:
          word = 0
      if (word >> (token % 32)) & 1:
        registers = _extended(tables, state, token, registers)
        if row >= 0:  # Counting terminal: the state + stride * characters + bias.
          count = int(np.asarray(tables.token_counts)[row, token])
          return state + stride * count + bias, stack, registers
        return int(target), stack, registers
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
    (state, stack) pair, or (state, stack, registers) for register tables), and False
    if a token was forbidden (the walk stops there).
    End-of-sequence tokens are not handled here.
  """
  state = int(np.asarray(tables.start)[0]) if start is None else start
  stack: tuple[int, ...] = ()
  registers = zero_registers(tables)
  states = []
  for t in tokens:
    nxt = reference_step_stack(tables, state, stack, int(t), registers)
    if nxt is None:
      return states, False
    state, stack, registers = nxt
    if not with_stacks:
      states.append(state)
    else:
      states.append((state, stack, registers) if registers else (state, stack))
  return states, True


def reference_accepts(tables: ConstraintTables, tokens, start: int | None = None) -> bool:
  """Whether `tokens` (without end of sequence) lead from `start` to where end is allowed."""
  states, ok = reference_walk(tables, tokens, start, with_stacks=True)
  if not ok:
    return False
  first = int(np.asarray(tables.start)[0]) if start is None else start
  state, stack = states[-1][:2] if states else (first, ())
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


def assert_same_walks(a: ConstraintTables, b: ConstraintTables, eos_ids, *, walks: int,
                      max_steps: int, seed: int = 0) -> None:
  """Asserts that regular tables `a` and `b` allow the same tokens along `walks` random
  walks (1 to `max_steps` - 1 tokens, each drawn from the allowed non-EOS tokens): two
  compilations of one constraint (counted chains against plain composition, say)."""
  rng = np.random.default_rng(seed)
  eos = set(eos_ids)
  for _ in range(walks):
    a_state, b_state = int(a.start[0]), int(b.start[0])
    for _ in range(int(rng.integers(1, max_steps))):
      allowed = reference_allowed(a, a_state)
      np.testing.assert_array_equal(allowed, reference_allowed(b, b_state))
      choices = [t for t in np.flatnonzero(allowed) if t not in eos]
      if not choices:
        break
      token = int(rng.choice(choices))
      a_state = reference_step(a, a_state, token)
      b_state = reference_step(b, b_state, token)
