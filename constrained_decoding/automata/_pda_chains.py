"""Counted chains in push-down tables: `maxLength` strings, `format` parts, `X{n,m}`.

A bounded repetition of a wide character class K (a string with `maxLength` 12, the
host of an e-mail address) is, in a rule's byte DFA, a path of *positions*
p_0 -> p_1 -> ... -> p_m, every character of K leading from p_i to p_(i+1). Walked
token by token, each position has an explicit edge for nearly every token (~250k with
Gemma 3: a `maxLength` 15 string costs 3.7M edges, 4 s). The regular path lays such
chains out position by position and gives them *counting* terminals (`_counting.py`,
`tables.py` "Relative targets"); this module does the same for push-down tables, on
the recursive transition network (`_rtn.Rtn`) before composition:

1. `find_chains` finds the positions on the DFA itself, for the classes K of the
   grammar's bounded repeats: p_i -> p_(i+1) when every UTF-8 character of K read from
   p_i lands on p_(i+1) (intermediate states uniform), and the path ends in a state that
   reads no first byte of K. No state of the path or inside its characters calls a rule
   or is final in its rule (no epsilon move could give a token of K another path).
   Chains may end in the same state (an e-mail host and a `maxLength` string both
   followed by the same `"...`: the minimal DFA merges their ends); each chain after
   the first gets a copy of that end (an equal state: the language is unchanged) so
   that its positions, too, can be laid out before their own end.
2. `renumber` lays each path's positions out consecutively (inside its rule's block,
   the start state first as before), so that p_(i+c) = p_i + c.
3. `chain_edges` gives each position p_i with r = m - i >= 1 characters left a wide
   edge whose bitmap is the tokens wholly in K of 1..r characters (`_ClassCounts`) and
   whose walk is the sub-trie of the other tokens (`_counting._chain_subtrie`): the
   composition walks only those, and its terminal (target p_(i+1), a stand-in that
   `_streamline.py` reads for reachability) becomes, in `counting`, a counting terminal
   p_i -> p_i + count(token).

Exact: a token wholly in K of c <= r characters has exactly one path from p_i (no calls,
no returns on the way), ending at p_(i+c); one of c > r characters dies at p_m; every
other token is walked as before.

Public names:
  find_chains(rtn, classes) -> [[p_0, ..., p_m], ...] with their classes.
  grammar_classes(grammar)  -> the char classes of the grammar's bounded repeats.
  renumber(rtn, chains)     -> (Rtn, old -> new state map).
  chain_edges(...)          -> wide edges of the positions, and the counting tables.
"""

import dataclasses

import numpy as np

from constrained_decoding import tables as _tables
from constrained_decoding.automata import _counting
from constrained_decoding.automata import _counting_terminals
from constrained_decoding.automata import _loops
from constrained_decoding.automata import _unique_strings
from constrained_decoding.automata import _utf8
from constrained_decoding.automata._byte_dfa import NO_STATE
from constrained_decoding.constraints import _ir as ir

# Classes with fewer code points are left to plain composition (few tokens are wholly
# in them), as `_counting.find_chain` does.
MIN_CLASS_SIZE = _counting.MIN_CLASS_SIZE
# Chains of narrower classes (hex digits: ~3k tokens wholly in them with Gemma 3, in the
# `\\uXXXX` escapes of every string) cost more to lay out and pack than their walk:
# measured +30 ms on config_docker_compose with them, for 2% of its edges.
MIN_CHAIN_CLASS_SIZE = 32


