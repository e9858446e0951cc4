"""The lexer level of grammars with a lexer (issue 18, increment 1; docs/lexer_runtime.md).

A *terminal set* (names with a regex, a string literal or constraint IR, priorities, the
`%ignore`d ones) becomes one minimal byte DFA, `LexerDfa`, whose accepting states carry
the *lexeme class* they match: the terminals matching the lexeme, in priority order
(explicit priority, then string literals over regexes, then definition order). A class
that contains a literal drops the terminals named in `keyword_beats` (NAME minus the
keywords). Lexing is longest match without backtracking: a lexeme ends when the next
byte cannot extend it, its class is emitted (nothing for an ignored class) and that byte
is re-read from the start state; text that would need a longer backup is rejected.
A lexer with *modes* (`with_semicolon_modes`) re-reads it from a state that depends on
the lexeme that ended (`LexerDfa.restart`): each mode has its own start state.

The lexer-state x token table (the lexer DFA composed with the vocabulary trie) is
`automata/_token_table.py`'s; its names stay readable here (`_lexer.build_token_table`).

Public:
  Terminal                          one terminal (name, pattern, literal, priority).
  terminals_from_grammar(grammar)   the terminals of an `_lr.TerminalGrammar`.
  LexerDfa, build_lexer_dfa(...)    the lexer DFA with lexeme classes.
  terminal_dfas(terminals)          each terminal's minimal byte DFA (its input).
  dfa_accepts(dfa, data)            whether one of them matches a whole text.
  with_semicolon_modes(lexer, ...)  the same with Go's automatic semicolons (two modes).
  lex(lexer, data)                  host reference lexer (class names, or None).
  reachable(transitions)            which states each state reaches (bool [Q, Q]).
"""

import dataclasses
import functools
import hashlib

import numpy as np

from constrained_decoding import _arrays
from constrained_decoding.automata import _fsa
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _regex


@dataclasses.dataclass(frozen=True)
class Terminal:
  """A lexer terminal.

  Attributes:
    name: Its name.
    pattern: Constraint IR, or a Python `re` pattern (Unicode semantics) as a str.
    literal: Whether it is a string literal (keywords, punctuation): literals win over
      regexes of the same priority, and beat `keyword_beats` terminals outright.
    priority: Explicit priority (higher wins), Lark's `NAME.2`.
  """
  name: str
  pattern: ir.Node | str
  literal: bool = False
  priority: int = 0

  def ir(self) -> ir.Node:
    if isinstance(self.pattern, str):
      return _regex.parse_regex(self.pattern, unicode=True)
    return self.pattern


def terminals_from_grammar(grammar) -> tuple[list[Terminal], tuple[str, ...]]:
  """(terminals, ignored names) of an `_lr.TerminalGrammar` (declared ones skipped)."""
  terms = [Terminal(d.name, d.pattern, literal=d.literal is not None)
           for d in grammar.terminal_defs if d.pattern is not None]
  return terms, tuple(grammar.ignored)


@dataclasses.dataclass(frozen=True, eq=False)
class LexerDfa:
  """A minimal byte DFA whose accepting states carry lexeme classes.

  Attributes:
    transitions: int32 `[Q, 256]`, -1 = no transition.
    state_class: int32 `[Q]`: the lexeme class matched in each state, -1 if none.
    start: The start state (never accepting: no terminal matches the empty string).
    classes: Per class, its terminal names in priority order (`classes[c][0]` is the
      one a plain lexer reports; the parser may pick another member).
    class_ignored: bool `[C]`: the class is `%ignore`d (its top member is ignored):
      it ends the previous lexeme but emits nothing.
    terminals: The terminal names, in definition order.
    restart: int32 `[Q]` or None: the state whose row reads the byte after a lexeme that
      ends in each state (and, for a start state, itself: the mode the text is in).
      None: `start` for every state (a lexer without modes).
  """
  transitions: np.ndarray
  state_class: np.ndarray
  start: int
  classes: tuple[tuple[str, ...], ...]
  class_ignored: np.ndarray
  terminals: tuple[str, ...]
  terminal_states: tuple[int, ...] = ()  # sizes of the terminals' minimal DFAs
  product_states: int = 0  # states of their product, before minimization
  restart: np.ndarray | None = None

  @property
  def num_states(self) -> int:
    return int(self.state_class.shape[0])

  @functools.cached_property
  def restart_states(self) -> np.ndarray:
    """int32 `[Q]`: `restart`, or `start` everywhere for a lexer without modes."""
    if self.restart is None:
      return np.full(self.num_states, self.start, np.int32)
    return self.restart.astype(np.int32)

  @functools.cached_property
  def is_start(self) -> np.ndarray:
    """bool `[Q]`: nothing is pending in the state (`start`, or a mode's start)."""
    out = np.zeros(self.num_states, bool)
    out[self.start] = True
    if self.restart is not None:
      out[self.restart] = True
    return out

  @functools.cached_property
  def fingerprint(self) -> str:
    """A digest of the DFA and its classes (the cache key with the vocabulary's)."""
    h = hashlib.sha256()
    for a in (self.transitions, self.state_class, self.class_ignored):
      h.update(np.ascontiguousarray(a).tobytes())
    h.update(repr((self.start, self.classes, self.terminals)).encode())
    if self.restart is not None:  # (so that lexers without modes keep their digest)
      h.update(np.ascontiguousarray(self.restart).tobytes())
    return h.hexdigest()

  @functools.cached_property
  def emitted(self) -> np.ndarray:
    """int32 `[Q]`: the class a lexeme ending in each state emits; -1 for none (not
    accepting, or ignored)."""
    c = self.state_class
    out = c.copy()
    out[(c >= 0) & self.class_ignored[np.maximum(c, 0)]] = -1
    return out.astype(np.int32)

  def finish(self, state: int) -> tuple[bool, int]:
    """(ok, class emitted or -1) at the end of the text in `state`."""
    if 0 <= state < self.num_states and self.is_start[state]:
      return True, -1
    if state < 0 or self.state_class[state] < 0:
      return False, -1
    return True, int(self.emitted[state])


