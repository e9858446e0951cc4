"""Grammars as recursive transition networks: one byte DFA per rule, calls as arcs.

The first half of the grammar compiler (`_pda.py` is the second, the composition with
the vocabulary). A normalized grammar (`constraints/_grammar.py`: only true recursion
left as rules) becomes one minimal DFA per rule over bytes plus one call symbol per
rule, built by the same pynini back end as regexes. A call arc `q --call R--> r` means
"run rule R, then continue in r": it pushes the return address r and jumps to R's
start; a state final in its rule may return, popping an address. This is
`pdt_replace`'s construction with return addresses as the parentheses.

Register markers (`ir.Marker`, `_registers.py`) are folded into the byte arcs after
them, over all rules at once, and `_check_calls` refuses a call whose callee may change
a register word live at its return address (words are not saved on the stack).

Public names:
  Rtn, build_rtn(grammar)   the recursive transition network of a normalized grammar.
"""

import dataclasses

import numpy as np

from constrained_decoding import errors
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _nfa
from constrained_decoding.automata import _registers
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _ir as ir

@dataclasses.dataclass(frozen=True, eq=False)
class Rtn:
  """A recursive transition network over bytes: one DFA per rule, states numbered globally.

  Each rule's states are consecutive, numbered breadth-first from the rule's start
  (`_rule_dfa`), so equal rule bodies give equal blocks of the tables.

  Attributes:
    rules: Rule names; rule 0 is the start rule.
    transitions: int32 `[Q, 256]` byte arcs (`NO_STATE` where none).
    calls: Per state, the `(rule, return state)` pairs of its call arcs.
    accepting: bool `[Q]`; the state is final in its rule (the rule may return).
    rule_of_state: int32 `[Q]`.
    rule_start: Start state of each rule.
    tops: Per rule, the return addresses that can be on top of the stack while the rule
      runs (tail calls pass their caller's addresses through).
  """

  rules: tuple[str, ...]
  transitions: np.ndarray
  calls: tuple[tuple[tuple[int, int], ...], ...]
  accepting: np.ndarray
  rule_of_state: np.ndarray
  rule_start: tuple[int, ...]
  tops: tuple[frozenset[int], ...]
  # Register markers folded into the byte arcs (`_registers.contract`), or None when the
  # rules have none: `contracted.arc_ops` maps (state, byte) to the operations read with it.
  contracted: "_registers.Contracted | None" = None

  @property
  def num_states(self) -> int:
    return int(self.accepting.shape[0])

  @property
  def start(self) -> int:
    return self.rule_start[0]

  def is_tail(self, state: int) -> bool:
    """A return address with nothing after it: returning there returns again at once."""
    return bool(self.accepting[state]) and not self.calls[state] and bool(
        (self.transitions[state] == NO_STATE).all())

  def byte_dfa(self) -> ByteDfa:
    """The byte arcs alone, as a `ByteDfa` (for wide-state detection)."""
    return ByteDfa(transitions=self.transitions, accepting=self.accepting, start=self.start)


_CALL_BASE = 1024  # Call symbol of rule j: the pseudo-byte _CALL_BASE + j.