@dataclasses.dataclass(frozen=True)
class PdaChain:
  """Positions p_0..p_m (states, in chain order) of class `char_class`, and its *side*
  states: (s, j, H) where every character of H (K or a class inside K) leads from s to
  p_j though s is no position (after the `-` of a host name `[a-z0-9]|-[a-z0-9]`, of a
  `-` in a `[a-z0-9-]` slot, the last hex digit of `\\u`; j = 0: the head `[a-z]` of a
  name `[a-z][a-z0-9_]{2,31}`): c characters of H lead from s to p_(j - 1 + c)."""

  char_class: ir.CharClass
  states: tuple[int, ...]
  # p_m loops on K (`X{n,}`, `minLength` alone): c >= m - i characters from p_i all
  # lead to p_m (a plain terminal entry beside the counting one).
  saturating: bool = False
  sides: tuple[tuple[int, int, "ir.CharClass | FirstIn"], ...] = ()
  # (copy, original): new states (numbered from `rtn.num_states` on) that `renumber`
  # adds as copies of states this chain shares with an earlier one (module doc, step
  # 1): its end p_m (then `states[-1]` is the copy) and the states inside the
  # characters of K read from p_(m-1).
  copies: tuple[tuple[int, int], ...] = ()


def grammar_classes(grammar) -> list[ir.CharClass]:
  """The `CharClass`es of the grammar's rules (inside repeats, unions, concatenations,
  `ir.Graph` arcs, fragments): the candidates `find_chains` checks on the DFA."""
  found: dict = {}

  def keep(node):
    if isinstance(node, ir.CharClass) and _class_size(node) >= MIN_CLASS_SIZE:
      found.setdefault(node.ranges, node)

  seen: set = set()

  def visit(node):
    if id(node) in seen:  # Shared subtrees (definitions inlined many times): once.
      return
    seen.add(id(node))
    keep(node)  # Any class: the hex digits of `\\uXXXX`, a slot's class, a repeat's.
    if isinstance(node, ir.Repeat):
      visit(node.node)
    elif isinstance(node, ir.Concat):
      for part in node.parts:
        visit(part)
    elif isinstance(node, ir.Union):
      for part in node.alternatives:
        visit(part)
    elif isinstance(node, ir.Graph):  # Slotted chains (`_slotted_chains.py`), paths.
      for _, label, _ in node.arcs:
        keep(label)
        visit(label)
    elif isinstance(node, ir.Fragment):
      visit(node.body)

  for _, body in grammar.rules:
    visit(body)
  # Widest first: a chain of `[^"\\]` is also one of its subclasses (hex digits).
  return sorted(found.values(), key=_class_size, reverse=True)


def _class_size(char_class: ir.CharClass) -> int:
  return sum(hi - lo + 1 for lo, hi in char_class.ranges)


def _char_steps(transitions: np.ndarray, blocked: np.ndarray, char_class: ir.CharClass
                ) -> tuple[np.ndarray, np.ndarray]:
  """(next [Q], dead [Q]): the state every character of K leads to from each state (-1
  where characters disagree, die, or pass a `blocked` state inside), and whether a state
  reads no first byte of K at all."""
  q = transitions.shape[0]
  sequences = [seq for lo, hi in char_class.ranges for seq in _utf8.utf8_sequences(lo, hi)]
  dead = (transitions[:, _counting._lead_bytes(char_class)] == NO_STATE).all(axis=1)
  # Only states reading the class's first byte can step (the others keep -1).
  rows = np.flatnonzero(transitions[:, sequences[0][0][0]] != NO_STATE)
  landing = None
  ok = np.ones(len(rows), bool)
  for seq in sequences:
    cur = rows
    alive = ok.copy()
    for k, (a, b) in enumerate(seq):
      if k:  # Inside a character: no epsilon move may start there.
        alive &= ~blocked[cur]
      x = transitions[cur, a:b + 1]
      alive &= (x == x[:, :1]).all(axis=1) & (x[:, 0] != NO_STATE)
      cur = np.where(alive, x[:, 0], 0)
    if landing is None:
      landing = np.where(alive, cur, -1)
    ok &= alive & (cur == landing)
  nxt = np.full(q, -1, np.int64)
  nxt[rows] = np.where(ok, landing, -1)
  return nxt, dead