def _product(dfas) -> tuple[np.ndarray, list[tuple[int, ...]]]:
  """Breadth-first product of byte DFAs: (transitions `[P, 256]` with -1, tuples).

  States are numbered as a breadth-first search that numbers each level's new tuples
  in ascending order. A state is handled as its live components only (component i in
  state q is the global id `offset[i] + q`; a lexer's states have few live terminals
  out of 100-150), and a level's successors are told apart by two additive hashes of
  those ids, checked entry by entry against the representative of their hash.
  """
  n = len(dfas)
  if not n:
    return np.full((1, 256), -1, np.int64), [()]
  sizes = [d.transitions.shape[0] for d in dfas]
  offset = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  comp_of = np.repeat(np.arange(n), sizes)
  trans = np.concatenate([np.where(d.transitions >= 0, d.transitions + offset[i], -1)
                          for i, d in enumerate(dfas)]).astype(np.int64)
  rng = np.random.default_rng(0)
  hashes = rng.integers(0, 2**63, (2, len(trans)), dtype=np.int64).astype(np.uint64)

  def full(ids) -> tuple[int, ...]:
    out = [-1] * n
    for g in ids:
      out[comp_of[g]] = g - int(offset[comp_of[g]])
    return tuple(out)

  start = tuple(int(offset[i]) + d.start for i, d in enumerate(dfas))
  index = {start: 0}
  tuples = [full(start)]
  rows = []
  frontier = [start]
  while frontier:
    owner = np.repeat(np.arange(len(frontier)), [len(f) for f in frontier])
    nxt = trans[np.fromiter((g for f in frontier for g in f), np.int64, len(owner))]
    r, b = np.nonzero(nxt >= 0)
    order = _stable_order(owner[r] * 256 + b)  # a successor's ids stay ascending
    key, val = (owner[r] * 256 + b)[order], nxt[r, b][order]
    first = np.nonzero(np.diff(key, prepend=-1))[0]
    length = np.diff(np.append(first, len(key)))
    with np.errstate(over="ignore"):
      h = [np.add.reduceat(x[val], first) for x in hashes]
    rep, inv = _unique_pairs(*h)
    group = np.repeat(np.arange(len(first)), length)
    ref = first[rep[inv]][group] + np.arange(len(key)) - first[group]
    if (length != length[rep[inv]]).any() or (val != val[ref]).any():
      rep, inv = np.arange(len(first)), np.arange(len(first))  # a collision: exact keys
    sparse = [tuple(val[first[j]:first[j] + length[j]].tolist()) for j in rep.tolist()]
    new = sorted({t for t in sparse if t not in index}, key=full)
    for t in new:
      index[t] = len(tuples)
      tuples.append(full(t))
    ids = np.full(len(frontier) * 256, -1, np.int64)
    ids[key[first]] = np.array([index[t] for t in sparse], np.int64)[inv]
    rows.append(ids.reshape(len(frontier), 256))
    frontier = new
  return np.concatenate(rows), tuples


