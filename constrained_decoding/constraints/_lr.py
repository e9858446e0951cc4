"""LR parsing tables over terminals, built on the host (issue 18, increment 2).

The parser level of grammars with a lexer (docs/lexer_runtime.md): the rules of a Lark
grammar read as a context-free grammar over *terminals* (the lexer's items), its LALR(1)
automaton (or canonical LR(1), merged where merging is conflict-free, when LALR has
conflicts), and the ACTION / GOTO tables as numpy arrays for the device step. Pure
Python and numpy.

Public:
  TerminalGrammar, Production, TerminalDef     the grammar over terminals (plain BNF).
  read_lark_rules(text, start=)                a Lark grammar -> TerminalGrammar.
  build_tables(grammar, method=, resolve=)     -> LrTables (raises on conflicts).
  LrTables                                     the arrays and their names.
  LrConflict                                   one conflict (kind, state, terminal, ...).
  LrParser(tables)                             host reference stepper.

Reading a Lark grammar: `_lr_grammar.py` (re-exported here).

Table encoding (int32 everywhere, suitable for gathers on the device):
* terminal ids: `terminals[0] == "$END"` (end of input), then the grammar's terminals in
  `TerminalGrammar.terminals` order; nonterminal ids index `nonterminals`, whose entry 0
  is the augmented start `$START`;
* production 0 is `$START -> start`; `rule_lhs[p]` (nonterminal id), `rule_len[p]`;
* `action[q, t]`: 0 = error, `s + 1` (> 0) = shift and go to state s, `-(p + 1)` (< 0) =
  reduce by production p; `-1` (reduce by production 0) = accept, only on `$END`;
* `goto[q, n]`: the state after reducing to nonterminal n in state q, or -1.
State 0 is the start state.

Conflicts raise `errors.NondeterministicGrammarError` whose message names the kind
(shift/reduce or reduce/reduce), the productions (and the Lark rules they come from), the
lookahead terminal and an example prefix of terminals reaching the state (a shortest path
of the automaton, each nonterminal replaced by a shortest string it derives); the error
carries the `LrConflict` as its `conflict` attribute. `resolve="shift"` builds tables
anyway, resolving as yacc and Lark do (shift over reduce, then the earliest production),
and lists the conflicts in `LrTables.conflicts`.
"""

import collections
import dataclasses
import functools

import numpy as np

from constrained_decoding import errors
from constrained_decoding.constraints._lr_grammar import (  # Re-exported.
    Production,
    TerminalDef,
    TerminalGrammar,
    read_lark_rules,
)

END = "$END"
START = "$START"
_METHODS = ("lalr", "lr1", "auto")

