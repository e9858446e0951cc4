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

Sides (`PdaChain.sides`) count the same way from states next to the positions: after the
`-` of a host name, after the `\\` or `\\uX` of an escape inside a counted string
(`_byte_sides`, kept where their terminal saves `_MARGIN` times its bytes in edges).

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


def find_chains(rtn, classes: list[ir.CharClass], min_positions: int = 2) -> list[PdaChain]:
  """The counted chains of `rtn` (module doc, step 1), each state in at most one.

  Chains of `min_positions` characters and more: a two-letter country code
  (`maxLength` 2) walked ~41k and ~19k tokens at its two positions with Gemma 3.

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
    # Only ends with a predecessor can end a chain (an end is never one: it reads no K
    # or loops on it), so the others are left out of the walks (2 x 40 -> ms a compile).
    reached = np.zeros(rtn.num_states, bool)
    reached[nxt[sources]] = True
    ends = ends[reached[ends]]
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
    sides += _byte_sides(rtn.transitions, chain, position, used, blocked)
    chains[k] = dataclasses.replace(chain, sides=tuple(sides))
  return chains


def _byte_sides(transitions: np.ndarray, chain: PdaChain, position: dict,
                used: np.ndarray, blocked: np.ndarray) -> list:
  """Sides found byte by byte, marked `used`: a state s, no position and not blocked,
  from which d <= `MAX_SIDE_DEPTH` ASCII characters of K, the k-th in a class H_k, lead
  to one position p_j, every state on the way reading no other character of K.

  The state after the `\\` of an escape inside a counted string is one with d = 1 (`n`,
  `t`, `/`, ... end the escape at p_j, so a token `nice` goes on to p_(j+3)), and so
  are those after `\\u`, `\\uX`, ... (d = 4, 3, ...: `\\u00e9` is one character of
  the string). The characters of K that s reads outside H_1 (the `u` of `\\u`) are in
  `FirstIn.others`: their tokens are walked as before."""
  k_bytes = _counting._lead_bytes(chain.char_class)
  ascii_k = np.flatnonzero(k_bytes[:128])
  j_of_state = np.full(transitions.shape[0] + 1, -1, np.int64)  # [-1]: NO_STATE.
  j_of_state[list(position)] = list(position.values())
  near = _near_positions(transitions, k_bytes, ascii_k, j_of_state >= 0, blocked)
  reach = near[transitions[:, ascii_k]]  # (NO_STATE reads near[-1], False.)
  sides = []
  for s in np.flatnonzero(reach.any(axis=1) & ~used & ~blocked).tolist():
    found = _side_path(transitions, s, k_bytes, ascii_k, j_of_state, blocked)
    if found is None:
      continue
    j, heads, others = found
    sides.append((s, j, FirstIn(chain.char_class, heads[0], others, tuple(heads[1:]),
                                bytewise=True)))
    used[s] = True
  return sides


MAX_SIDE_DEPTH = 4  # `\\uXXXX`: from the state after `\\u`, four hex digits.


def _near_positions(transitions: np.ndarray, k_bytes: np.ndarray, ascii_k: np.ndarray,
                    is_position: np.ndarray, blocked: np.ndarray) -> np.ndarray:
  """bool [Q + 1] (last: False, for NO_STATE): positions, and the states (not blocked)
  whose characters of K are all ASCII and lead to one state that is near in turn, less
  than `MAX_SIDE_DEPTH` such steps from a position (`_side_path`'s intermediate
  states): the candidates' targets, so that only those are followed one by one."""
  targets = transitions[:, ascii_k]
  live = targets != NO_STATE
  first = targets[np.arange(len(targets)), live.argmax(axis=1)]
  uniform = live.any(axis=1) & ((targets == first[:, None]) | ~live).all(axis=1)
  wide_bytes = k_bytes.copy()
  wide_bytes[:128] = False
  uniform &= ~(transitions[:, wide_bytes] != NO_STATE).any(axis=1) & ~blocked
  near = np.append(is_position[:-1], False)
  for _ in range(MAX_SIDE_DEPTH - 1):
    near[:-1] |= uniform & near[np.where(uniform, first, -1)]
  return near