def _minimize(trans: np.ndarray, label: np.ndarray, start: int):
  """Moore minimization of a complete-with-(-1) DFA: (transitions, labels, start)."""
  q = trans.shape[0]
  sink = q
  full = np.vstack([np.where(trans < 0, sink, trans), np.full((1, 256), sink)])
  _, block = np.unique(np.append(label, -2), return_inverse=True)
  block = block.reshape(-1)
  while True:
    sig = np.concatenate([block[:, None], block[full]], axis=1)
    _, new = _arrays.unique_rows(sig, return_inverse=True)
    new = new.reshape(-1)
    if new.max() == block.max():
      break
    block = new
  sink_block = block[sink]
  keep = np.arange(block.max() + 1) != sink_block
  remap = np.full(block.max() + 1, -1, np.int64)
  remap[keep] = np.arange(int(keep.sum()))
  out = np.full((int(keep.sum()), 256), -1, np.int32)
  lab = np.full(int(keep.sum()), -1, np.int32)
  rep = np.full(block.max() + 1, -1, np.int64)
  rep[block[:q][::-1]] = np.arange(q)[::-1]  # a representative of each block
  for b in np.nonzero(keep)[0]:
    s = rep[b]
    out[remap[b]] = remap[block[full[s]]]
    lab[remap[b]] = label[s]
  # Renumber breadth first from the start, so that state numbers are canonical.
  s0 = int(remap[block[start]])
  order = [s0]
  seen = {s0}
  for s in order:
    for t in out[s]:
      if t >= 0 and int(t) not in seen:
        seen.add(int(t))
        order.append(int(t))
  new_id = np.full(out.shape[0], -1, np.int32)
  new_id[order] = np.arange(len(order))
  out = out[order]
  out = np.where(out < 0, -1, new_id[np.maximum(out, 0)]).astype(np.int32)
  return out, lab[order], 0


def terminal_dfas(terminals) -> list:
  """The minimal byte DFA of each terminal (a sequence of `Terminal`): what
  `build_lexer_dfa` composes, for callers that also read them (keywords' matches).

  Raises:
    ValueError: a terminal matches nothing or the empty string.
  """
  dfas = [_fsa.compile_byte_dfa(t.ir()) for t in terminals]
  for t, d in zip(terminals, dfas):
    if d.num_states == 0 or d.accepting[d.start]:
      raise ValueError(f"terminal {t.name} matches nothing or the empty string")
  return dfas


def dfa_accepts(dfa, data: bytes) -> bool:
  """Whether the byte DFA `dfa` (a `terminal_dfas` entry) matches all of `data`."""
  q = dfa.start
  for b in data:
    q = dfa.transitions[q, b]
    if q < 0:
      return False
  return bool(dfa.accepting[q])


def build_lexer_dfa(terminals, *, ignored=(), keyword_beats=("NAME",), dfas=None
                    ) -> LexerDfa:
  """The minimal lexer DFA of `terminals` (a sequence of `Terminal`); `dfas`: their
  `terminal_dfas`, when the caller has them.

  Raises:
    ValueError: a terminal matches nothing or the empty string, or names repeat.
  """
  terminals = list(terminals)
  names = [t.name for t in terminals]
  if len(set(names)) != len(names):
    raise ValueError(f"terminal names repeat: {names}")
  dfas = terminal_dfas(terminals) if dfas is None else list(dfas)
  order = sorted(range(len(terminals)),
                 key=lambda i: (-terminals[i].priority, not terminals[i].literal, i))
  beaten = set(keyword_beats)
  ignored = set(ignored)
  trans, tuples = _product(dfas)
  classes: dict[tuple[str, ...], int] = {}
  label = np.full(len(tuples), -1, np.int64)
  for s, tup in enumerate(tuples):
    members = [i for i in order if tup[i] >= 0 and dfas[i].accepting[tup[i]]]
    if any(terminals[i].literal for i in members):
      members = [i for i in members if terminals[i].literal or names[i] not in beaten]
    if members:
      label[s] = classes.setdefault(tuple(names[i] for i in members), len(classes))
  out, lab, start = _minimize(trans, label, 0)
  class_names = tuple(sorted(classes, key=classes.get))
  return LexerDfa(
      transitions=out, state_class=lab.astype(np.int32), start=start, classes=class_names,
      class_ignored=np.array([c[0] in ignored for c in class_names], bool).reshape(-1),
      terminals=tuple(names), terminal_states=tuple(d.num_states for d in dfas),
      product_states=len(tuples))


def _can_reach(trans: np.ndarray, marked: np.ndarray) -> np.ndarray:
  """bool `[Q]`: a marked state is reachable from each state (itself included)."""
  out = marked.copy()
  while True:
    nxt = out | (out[np.maximum(trans, 0)] & (trans >= 0)).any(axis=1)
    if (nxt == out).all():
      return out
    out = nxt