def find_chains(rtn, classes: list[ir.CharClass], min_positions: int = 4) -> list[PdaChain]:
  """The counted chains of `rtn` (module doc, step 1), each state in at most one.

  With register markers (`Rtn.contracted`), states whose arcs carry an operation, the
  states inside a distinct string item (hashed token by token) and the items' borders
  are no positions and no character may pass them: a counting terminal carries no
  guard.
  """
  blocked = np.asarray(rtn.accepting, bool).copy()
  blocked |= np.array([bool(c) for c in rtn.calls], bool)
  contracted = rtn.contracted
  if contracted is not None:
    if contracted.dfa.transitions.shape != rtn.transitions.shape:
      return []
    for state, _ in contracted.arc_ops:
      blocked[state] = True
    blocked[list(_unique_strings.hashing_states(contracted))] = True
    blocked |= _unique_strings.item_borders(contracted, rtn.num_states)
  used = np.zeros(rtn.num_states, bool)
  used[rtn.start] = True  # The start state keeps its number (tables start at 0).
  chains = []
  num_copies = 0
  for char_class in classes:
    if _class_size(char_class) < MIN_CHAIN_CLASS_SIZE:
      continue  # (Still a side's class below.)
    nxt, dead = _char_steps(rtn.transitions, blocked, char_class)
    nxt[blocked] = -1
    loops = nxt == np.arange(rtn.num_states)
    # An end another chain holds already is copied (`_end_copies`), a looping one not
    # (its copy would not loop on itself).
    ends = np.flatnonzero((dead | loops & ~used) & ~blocked)
    # Predecessors along K (several states may lead to one: the path keeps the one with
    # the longest path before it; the others may become sides).
    sources = np.flatnonzero((nxt >= 0) & (nxt != np.arange(rtn.num_states)) & ~used)
    before: dict = {}
    for s, t in zip(sources.tolist(), nxt[sources].tolist()):
      before.setdefault(t, []).append(s)
    height = _heights(before, ends.tolist())
    for end in ends.tolist():
      path = [end]
      while before.get(path[-1]):
        p = max(before[path[-1]], key=lambda x: (height.get(x, 0), -x))
        if used[p] or p in path:
          break
        path.append(p)
      if len(path) - 1 >= min_positions:
        path.reverse()
        copies = ()
        if used[end]:
          copies = _end_copies(rtn.transitions, char_class, path[-2], end,
                               rtn.num_states + num_copies)
          num_copies += len(copies)
          path[-1] = copies[0][0]
        used[[p for p in path if p < rtn.num_states]] = True
        chains.append(PdaChain(char_class, tuple(path), saturating=bool(loops[end]),
                               copies=copies))
  # Sides, of the chain's class K or of a class H inside it (the last digit of a
  # `\\u` escape: tokens wholly in H go on as characters of K after it).
  steps = {}
  for k, chain in enumerate(chains):
    # (A copied end belongs to no other state: sides reaching its original go with the
    # chain that holds the original.)
    position = {p: j for j, p in enumerate(chain.states) if p < rtn.num_states}
    sides = []
    for char_class in classes:
      if not _inside(char_class, chain.char_class):
        continue
      if char_class.ranges not in steps:
        nxt = _char_steps(rtn.transitions, blocked, char_class)[0]
        nxt[blocked] = -1
        steps[char_class.ranges] = nxt
      nxt = steps[char_class.ranges]
      found = [(s, position[t], _side_class(rtn.transitions[s], char_class,
                                             chain.char_class))
               for s, t in enumerate(nxt.tolist())
               if t in position and not used[s]]
      used[[s for s, _, _ in found]] = True
      sides += found
    chains[k] = dataclasses.replace(chain, sides=tuple(sides))
  return chains


def _end_copies(transitions: np.ndarray, char_class: ir.CharClass, last: int, end: int,
                first_id: int) -> tuple[tuple[int, int], ...]:
  """(copy, original) for `end` and for the states inside the characters of
  `char_class` read from `last` (p_(m-1), the chain's last position; UTF-8 lead and
  continuation states), numbered from `first_id`, the end's copy first."""
  inside = []
  for seq in (seq for lo, hi in char_class.ranges for seq in _utf8.utf8_sequences(lo, hi)):
    cur = last
    for a, _ in seq[:-1]:  # (`_char_steps`: every byte of a range leads alike.)
      cur = int(transitions[cur, a])
      if cur not in inside:
        inside.append(cur)
  originals = [end] + [s for s in inside if s != end]
  return tuple((first_id + k, s) for k, s in enumerate(originals))