def _side_path(transitions: np.ndarray, s: int, k_bytes: np.ndarray, ascii_k: np.ndarray,
               j_of_state: np.ndarray, blocked: np.ndarray):
  """(j, [H_1, ..., H_d], others) of a side found byte by byte at `s`
  (`_byte_sides`), or None."""
  heads = []
  state = s
  others = ()
  for depth in range(MAX_SIDE_DEPTH):
    targets = transitions[state, ascii_k]
    live = targets != NO_STATE
    if not live.any():
      return None
    # The most common target of the ASCII characters of K (a position first).
    at_position = live & (j_of_state[targets] >= 0)
    pool = targets[at_position] if at_position.any() else targets[live]
    values, counts = np.unique(pool, return_counts=True)
    nxt = int(values[counts.argmax()])
    h = np.zeros(256, bool)
    h[ascii_k[targets == nxt]] = True
    outside = k_bytes & ~h & (transitions[state] != NO_STATE)
    if depth == 0:
      others = tuple(np.flatnonzero(outside).tolist())
    elif outside.any():  # A character of K that leaves the path: its tokens are lost.
      return None
    heads.append(_byte_class(h))
    if j_of_state[nxt] >= 0:
      return int(j_of_state[nxt]), heads, others
    if blocked[nxt]:
      return None
    state = nxt
  return None


def _byte_class(ascii_bytes: np.ndarray) -> ir.CharClass:
  """The `CharClass` of the ASCII characters set in bool [256] `ascii_bytes`."""
  ranges = []
  for b in np.flatnonzero(ascii_bytes).tolist():
    if ranges and ranges[-1][1] == b - 1:
      ranges[-1] = (ranges[-1][0], b)
    else:
      ranges.append((b, b))
  return ir.CharClass(tuple(ranges))


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
  """Tokens wholly in `outer` whose first character is in `inner` (ASCII) and, with
  `later`, whose next characters are in those classes (ASCII; tokens of fewer
  characters are walked). `others`: first bytes of `outer` outside `inner` that the
  side reads too (elsewhere): tokens starting with them are walked, whether wholly in
  `outer` or not."""

  outer: ir.CharClass
  inner: ir.CharClass
  others: tuple[int, ...] = ()
  later: tuple[ir.CharClass, ...] = ()
  bytewise: bool = False  # Found by `_byte_sides` (kept only where it pays).

  @property
  def depth(self) -> int:
    """Characters from the side to its position p_j."""
    return 1 + len(self.later)


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
    sides = ([side for side in chain.sides if not _optional(side[2])]
             + sorted((side for side in chain.sides if _optional(side[2])),
                      key=lambda side: (_side_kind(side[2]), side[1])))
    for s in chain.states + tuple(s for s, _, _ in sides):
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


def _optional(side_class) -> bool:
  """Whether a side was found byte by byte (`_byte_sides`): kept only where it pays
  (`_unprofitable`)."""
  return isinstance(side_class, FirstIn) and side_class.bytewise


def _side_kind(side_class) -> tuple:
  """A sort key of a side's class: `renumber` lays out the sides of one class in order
  of their position j, so that consecutive ones share their bias p_(j-1) - s (and, with
  equal bitmaps, their counting terminal: `attach_counting`)."""
  if isinstance(side_class, FirstIn):
    return (1, side_class.outer.ranges, side_class.inner.ranges, side_class.others,
            tuple(c.ranges for c in side_class.later))
  return (0, side_class.ranges)


def _renumbered_arcs(arcs: np.ndarray, new_of: np.ndarray) -> np.ndarray:
  """(state, label, target) rows with both states renumbered, sorted again by
  (state, label) as `ByteDfa` keeps them."""
  if not len(arcs):
    return arcs
  out = np.asarray(arcs).copy()
  out[:, 0] = new_of[out[:, 0]]
  out[:, 2] = new_of[out[:, 2]]
  return out[np.lexsort((out[:, 1], out[:, 0]))].astype(np.asarray(arcs).dtype)


def _first_in(counts, first_in: FirstIn) -> np.ndarray:
  """uint32 [W]: the tokens whose k-th byte is in the k-th class of `first_in` (`inner`,
  then `later`: ASCII), kept with the class's other per-vocabulary memos
  (`_ClassCounts.inner`)."""
  heads = (first_in.inner,) + first_in.later
  key = ("first",) + tuple(c.ranges for c in heads)
  if key not in counts.inner:
    ok = counts.lengths >= len(heads)
    for k, char_class in enumerate(heads):  # ASCII: the classes' own bytes.
      ok &= _counting._lead_bytes(char_class)[counts.first_bytes[:, k]]
    counts.inner[key] = _tables.bitmask(np.flatnonzero(ok), len(counts.counts))
  return counts.inner[key]