# -- LR automata. ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LrConflict:
  """A parsing conflict of an LR state.

  Attributes:
    kind: "shift/reduce" or "reduce/reduce".
    state: The state of the automaton that has it.
    terminal: The lookahead terminal.
    productions: The productions involved: the reductions, then (shift/reduce) the
      productions whose item shifts the terminal.
    prefix: Terminals that lead the parser to the state with `terminal` as lookahead.
  """
  kind: str
  state: int
  terminal: str
  productions: tuple[Production, ...]
  prefix: tuple[str, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class LrTables:
  """ACTION/GOTO tables of an LR(1)-family parser (encoding: module docstring).

  Attributes:
    action: int32 [states, terminals] (column 0 is `$END`).
    goto: int32 [states, nonterminals] (-1: none).
    rule_lhs: int32 [productions], nonterminal id of each production's left side.
    rule_len: int32 [productions], length of each right side.
    terminals: Terminal names by id, `$END` first.
    nonterminals: Nonterminal names by id, `$START` first.
    productions: The productions, `$START -> start` first.
    method: "lalr", "lr1" (canonical) or "lr1-merged" (canonical, states with the same
      core merged where no conflict arises).
    conflicts: Conflicts resolved by `resolve="shift"` (empty otherwise).
  """
  action: np.ndarray
  goto: np.ndarray
  rule_lhs: np.ndarray
  rule_len: np.ndarray
  terminals: tuple[str, ...]
  nonterminals: tuple[str, ...]
  productions: tuple[Production, ...]
  method: str
  conflicts: tuple[LrConflict, ...] = ()

  @property
  def num_states(self) -> int:
    return self.action.shape[0]

  @property
  def nbytes(self) -> int:
    return sum(a.nbytes for a in (self.action, self.goto, self.rule_lhs, self.rule_len))

  def terminal_id(self, name: str) -> int:
    return self._terminal_ids[name]

  @property
  def _terminal_ids(self) -> dict:
    ids = self.__dict__.get("_ids")
    if ids is None:
      ids = {t: i for i, t in enumerate(self.terminals)}
      object.__setattr__(self, "_ids", ids)
    return ids


class _Analysis:
  """Symbols, FIRST sets and item numbering of an augmented grammar."""

  def __init__(self, grammar: TerminalGrammar):
    nonterminals = (START,) + grammar.nonterminals
    if grammar.start not in nonterminals:
      raise errors.GrammarError(
          f"Grammar has no productions for the start symbol {grammar.start!r}. Expected"
          " at least one production. Add one.")
    self.nt_names = nonterminals
    nt_set = set(nonterminals)
    used = [s for p in grammar.productions for s in p.rhs if s not in nt_set]
    self.t_names = (END,) + tuple(dict.fromkeys((*grammar.terminals, *used)))
    self.num_t = len(self.t_names)
    self.sym_id = {t: i for i, t in enumerate(self.t_names)}
    self.sym_id.update({n: self.num_t + i for i, n in enumerate(nonterminals)})
    self.productions = (Production(START, (grammar.start,), START),) + tuple(
        grammar.productions)
    self.lhs = [self.sym_id[p.lhs] for p in self.productions]
    self.rhs = [tuple(self.sym_id[s] for s in p.rhs) for p in self.productions]
    self.by_lhs = collections.defaultdict(list)
    for p, lhs in enumerate(self.lhs):
      self.by_lhs[lhs].append(p)
    # Items: item_base[p] + dot.
    self.item_base, self.item_prod, self.item_dot = [], [], []
    for p, rhs in enumerate(self.rhs):
      self.item_base.append(len(self.item_prod))
      for dot in range(len(rhs) + 1):
        self.item_prod.append(p)
        self.item_dot.append(dot)
    self.item_next = [self.rhs[p][d] if d < len(self.rhs[p]) else None
                      for p, d in zip(self.item_prod, self.item_dot)]
    self.compute_first()
    self.compute_shortest()

  def is_nt(self, symbol: int) -> bool:
    return symbol >= self.num_t

  def compute_first(self):
    n = len(self.nt_names)
    self.nullable = [False] * n
    self.first = [0] * n  # bitsets over terminal ids
    changed = True
    while changed:
      changed = False
      for p, rhs in enumerate(self.rhs):
        a = self.lhs[p] - self.num_t
        bits, nullable = self.first_of(rhs)
        if bits | self.first[a] != self.first[a]:
          self.first[a] |= bits
          changed = True
        if nullable and not self.nullable[a]:
          self.nullable[a] = True
          changed = True

  def first_of(self, symbols) -> tuple[int, bool]:
    bits = 0
    for s in symbols:
      if s < self.num_t:
        return bits | (1 << s), False
      bits |= self.first[s - self.num_t]
      if not self.nullable[s - self.num_t]:
        return bits, False
    return bits, True

  def compute_shortest(self):
    """A shortest terminal string derived by each nonterminal (None: unproductive)."""
    n = len(self.nt_names)
    self.shortest: list[tuple[int, ...] | None] = [None] * n
    changed = True
    while changed:
      changed = False
      for p, rhs in enumerate(self.rhs):
        a = self.lhs[p] - self.num_t
        out = []
        for s in rhs:
          if s < self.num_t:
            out.append(s)
          elif self.shortest[s - self.num_t] is None:
            break
          else:
            out.extend(self.shortest[s - self.num_t])
        else:
          if self.shortest[a] is None or len(out) < len(self.shortest[a]):
            self.shortest[a] = tuple(out)
            changed = True

  def closure0(self, kernel) -> list[int]:
    items, seen = list(kernel), set(kernel)
    for item in items:
      s = self.item_next[item]
      if s is not None and s >= self.num_t:
        for p in self.by_lhs[s]:
          new = self.item_base[p]
          if new not in seen:
            seen.add(new)
            items.append(new)
    return items

  @functools.cached_property
  def expansions(self) -> list:
    """Per item whose dot is before a nonterminal: (FIRST of the rest of its right
    side, whether the rest is nullable, the start items of the nonterminal's
    productions); None for the other items. What `closure1` reads per step, computed
    once (Python's canonical LR(1) runs ~1M closure steps)."""
    out = []
    for item, s in enumerate(self.item_next):
      if s is None or s < self.num_t:
        out.append(None)
        continue
      p, d = self.item_prod[item], self.item_dot[item]
      bits, nullable = self.first_of(self.rhs[p][d + 1:])
      out.append((bits, nullable, tuple(self.item_base[q] for q in self.by_lhs[s])))
    return out

  def closure1(self, kernel: dict) -> dict:
    """LR(1) closure: {item: lookahead bitset}, bit 0 of the marker handled by caller."""
    las = dict(kernel)
    todo = list(kernel)
    expansions = self.expansions
    while todo:
      item = todo.pop()
      step = expansions[item]
      if step is None:
        continue
      bits, nullable, starts = step
      if nullable:
        bits |= las[item]
      for new in starts:
        old = las.get(new, 0)
        if old | bits != old:
          las[new] = old | bits
          todo.append(new)
    return las


@dataclasses.dataclass
class _Automaton:
  kernels: list        # state -> tuple of kernel items
  trans: list          # state -> {symbol: state}
  reduces: list        # state -> {production: lookahead bitset}


def _lr0(an: _Analysis) -> tuple[list, list]:
  start = (an.item_base[0],)
  kernels, trans, index = [start], [], {start: 0}
  for kernel in kernels:
    moves: dict[int, list] = {}
    for item in an.closure0(kernel):
      s = an.item_next[item]
      if s is not None:
        moves.setdefault(s, []).append(item + 1)
    edges = {}
    for s, items in moves.items():
      key = tuple(sorted(items))
      if key not in index:
        index[key] = len(kernels)
        kernels.append(key)
      edges[s] = index[key]
    trans.append(edges)
  return kernels, trans


def _lalr(an: _Analysis) -> _Automaton:
  """LALR(1) by spontaneous generation and propagation of lookaheads (Dragon book 4.7.5)."""
  kernels, trans = _lr0(an)
  marker = 1 << an.num_t  # The '#' lookahead of the propagation closure.
  effects: dict[int, tuple] = {}  # kernel item -> (moves, reductions)

  def effect(item):
    if item not in effects:
      las = an.closure1({item: marker})
      moves, reductions = [], []
      for it, bits in las.items():
        s = an.item_next[it]
        entry = (bits & ~marker, bool(bits & marker))
        if s is None:
          reductions.append((an.item_prod[it], *entry))
        else:
          moves.append((s, it + 1, *entry))
      effects[item] = (moves, reductions)
    return effects[item]

  la = [dict.fromkeys(k, 0) for k in kernels]
  la[0][an.item_base[0]] = 1  # $END after the start item.
  propagate = [collections.defaultdict(list) for _ in kernels]
  for state, kernel in enumerate(kernels):
    for item in kernel:
      for s, target_item, spont, prop in effect(item)[0]:
        target = trans[state][s]
        la[target][target_item] |= spont
        if prop:
          propagate[state][item].append((target, target_item))
  todo = collections.deque((s, i) for s, k in enumerate(kernels) for i in k)
  queued = set(todo)
  while todo:
    state, item = todo.popleft()
    queued.discard((state, item))
    bits = la[state][item]
    for target, target_item in propagate[state][item]:
      old = la[target][target_item]
      if old | bits != old:
        la[target][target_item] = old | bits
        if (target, target_item) not in queued:
          queued.add((target, target_item))
          todo.append((target, target_item))
  reduces = []
  for state, kernel in enumerate(kernels):
    out: dict[int, int] = {}
    for item in kernel:
      for p, spont, prop in effect(item)[1]:
        out[p] = out.get(p, 0) | spont | (la[state][item] if prop else 0)
    reduces.append(out)
  return _Automaton(kernels, trans, reduces)


def _canonical(an: _Analysis) -> tuple[_Automaton, list]:
  """Canonical LR(1); also returns each state's core (its kernel items)."""
  start = ((an.item_base[0], 1),)
  states, trans, reduces, index = [start], [], [], {start: 0}
  for kernel in states:
    las = an.closure1(dict(kernel))
    moves: dict[int, dict] = {}
    out: dict[int, int] = {}
    for item, bits in las.items():
      s = an.item_next[item]
      if s is None:
        p = an.item_prod[item]
        out[p] = out.get(p, 0) | bits
      else:
        target = moves.setdefault(s, {})
        target[item + 1] = target.get(item + 1, 0) | bits
    edges = {}
    for s, items in moves.items():
      key = tuple(sorted(items.items()))
      if key not in index:
        index[key] = len(states)
        states.append(key)
      edges[s] = index[key]
    trans.append(edges)
    reduces.append(out)
  kernels = [tuple(i for i, _ in k) for k in states]
  return _Automaton(kernels, trans, reduces), kernels


def _state_conflicts(an: _Analysis, trans: dict, reduces: dict):
  """(kind, terminal id, reduce productions) for each conflicting terminal of a state."""
  shifts = 0
  for s in trans:
    if s < an.num_t:
      shifts |= 1 << s
  seen, out = {}, []
  for p, bits in reduces.items():
    for t in _bits(bits):
      seen.setdefault(t, []).append(p)
  for t, ps in seen.items():
    if shifts >> t & 1:
      out.append(("shift/reduce", t, ps))
    elif len(ps) > 1:
      out.append(("reduce/reduce", t, ps))
  return out


def _bits(bits: int):
  t = 0
  while bits:
    if bits & 1:
      yield t
    bits >>= 1
    t += 1


def _merge_compatible(an: _Analysis, lr1: _Automaton, cores: list) -> _Automaton:
  """Merges canonical LR(1) states with the same core wherever no conflict arises."""
  groups: list[list[int]] = []
  group_reduces: list[dict] = []
  by_core = collections.defaultdict(list)
  cluster = [0] * len(cores)
  for state, core in enumerate(cores):
    for g in by_core[core]:
      merged = dict(group_reduces[g])
      for p, bits in lr1.reduces[state].items():
        merged[p] = merged.get(p, 0) | bits
      if not _state_conflicts(an, lr1.trans[state], merged):
        group_reduces[g] = merged
        groups[g].append(state)
        cluster[state] = g
        break
    else:
      by_core[core].append(len(groups))
      cluster[state] = len(groups)
      groups.append([state])
      group_reduces.append(dict(lr1.reduces[state]))
  # Refine until the members of each cluster agree on the clusters of their successors.
  while True:
    signature = {}
    new = [0] * len(cores)
    for state in range(len(cores)):
      key = (cluster[state], tuple(sorted((s, cluster[t])
                                          for s, t in lr1.trans[state].items())))
      new[state] = signature.setdefault(key, len(signature))
    if len(signature) == len(set(cluster)):
      break
    cluster = new
  # Renumber by first member so that the start state stays 0.
  order = {}
  for state in range(len(cores)):
    order.setdefault(cluster[state], len(order))
  members = collections.defaultdict(list)
  for state in range(len(cores)):
    members[order[cluster[state]]].append(state)
  kernels, trans, reduces = [], [], []
  for c in range(len(order)):
    first = members[c][0]
    kernels.append(cores[first])
    trans.append({s: order[cluster[t]] for s, t in lr1.trans[first].items()})
    out: dict[int, int] = {}
    for state in members[c]:
      for p, bits in lr1.reduces[state].items():
        out[p] = out.get(p, 0) | bits
    reduces.append(out)
  return _Automaton(kernels, trans, reduces)


def _example_prefix(an: _Analysis, automaton: _Automaton, target: int) -> tuple[int, ...]:
  """Terminals of a shortest path from state 0 to `target` (nonterminals expanded)."""
  previous = {0: None}
  queue = collections.deque([0])
  while queue and target not in previous:
    state = queue.popleft()
    for s, nxt in sorted(automaton.trans[state].items()):
      if nxt not in previous:
        previous[nxt] = (state, s)
        queue.append(nxt)
  path = []
  state = target
  while previous.get(state) is not None:
    state, s = previous[state]
    path.append(s)
  out = []
  for s in reversed(path):
    if s < an.num_t:
      out.append(s)
    else:
      out.extend(an.shortest[s - an.num_t] or ())
  return tuple(out)


def _conflicts(an: _Analysis, automaton: _Automaton) -> list[LrConflict]:
  out = []
  for state in range(len(automaton.kernels)):
    found = _state_conflicts(an, automaton.trans[state], automaton.reduces[state])
    if not found:
      continue
    prefix = None
    for kind, t, ps in found:
      prods = [an.productions[p] for p in ps]
      if kind == "shift/reduce":
        closure = an.closure0(automaton.kernels[state])
        prods += [an.productions[an.item_prod[i]] for i in closure if an.item_next[i] == t]
      if prefix is None:
        prefix = _example_prefix(an, automaton, state)
      out.append(LrConflict(kind, state, an.t_names[t], tuple(dict.fromkeys(prods)),
                            tuple(an.t_names[s] for s in prefix)))
  return out


def _conflict_error(conflict: LrConflict, method: str, count: int) -> Exception:
  kind = conflict.kind
  rules = sorted({p.origin for p in conflict.productions})
  described = "; ".join(
      f"`{p}`" + (f" (from rule {p.origin!r})" if p.origin != p.lhs else "")
      for p in conflict.productions)
  prefix = " ".join(conflict.prefix) if conflict.prefix else "<start>"
  grammar_class = {"lalr": "LALR(1)", "lr1": "LR(1)", "auto": "LR(1)"}[method]
  more = f" ({count - 1} more conflicts not shown)" if count > 1 else ""
  error = errors.NondeterministicGrammarError(
      f"Grammar is not {grammar_class}: {kind} conflict in rules {rules} on the terminal"
      f" {conflict.terminal} in LR state {conflict.state}, between {described}. Example"
      f" prefix: {prefix} · {conflict.terminal}{more}. Expected a grammar where one"
      " terminal of lookahead decides every step. Rewrite the rules (e.g. stratify"
      " operators, factor a common prefix, make an optional part a rule of its own);"
      " priorities and precedence declarations are not supported.")
  error.conflict = conflict
  return error


def build_tables(grammar: TerminalGrammar, *, method: str = "auto",
                 resolve: str | None = None) -> LrTables:
  """LR tables of a grammar over terminals.

  Args:
    grammar: The grammar (e.g. from `read_lark_rules`).
    method: "lalr"; "lr1" (canonical LR(1)); or "auto": LALR(1), and when it has
      conflicts, canonical LR(1) with states of the same core merged wherever merging
      adds no conflict (the conflicts reported are then LR(1)'s).
    resolve: None to raise on conflicts; "shift" to resolve them as Lark/yacc (shift
      over reduce, else the earliest production) and list them in `conflicts`.

  Raises:
    NondeterministicGrammarError: a conflict (with `.conflict`, an `LrConflict`).
    GrammarError: the start symbol has no productions.
  """
  if method not in _METHODS:
    raise ValueError(f"method {method!r} is not one of {_METHODS}.")
  if resolve not in (None, "shift"):
    raise ValueError(f"resolve {resolve!r} is not None or 'shift'.")
  an = _Analysis(grammar)
  automaton = _lalr(an) if method in ("lalr", "auto") else None
  name = "lalr"
  conflicts = _conflicts(an, automaton) if automaton else None
  if method == "lr1" or (method == "auto" and conflicts):
    lr1, cores = _canonical(an)
    conflicts = _conflicts(an, lr1)
    if method == "lr1":
      automaton, name = lr1, "lr1"
    elif conflicts:
      automaton, name = lr1, "lr1"
    else:
      automaton, name = _merge_compatible(an, lr1, cores), "lr1-merged"
  if conflicts and resolve is None:
    raise _conflict_error(conflicts[0], method, len(conflicts))
  return _tables(an, automaton, name, tuple(conflicts or ()))


def _tables(an: _Analysis, automaton: _Automaton, method: str, conflicts) -> LrTables:
  num_states = len(automaton.kernels)
  action = np.zeros((num_states, an.num_t), np.int32)
  goto = np.full((num_states, len(an.nt_names)), -1, np.int32)
  for state in range(num_states):
    # Reductions, earliest production last so that it wins; shifts override.
    for p, bits in sorted(automaton.reduces[state].items(), reverse=True):
      for t in _bits(bits):
        action[state, t] = -(p + 1)
    for s, target in automaton.trans[state].items():
      if s < an.num_t:
        action[state, s] = target + 1
      else:
        goto[state, s - an.num_t] = target
  return LrTables(
      action=action, goto=goto,
      rule_lhs=np.array([l - an.num_t for l in an.lhs], np.int32),
      rule_len=np.array([len(r) for r in an.rhs], np.int32),
      terminals=an.t_names, nonterminals=an.nt_names, productions=an.productions,
      method=method, conflicts=conflicts)


# -- Host reference stepper. -----------------------------------------------------------


class LrParser:
  """Runs `LrTables` on a stack of states: the reference for the device step.

  ```python
  parser = LrParser(tables)
  parser.feed("NAME")      # True: accepted as the next terminal (stack updated)
  parser.viable("RPAR")    # False: would be an error (stack unchanged)
  parser.accepts_end()     # True when the terminals fed so far form a sentence
  ```
  """

  def __init__(self, tables: LrTables, stack=None):
    self.tables = tables
    self.stack = [0] if stack is None else list(stack)

  def copy(self) -> "LrParser":
    return LrParser(self.tables, self.stack)

  def _id(self, terminal) -> int:
    return terminal if isinstance(terminal, (int, np.integer)) else self.tables.terminal_id(
        terminal)

  def _run(self, stack: list, t: int, trace=None) -> int:
    """Reduces under lookahead t; returns the final action (0 error, > 0 shift, -1 acc)."""
    action, goto, lens, lhs = (self.tables.action, self.tables.goto, self.tables.rule_len,
                               self.tables.rule_lhs)
    while True:
      if trace is not None:
        trace.append(stack[-1])
      a = int(action[stack[-1], t])
      if a >= 0 or a == -1:
        return a
      p = -a - 1
      if lens[p]:
        del stack[len(stack) - int(lens[p]):]
      stack.append(int(goto[stack[-1], lhs[p]]))

  def feed(self, terminal) -> bool:
    """Feeds one terminal (name or id); False (stack unchanged) if it is an error."""
    t = self._id(terminal)
    stack = list(self.stack)
    a = self._run(stack, t)
    if a <= 0:
      return False
    stack.append(a - 1)
    self.stack = stack
    return True

  def viable(self, terminal) -> bool:
    """Whether `feed(terminal)` would succeed."""
    t = self._id(terminal)
    return self._run(list(self.stack), t) > 0

  def accepts_end(self) -> bool:
    """Whether the terminals fed so far form a complete sentence."""
    return self._run(list(self.stack), 0) == -1

  def lookahead_states(self, terminal) -> list[int]:
    """The top states met while reducing under `terminal` (before its shift/error)."""
    trace: list[int] = []
    self._run(list(self.stack), self._id(terminal), trace)
    return trace

  def parse(self, terminals) -> bool:
    """Whether the whole sequence of terminals is a sentence (stack unchanged)."""
    parser = self.copy()
    return all(parser.feed(t) for t in terminals) and parser.accepts_end()