def _rule_dfa(body: ir.Node, num_rules: int) -> tuple[np.ndarray, np.ndarray, list]:
  """(table [q, 256 + num_rules], accepting [q], marker arcs) of a rule body over bytes +
  call symbols.

  A `RuleRef` to rule j becomes the pseudo-byte `_CALL_BASE + j`, which the regex back
  end treats as one more byte class, so the DFA is minimal over bytes and calls alike;
  column 256 + j of the table holds the call arcs of rule j. Register markers
  (`ir.Marker`, pseudo-bytes below `_CALL_BASE`) come back as (state, marker, target),
  by state and then marker. States are numbered as byte DFAs are
  (`_fsa.breadth_first`: from the start, bytes, markers, then calls in order), so that
  equal rule bodies give equal tables however they were written. The empty language
  gives no states.
  """
  fst, edges, pseudo = _fsa.minimal_class_fst(body)
  markers = [p for p in pseudo if isinstance(p, ir.Marker)]
  if markers and _nfa.FRAGMENT_BASE + len(pseudo) > _CALL_BASE:
    raise _registers.RegisterError(
        f"A grammar rule holds {len(pseudo)} distinct register markers. Expected at most"
        f" {_CALL_BASE - _nfa.FRAGMENT_BASE}.")
  start, accepting, src, labels, dst = _fsa.fst_arcs(fst)
  if not len(accepting):
    return np.zeros((0, 256 + num_rules), np.int32), np.zeros((0,), bool), []
  order, new_id = _fsa.breadth_first(len(accepting), start, src, labels, dst)
  reached = new_id[src] >= 0
  src, labels, dst = new_id[src[reached]], labels[reached], new_id[dst[reached]]
  # One entry per (arc, value of its class): class label k + 1 covers edges[k]..edges[k+1]-1.
  edges = np.asarray(edges, np.int64)
  lo = edges[labels - 1]
  size = edges[labels] - lo
  arc = np.repeat(np.arange(len(labels)), size)
  value = lo[arc] + np.arange(len(arc)) - np.repeat(np.cumsum(size) - size, size)
  state, target = src[arc], dst[arc]
  is_call = (value >= _CALL_BASE) & (value < _CALL_BASE + num_rules)
  keep = (value < 256) | is_call
  column = np.where(is_call, 256 + value - _CALL_BASE, value)
  table = np.full((len(order), 256 + num_rules), NO_STATE, np.int32)
  table[state[keep], column[keep]] = target[keep]
  marker_arcs = []
  if markers:
    is_pseudo = (value >= _nfa.FRAGMENT_BASE) & (value < _CALL_BASE)
    for at in np.flatnonzero(is_pseudo)[np.lexsort((value[is_pseudo], state[is_pseudo]))]:
      node = pseudo[int(value[at]) - _nfa.FRAGMENT_BASE]
      if isinstance(node, ir.Marker):
        marker_arcs.append((int(state[at]), node, int(target[at])))
  return table, accepting[order], marker_arcs


def build_rtn(grammar: "_grammar.GrammarIR") -> Rtn:
  """The recursive transition network of a normalized grammar (start rule first).

  Raises:
    EmptyConstraintError: A rule matches nothing.
  """
  names = (grammar.start,) + tuple(n for n in grammar.names if n != grammar.start)
  index = {name: j for j, name in enumerate(names)}
  tables, accepting, marked = [], [], []
  for name in names:
    body = _grammar.substitute(
        grammar[name],
        lambda ref: ir.ByteClass(((_CALL_BASE + index[ref],) * 2,)))
    table, final, marker_arcs = _rule_dfa(body, len(names))
    if not len(final):
      raise errors.EmptyConstraintError(
          f"Grammar rule {name!r} matches no string. Expected every rule to match"
          " something; check for empty character classes.")
    tables.append(table)
    accepting.append(final)
    marked.append(marker_arcs)
  offsets = np.cumsum([0] + [len(f) for f in accepting])
  transitions = np.concatenate([np.where(t[:, :256] >= 0, t[:, :256] + off, NO_STATE)
                                for t, off in zip(tables, offsets)]).astype(np.int32)
  calls = []
  for t, off in zip(tables, offsets):
    for row in t[:, 256:]:
      calls.append(tuple((j, int(r) + int(off)) for j, r in enumerate(row.tolist()) if r >= 0))
  rule_of_state = np.repeat(np.arange(len(names)), [len(f) for f in accepting]).astype(np.int32)
  rtn = Rtn(rules=names, transitions=transitions, calls=tuple(calls),
            accepting=np.concatenate(accepting).astype(bool), rule_of_state=rule_of_state,
            rule_start=tuple(int(o) for o in offsets[:-1]), tops=())
  if any(marked):
    rtn = _contracted(rtn, [(q + int(off), m, t + int(off))
                            for arcs, off in zip(marked, offsets) for q, m, t in arcs])
  return dataclasses.replace(rtn, tops=_stack_tops(rtn))


def _contracted(rtn: Rtn, marker_arcs: list) -> Rtn:
  """`rtn` with its register markers folded into the byte arcs after them
  (`_registers.contract`, over all rules at once: states are numbered globally).

  A marker must be followed by bytes of its own rule: a state with a call arc counts as
  a token-class arc there (`contract` refuses a marker leading to one), and so does a
  state final in its rule. Such constructs would keep register words live across a
  push or a pop; the front ends write none (`_json_object_schemas._calls`).
  """
  markers = tuple(dict.fromkeys(m for _, m, _ in marker_arcs))
  index = {m: k for k, m in enumerate(markers)}
  calling = [q for q, calls in enumerate(rtn.calls) if calls]
  dfa = ByteDfa(
      transitions=rtn.transitions, accepting=rtn.accepting, start=rtn.start,
      token_arcs=np.array([(q, 0, q) for q in calling], np.int32).reshape(-1, 3),
      marker_arcs=np.array([(q, index[m], t) for q, m, t in marker_arcs],
                           np.int32).reshape(-1, 3), markers=markers)
  contracted = _registers.contract(dfa)
  _check_calls(rtn, contracted.arc_ops)
  return dataclasses.replace(rtn, transitions=contracted.dfa.transitions,
                             contracted=contracted)