def chain_edges(chains: list[PdaChain], new_of: np.ndarray, wide: dict, trie, vocab,
                num_words: int, cache_dir: str | None):
  """(wide edges of the chains' positions to add to `wide`, {state: (class row, bias,
  counting bitmap, bitmap of the tokens leading to p_m or None, p_m)}, token_counts int8
  `[C, V]`: the characters of each token wholly in class c, else 0).

  Positions that are wide already get this edge instead (a chain's tokens are counted
  wherever they start)."""
  edges: dict = {}
  classes: dict = {}  # ranges -> (row, counts)
  terminals: dict = {}  # (ranges, depth) -> terminal
  state_rows: dict = {}

  def of_class(char_class, depth: int):
    if char_class.ranges not in classes:
      counts = _counting._class_counts(vocab, char_class, cache_dir)
      classes[char_class.ranges] = (len(classes), counts)
    row, counts = classes[char_class.ranges]
    if (char_class.ranges, depth) not in terminals:
      # Every token not wholly in the class (a byte no position reads just dies there),
      # and those of fewer characters than a side's depth (they stop short of p_j).
      subtrie = _counting._chain_subtrie(counts, np.ones(256, bool), trie,
                                         shorter_than=depth)
      # A terminal that is no loop's (`loop` None): the walk reads its key and sub-trie.
      terminals[char_class.ranges, depth] = _loops.LoopTerminal(
          key=f"counted-chain:{row}" + (f":{depth}" if depth > 1 else ""),
          bits=_counting_terminals._bitmap(counts, 127, num_words), num_tokens=0,
          subtrie=subtrie)
    return row, counts, terminals[char_class.ranges, depth]

  side_rows = []  # (state, terminal key, tokens counted), of the sides.
  for chain in chains:
    m = len(chain.states) - 1
    new = [int(new_of[p]) for p in chain.states]
    # (state, class, characters left r, bias): c characters lead to state + c + bias.
    # (A side's first d characters lead to p_j: c characters to p_(j - d + c).)
    entries = [(new[i], chain.char_class, m - i, 0, 1) for i in range(m)]
    entries += [(int(new_of[s]), h, m - j + d, new[0] + j - d - int(new_of[s]), d)
                for s, j, h in chain.sides
                for d in [h.depth if isinstance(h, FirstIn) else 1]]
    for state, char_class, r, bias, depth in entries:
      first = walked = None
      optional = _optional(char_class)
      if isinstance(char_class, FirstIn):
        if char_class.others:  # Walked in the full trie (`_compose._narrow`).
          walked = np.ones(256, bool)
          walked[list(char_class.others)] = False
        char_class, first = char_class.outer, char_class
      row, counts, terminal = of_class(char_class, depth)
      counted = r - 1 if chain.saturating else r
      bits = _counting_terminals._bitmap(counts, counted, num_words)
      whole = _counting_terminals._bitmap(counts, 127, num_words)
      if first is not None:
        bits = bits & _first_in(counts, first)
        whole = whole & _first_in(counts, first)
      # Saturating: the tokens of r characters or more all lead to p_m.
      rest = (whole & ~_counting_terminals._bitmap(counts, counted, num_words)
              if chain.saturating else None)
      # The stand-in target (for `_streamline`): where `depth` characters lead.
      edges[state] = _loops.WideEdge(parts=((terminal, walked),),
                                     bits=whole if chain.saturating else bits,
                                     target=state + depth + bias)
      state_rows[state] = (row, bias, bits, rest, new[m])
      if optional:
        counted = _loops.popcount(bits) + (0 if rest is None else _loops.popcount(rest))
        side_rows.append((state, (row, bias, bits.tobytes()), counted))
  for state in _unprofitable(side_rows, num_words):
    del edges[state], state_rows[state]  # Walked token by token as before.
  counts_of = [counts for _, counts in classes.values()]
  token_counts = (np.stack([c.counts for c in counts_of]) if counts_of
                  else np.zeros((0, vocab.vocab_size), np.int8))
  return edges, state_rows, token_counts


def _unprofitable(side_rows: list, num_words: int) -> list:
  """The sides whose counting terminal (a bitmap of `num_words` words, shared by the
  sides with the same key: `attach_counting`) would not replace explicit edges (12
  bytes each: token, target, push) worth `_MARGIN` times its bytes."""
  counted: dict = {}
  for _, key, tokens in side_rows:
    counted[key] = counted.get(key, 0) + tokens
  return [state for state, key, _ in side_rows
          if counted[key] * _EDGE_BYTES < _MARGIN * num_words * 4]


_EDGE_BYTES = 12
# Tables grow in powers of two (more terminals can cross a bucket where fewer edges do
# not): measured on the corpus under free_form_depth=None, a margin of 1 or 2 made
# k8s_container's tables 4 MiB larger, 4 never larger.
_MARGIN = 4


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