def with_semicolon_modes(lexer: LexerDfa, *, semicolon: str, triggers, newlines
                         ) -> LexerDfa:
  """`lexer` with Go's automatic semicolons, as two lexer modes.

  Mode A follows a *trigger* lexeme (Go: an identifier, a literal, `break continue
  fallthrough return`, `++ -- ) ] }`), mode B any other lexeme and the start of the text;
  ignored lexemes keep the mode. A lexeme of a `newlines` class (ignored terminals that
  act as a line break: the newline, a line comment, a general comment holding a line
  break) is, in mode A, a lexeme of the `semicolon` class (it emits `;`, then mode B);
  in mode B it stays ignored. So insertion is static in the lexer: the token table
  knows it, the device does nothing extra. The end of the text in mode A also takes a
  `;` (the compiler adds it, `state_end_tail`).

  Only states from which an ignored lexeme or the start can still be reached are
  doubled: past them the lexeme's own class decides the next mode. States 0..Q-1 are
  `lexer`'s (mode B, and the shared ones; the text starts in `start`, mode B), the mode
  A copies follow, and `restart` names each state's next start (A or B).

  Raises:
    ValueError: `semicolon` is no class of its own, a `newlines` terminal is not an
      ignored class's first member, or a class mixes trigger and other terminals.
  """
  triggers, newlines = set(triggers), set(newlines)
  classes = lexer.classes
  semi = [c for c, members in enumerate(classes) if members == (semicolon,)]
  if not semi:
    raise ValueError(f"the semicolon terminal {semicolon!r} is not a lexeme class of its"
                     " own (a literal that no other terminal matches)")
  semi = semi[0]
  is_nl = np.array([m[0] in newlines for m in classes], bool).reshape(-1)
  missing = newlines - {m[0] for c, m in enumerate(classes) if lexer.class_ignored[c]}
  if missing:
    raise ValueError(f"the newline terminals {sorted(missing)} are not %ignore'd lexemes"
                     " of their own")
  mixed = [m for m in classes if 0 < len(triggers.intersection(m)) < len(m)]
  if mixed:
    raise ValueError(f"the lexeme class {mixed[0]} mixes semicolon triggers and other"
                     " terminals")
  is_trigger = np.array([m[0] in triggers for m in classes], bool).reshape(-1)
  trans, cls, start = lexer.transitions, lexer.state_class, lexer.start
  q = lexer.num_states
  ignored = (cls >= 0) & lexer.class_ignored[np.maximum(cls, 0)]
  at_start = np.arange(q) == start
  doubled = _can_reach(trans, ignored | at_start)
  a_of = np.full(q, -1, np.int64)  # the mode A copy of a doubled state
  a_of[doubled] = q + np.arange(int(doubled.sum()))
  a_start = int(a_of[start])
  copies = np.nonzero(doubled)[0]
  a_trans = trans[copies]
  a_trans = np.where(a_trans >= 0, np.where(doubled[np.maximum(a_trans, 0)],
                                            a_of[np.maximum(a_trans, 0)], a_trans), -1)
  a_cls = cls[copies].copy()
  a_cls[(a_cls >= 0) & is_nl[np.maximum(a_cls, 0)]] = semi
  state_class = np.concatenate([cls, a_cls]).astype(np.int32)
  mode_start = np.concatenate([np.full(q, start), np.full(len(copies), a_start)])
  # The next mode: a kept lexeme's class decides, an ignored one keeps the mode.
  c = np.maximum(state_class, 0)
  kept = (state_class >= 0) & ~lexer.class_ignored[c]
  restart = np.where(kept, np.where(is_trigger[c], a_start, start), mode_start)
  return dataclasses.replace(
      lexer, transitions=np.concatenate([trans, a_trans]).astype(np.int32),
      state_class=state_class, restart=restart.astype(np.int32))


def lex(lexer: LexerDfa, data: bytes, *, classes: bool = False, keep_ignored: bool = False):
  """Lexes `data` by longest match without backtracking (module docstring).

  Returns the top terminal name of each lexeme (its class index with `classes=True`),
  ignored lexemes left out unless `keep_ignored`; None when `data` does not lex.
  """
  trans, cls, start = lexer.transitions, lexer.state_class, lexer.start
  restart, is_start = lexer.restart_states, lexer.is_start
  out = []

  def emit(state):
    c = int(cls[state])
    if keep_ignored or not lexer.class_ignored[c]:
      out.append(c if classes else lexer.classes[c][0])

  state = start
  for b in data:
    nxt = trans[state, b]
    if nxt < 0:
      if is_start[state] or cls[state] < 0:
        return None
      emit(state)
      nxt = trans[restart[state], b]
      if nxt < 0:
        return None
    state = nxt
  if not is_start[state]:
    if cls[state] < 0:
      return None
    emit(state)
  return out