def _with_copies(rtn, chains: list[PdaChain]):
  """`rtn` with the chains' copied states appended (`PdaChain.copies`), each an equal
  copy of its original. In the rows of each chain's p_(m-1) and of its copies, arcs to
  an original the chain copied go to the copy instead: the chain's last character
  then ends on its own end, and every path still reads the same bytes to equal states."""
  copies = sorted(c for chain in chains for c in chain.copies)
  if not copies:
    return rtn
  originals = np.array([o for _, o in copies], np.int64)
  transitions = np.concatenate([rtn.transitions, rtn.transitions[originals]])
  for chain in chains:
    if not chain.copies:
      continue
    copy_of = np.arange(len(transitions), dtype=np.int64)
    for copy, original in chain.copies:
      copy_of[original] = copy
    rows = [chain.states[-2]] + [c for c, _ in chain.copies]
    block = transitions[rows]
    transitions[rows] = np.where(block == NO_STATE, NO_STATE, copy_of[np.maximum(block, 0)])
  accepting = np.concatenate([rtn.accepting, rtn.accepting[originals]])
  contracted = rtn.contracted
  if contracted is not None:  # The same DFA: copies carry no operation (not `blocked`).
    contracted = dataclasses.replace(
        contracted, dfa=dataclasses.replace(contracted.dfa, transitions=transitions,
                                            accepting=accepting), source=None)
  return dataclasses.replace(
      rtn, contracted=contracted, transitions=transitions, accepting=accepting,
      calls=rtn.calls + tuple(rtn.calls[o] for o in originals.tolist()),
      rule_of_state=np.concatenate([rtn.rule_of_state, rtn.rule_of_state[originals]]))


def _side_class(row: np.ndarray, inner: ir.CharClass, outer: ir.CharClass):
  """The side's class: `outer` (K) as a `FirstIn(K, H)` when H = `inner` is ASCII and
  the side reads no first byte of K outside H (then a token wholly in K starting in H
  goes on along the chain, and every other token wholly in K dies there), else H."""
  if inner.ranges == outer.ranges or max(hi for _, hi in inner.ranges) >= 0x80:
    return inner
  others = _counting._lead_bytes(outer) & ~_counting._lead_bytes(inner)  # H: ASCII
  if (row[others] != NO_STATE).any():
    return inner
  return FirstIn(outer, inner)


@dataclasses.dataclass(frozen=True)
class FirstIn:
  """Tokens wholly in `outer` whose first character is in `inner` (ASCII)."""

  outer: ir.CharClass
  inner: ir.CharClass


def _inside(inner: ir.CharClass, outer: ir.CharClass) -> bool:
  """Whether every code point of `inner` is in `outer`."""
  return all(any(lo <= a and b <= hi for lo, hi in outer.ranges) for a, b in inner.ranges)


def _heights(before: dict, ends: list) -> dict:
  """Longest backward path from each state reached backwards from `ends` (a forest:
  each state has one successor along K)."""
  height: dict = {}
  order = []
  todo = list(ends)
  seen = set(todo)
  while todo:  # Breadth-first from the ends, then heights from the leaves down.
    s = todo.pop()
    order.append(s)
    for p in before.get(s, ()):
      if p not in seen:
        seen.add(p)
        todo.append(p)
  for s in reversed(order):
    height[s] = 1 + max((height.get(p, 0) for p in before.get(s, ())), default=0)
  return height