def _check_calls(rtn: Rtn, arc_ops: dict) -> None:
  """Raises `RegisterError` if a call's callee (or a rule it calls) may touch a register
  word that is live at the call's return address: the row's words are not saved on the
  stack, so the caller must not need a word the callee may change.

  Live words: a backward fixpoint over the byte arcs (an operation other than CLEAR
  reads its word, UCLOSE the block's h0, h1 and n too; CLEAR kills its word) and,
  through a call, from its return address. Touched words: those the operations of a
  rule's arcs name, and of the rules it calls.
  """
  reads: dict = {}
  kills: dict = {}
  words_of_rule = [0] * len(rtn.rules)
  for (state, byte), ops in arc_ops.items():
    live, killed = 0, 0
    for kind, word, _ in reversed(ops):  # Backwards: a later read after a clear is dead.
      span = 3 if kind == _registers.UCLOSE else 1
      bits = ((1 << span) - 1) << word
      if kind == _registers.CLEAR:
        live &= ~bits
        killed |= bits
      else:
        live |= bits
        killed &= ~bits
      words_of_rule[int(rtn.rule_of_state[state])] |= bits
    reads[(state, byte)], kills[(state, byte)] = live, killed
  callees = [set() for _ in rtn.rules]
  for state, calls in enumerate(rtn.calls):
    for rule, _ in calls:
      callees[int(rtn.rule_of_state[state])].add(rule)
  touched = list(words_of_rule)
  changed = True
  while changed:
    changed = False
    for rule, called in enumerate(callees):
      merged = touched[rule]
      for other in called:
        merged |= touched[other]
      if merged != touched[rule]:
        touched[rule], changed = merged, True
  if not any(touched[rule] for called in callees for rule in called):
    return  # No callee touches a register: nothing to check.
  successors = [[] for _ in range(rtn.num_states)]  # (target, reads, kills)
  untagged = rtn.transitions.copy()
  for (q, b), read in reads.items():
    successors[q].append((int(rtn.transitions[q, b]), read, kills[(q, b)]))
    untagged[q, b] = NO_STATE
  source, byte = np.nonzero(untagged >= 0)
  pairs = np.unique(np.stack([source, untagged[source, byte]], axis=1), axis=0)
  for q, t in pairs.tolist():
    successors[q].append((t, 0, 0))
  for q, calls in enumerate(rtn.calls):
    successors[q] += [(ret, 0, 0) for _, ret in calls]
  live = [0] * rtn.num_states
  changed = True
  while changed:
    changed = False
    for q in range(rtn.num_states - 1, -1, -1):
      value = live[q]
      for target, read, kill in successors[q]:
        value |= read | (live[target] & ~kill)
      if value != live[q]:
        live[q], changed = value, True
  for state, calls in enumerate(rtn.calls):
    for rule, ret in calls:
      if touched[rule] & live[ret]:
        raise _registers.RegisterError(
            f"Rule {rtn.rules[rule]!r} may change register words that are in use where"
            f" rule {rtn.rules[int(rtn.rule_of_state[state])]!r} calls it (words are not"
            " saved on the stack).")


def _stack_tops(rtn: Rtn) -> tuple[frozenset[int], ...]:
  """Per rule, the return addresses that may be on top of the stack while it runs."""
  tops = [set() for _ in rtn.rules]
  tail_callers = [set() for _ in rtn.rules]  # rule -> rules that tail-call it
  for state, calls in enumerate(rtn.calls):
    for rule, ret in calls:
      if rtn.is_tail(ret):
        tail_callers[rule].add(int(rtn.rule_of_state[state]))
      else:
        tops[rule].add(ret)
  changed = True
  while changed:
    changed = False
    for rule, callers in enumerate(tail_callers):
      for caller in callers:
        if not tops[caller] <= tops[rule]:
          tops[rule] |= tops[caller]
          changed = True
  return tuple(frozenset(t) for t in tops)