def _stable_order(key: np.ndarray) -> np.ndarray:
  """`np.argsort(key, kind="stable")` of non-negative int64 keys.

  Where key and index fit in 63 bits together, one plain sort of `key << b | index`
  (numpy sorts int64 with SIMD, several times faster than any argsort: 0.14 s against
  0.9-2.4 s for 12M keys); the index breaks ties, so the order is stable.
  """
  n = len(key)
  index_bits = max(n - 1, 1).bit_length()
  top = int(key.max()) if n else 0
  if top.bit_length() + index_bits > 63:
    return np.argsort(key, kind="stable")
  packed = np.sort((key.astype(np.int64) << index_bits) | np.arange(n, dtype=np.int64))
  return packed & ((1 << index_bits) - 1)


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(first index, inverse) of the distinct pairs (a[i], b[i]), numbered in ascending
  order, as `np.unique(np.stack([a, b], 1), axis=0, return_index=True,
  return_inverse=True)` gives them, by one argsort of `a` (b only checked: here both
  are hashes of the same set, so equal a with unequal b is a collision, left to
  np.unique).
  """
  order = np.argsort(a, kind="stable")
  sa, sb = a[order], b[order]
  new = np.ones(len(a), bool)
  new[1:] = sa[1:] != sa[:-1]
  if (sb[1:] != sb[:-1])[~new[1:]].any():
    _, rep, inv = np.unique(np.stack([a, b], axis=1), axis=0, return_index=True,
                            return_inverse=True)
    return rep, inv.reshape(-1)
  inverse = np.empty(len(a), np.int64)
  inverse[order] = np.cumsum(new) - 1
  return order[new], inverse


def reachable(trans: np.ndarray) -> np.ndarray:
  """bool [S, S]: state r is reachable from s (s itself included).

  Each state's set is a Python int bitset, the union of its successors' sets and itself,
  recomputed in depth-first post-order (successors first) until a pass changes nothing:
  one pass settles an acyclic DFA, each cycle a pass more (milliseconds for Python's
  lexer, where squaring the int matrix took seconds: numpy's integer products are not
  BLAS).
  """
  n = trans.shape[0]
  src, col = np.nonzero(trans >= 0)
  edges = _arrays.sorted_unique(src.astype(np.int64) * n + trans[src, col])
  starts = np.searchsorted(edges // n, np.arange(n + 1))
  succ = [edges[starts[s]:starts[s + 1]] % n for s in range(n)]
  succ = [row.tolist() for row in succ]
  order = _post_order(succ)
  bits = [1 << s for s in range(n)]
  changed = True
  while changed:
    changed = False
    for s in order:
      b = bits[s]
      for t in succ[s]:
        b |= bits[t]
      if b != bits[s]:
        bits[s] = b
        changed = True
  width = (n + 7) // 8
  packed = np.frombuffer(b"".join(b.to_bytes(width, "little") for b in bits), np.uint8)
  return np.unpackbits(packed.reshape(n, width), axis=1, count=n,
                       bitorder="little").astype(bool)


def _post_order(succ: list) -> list:
  """Every node of the graph `succ` (adjacency lists), each after the nodes that its
  depth-first search from the lowest unvisited node reaches first (post-order)."""
  seen = [False] * len(succ)
  out = []
  for root in range(len(succ)):
    if seen[root]:
      continue
    seen[root] = True
    stack = [(root, iter(succ[root]))]
    while stack:
      node, it = stack[-1]
      for t in it:
        if not seen[t]:
          seen[t] = True
          stack.append((t, iter(succ[t])))
          break
      else:
        stack.pop()
        out.append(node)
  return out


# The token table moved to `_token_table.py`; these names stay readable here for the
# callers that use them as `_lexer.<name>` (tests, benchmarks). Resolved on first use:
# `_token_table` imports this module (for `LexerDfa`), so it cannot be imported above.
_TOKEN_TABLE_NAMES = frozenset((
    "TOKEN_TABLE_FORMAT_VERSION", "BITMAP_MIN_TOKENS", "TokenTable", "build_token_table",
    "load_or_build_token_table", "ranges", "_bit_sets", "_subtrees",
    "_walk_subtrees"))


def __getattr__(name: str):
  if name in _TOKEN_TABLE_NAMES:
    from constrained_decoding.automata import _token_table  # pylint: disable=g-import-not-at-top

    return getattr(_token_table, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