def renumber(rtn, chains: list[PdaChain]):
  """(Rtn with each chain's positions consecutive, old -> new int64 [Q]).

  Within each rule's block of states the others keep their order and come first, then
  the chains' positions in chain order: rules stay consecutive blocks. The chains'
  copied states (`PdaChain.copies`) are added first.
  """
  rtn = _with_copies(rtn, chains)
  q = rtn.num_states
  chain_rank = np.full(q, -1, np.int64)
  rank = 0
  for chain in chains:
    for s in chain.states + tuple(s for s, _, _ in chain.sides):
      chain_rank[s] = rank
      rank += 1
  rule = np.asarray(rtn.rule_of_state, np.int64)
  key = np.lexsort((np.where(chain_rank >= 0, chain_rank, np.arange(q)), chain_rank >= 0,
                    rule))
  new_of = np.empty(q, np.int64)
  new_of[key] = np.arange(q)
  transitions = rtn.transitions[key]
  transitions = np.where(transitions == NO_STATE, NO_STATE,
                         new_of[np.maximum(transitions, 0)]).astype(rtn.transitions.dtype)
  calls = tuple(tuple((r, int(new_of[ret])) for r, ret in rtn.calls[old])
                for old in key.tolist())
  contracted = rtn.contracted
  if contracted is not None:  # The same DFA (`_rtn._contracted`), renumbered alike.
    contracted = dataclasses.replace(
        contracted, dfa=dataclasses.replace(
            contracted.dfa, transitions=transitions, accepting=contracted.dfa.accepting[key],
            start=int(new_of[contracted.dfa.start]),
            **{name: _renumbered_arcs(getattr(contracted.dfa, name), new_of)
               for name in ("token_arcs", "fragment_arcs", "marker_arcs")}),
        arc_ops={(int(new_of[state]), byte): ops
                 for (state, byte), ops in contracted.arc_ops.items()},
        source=None)
  out = dataclasses.replace(
      rtn, contracted=contracted, transitions=transitions, calls=calls,
      accepting=rtn.accepting[key],
      rule_of_state=rtn.rule_of_state[key],
      rule_start=tuple(int(new_of[s]) for s in rtn.rule_start),
      tops=tuple(frozenset(int(new_of[s]) for s in top) for top in rtn.tops))
  return out, new_of


def _renumbered_arcs(arcs: np.ndarray, new_of: np.ndarray) -> np.ndarray:
  """(state, label, target) rows with both states renumbered, sorted again by
  (state, label) as `ByteDfa` keeps them."""
  if not len(arcs):
    return arcs
  out = np.asarray(arcs).copy()
  out[:, 0] = new_of[out[:, 0]]
  out[:, 2] = new_of[out[:, 2]]
  return out[np.lexsort((out[:, 1], out[:, 0]))].astype(np.asarray(arcs).dtype)


def _first_in(counts, char_class: ir.CharClass) -> np.ndarray:
  """uint32 [W]: the tokens whose first byte is in `char_class` (ASCII), kept with the
  class's other per-vocabulary memos (`_ClassCounts.inner`)."""
  key = ("first", char_class.ranges)
  if key not in counts.inner:
    in_h = _counting._lead_bytes(char_class)  # ASCII: the class's own bytes.
    tokens = np.flatnonzero(in_h[counts.first_bytes[:, 0]] & (counts.lengths > 0))
    counts.inner[key] = _tables.bitmask(tokens, len(counts.counts))
  return counts.inner[key]


def chain_edges(chains: list[PdaChain], new_of: np.ndarray, wide: dict, trie, vocab,
                num_words: int, cache_dir: str | None):
  """(wide edges of the chains' positions to add to `wide`, {state: (class row, bias,
  counting bitmap, bitmap of the tokens leading to p_m or None, p_m)}, token_counts int8
  `[C, V]`: the characters of each token wholly in class c, else 0).

  Positions that are wide already keep their edge (and are walked as before)."""
  edges: dict = {}
  classes: dict = {}  # ranges -> (row, counts, terminal)
  state_rows: dict = {}

  def of_class(char_class):
    if char_class.ranges not in classes:
      counts = _counting._class_counts(vocab, char_class, cache_dir)
      row = len(classes)
      # Every token not wholly in the class (a byte no position reads just dies there).
      subtrie = _counting._chain_subtrie(counts, np.ones(256, bool), trie)
      # A terminal that is no loop's (`loop` None): the walk reads its key and sub-trie.
      classes[char_class.ranges] = (row, counts, _loops.LoopTerminal(
          key=f"counted-chain:{row}", bits=_counting_terminals._bitmap(counts, 127, num_words),
          num_tokens=0, subtrie=subtrie))
    return classes[char_class.ranges]

  for chain in chains:
    m = len(chain.states) - 1
    new = [int(new_of[p]) for p in chain.states]
    # (state, class, characters left r, bias): c characters lead to state + c + bias.
    entries = [(new[i], chain.char_class, m - i, 0) for i in range(m)]
    entries += [(int(new_of[s]), h, m - j + 1, new[0] + j - 1 - int(new_of[s]))
                for s, j, h in chain.sides]
    for state, char_class, r, bias in entries:
      first = None
      if isinstance(char_class, FirstIn):
        char_class, first = char_class.outer, char_class.inner
      row, counts, terminal = of_class(char_class)
      counted = r - 1 if chain.saturating else r
      bits = _counting_terminals._bitmap(counts, counted, num_words)
      whole = _counting_terminals._bitmap(counts, 127, num_words)
      if first is not None:
        bits = bits & _first_in(counts, first)
        whole = whole & _first_in(counts, first)
      # Saturating: the tokens of r characters or more all lead to p_m.
      rest = (whole & ~_counting_terminals._bitmap(counts, counted, num_words)
              if chain.saturating else None)
      # The stand-in target (for `_streamline`): where one character leads.
      edges[state] = _loops.WideEdge(parts=((terminal, None),),
                                     bits=whole if chain.saturating else bits,
                                     target=state + 1 + bias)
      state_rows[state] = (row, bias, bits, rest, new[m])
  counts_of = [counts for _, counts, _ in classes.values()]
  token_counts = (np.stack([c.counts for c in counts_of]) if counts_of
                  else np.zeros((0, vocab.vocab_size), np.int8))
  return edges, state_rows, token_counts


def attach_counting(token_pda, state_rows: dict, token_counts: np.ndarray):
  """(token PDA, terminal_counts int32 `[T, 3]`, second entries [(state, terminal,
  target)]): the positions' terminals made counting.

  Their bitmaps get terminal ids of their own (the composition shares equal bitmaps,
  and a loop's may equal a chain's), `terminal_target` becomes the filter -1 (all the
  bitmap's tokens: it holds only those of at most r characters already), and
  `terminal_counts` (class row, stride 1, bias): the device moves to p + count + bias.
  A saturating chain's positions get a second, plain entry: the longer tokens to p_m.
  """
  bits = [token_pda.terminal_bits]
  state_terminal = token_pda.state_terminal.copy()
  terminal_target = token_pda.terminal_target.copy()
  counts = [np.full((token_pda.terminal_bits.shape[0], 3), NO_STATE, np.int32)]
  own: dict = {}
  second = []

  def terminal_id(key, bitmap, count_row) -> int:
    if key not in own:
      own[key] = len(own) + token_pda.terminal_bits.shape[0]
      bits.append(bitmap[None])
      counts.append(np.array([count_row], np.int32))
    return own[key]

  for state, (row, bias, counting, rest, end) in sorted(state_rows.items()):
    state_terminal[state] = terminal_id((row, bias, counting.tobytes()), counting,
                                        [row, 1, bias])
    terminal_target[state] = -1
    if rest is not None:
      second.append((state, terminal_id(("plain", rest.tobytes()), rest,
                                        [NO_STATE] * 3), end))
  out = dataclasses.replace(token_pda, terminal_bits=np.concatenate(bits),
                            state_terminal=state_terminal, terminal_target=terminal_target)
  return out, np.concatenate(counts), second
