"""Constraint IR -> pynini acceptor -> minimal `ByteDfa`: the only place IR meets pynini.

Labels: an acceptor over bytes in which byte `b` carries label `b + 1`, because
OpenFst reserves label 0 for epsilon. Unicode classes become UTF-8 byte automata.
A token-level `ir.Terminal` (one whole token of a class of `ir.TOKEN_CLASSES`) is one
more symbol: class j is the pseudo-byte 256 + j (label 257 + j), so determinization and
minimization treat it like any byte, and the exported `ByteDfa` lists it in
`token_arcs`. An `ir.Graph` is embedded state for state between fresh NFA states. An
`ir.Fragment` is its body, or, when the caller asks (`compile_byte_dfa(node,
fragments=True)`), one more pseudo-byte per distinct fragment, exported as
`fragment_arcs` for `_splice.py` to replace with a copy of the fragment's automaton.
An `ir.Marker` (a register operation, `_registers.py`) is one more pseudo-byte in the
same numbering as fragments, exported as `marker_arcs`. (`_nfa.py` builds the NFA,
`_nfa_pack.py` packs it.)

Public functions:
  ir_to_fst(node)         an (epsilon-)NFA acceptor for the IR node, as a `pynini.Fst`.
  fst_to_byte_dfa(fst)    rmepsilon + determinize + minimize, exported as a `ByteDfa`.
  compile_byte_dfa(node)  the same DFA as `fst_to_byte_dfa(ir_to_fst(node))`, faster.
  minimal_class_fst(node) its minimal DFA over byte classes, before export (`_rtn.py`).
  fst_arcs(fst)           a DFA's arcs as numpy arrays (`const` format).
  breadth_first(...)      the canonical numbering of a DFA's states.

Speed matters (a regex is compiled per request; the budget is a fraction of a
millisecond), so `compile_byte_dfa`:
  * builds the NFA over byte *ranges* in plain Python lists and removes its few
    epsilon arcs there (`_nfa.py`);
  * labels arcs with byte classes (maximal byte ranges that no NFA range splits)
    rather than bytes, so OpenFst handles a `\\d` as 1-5 arcs instead of 10;
  * hands the NFA to OpenFst in one piece, as the binary `const` format parsed by
    `read_from_string` (one copy: ~20x faster than the `vector` format, which is ~2x
    faster than `add_arc`), packed with numpy when the NFA is large;
  * builds the UTF-8 automaton of each non-ASCII class once per process (a cached
    template, copied into the NFA);
  * skips determinization when the NFA is already deterministic (`Red|Blue|...`);
  * reads the minimal DFA back by converting it to the `const` format, whose
    fixed-size records numpy parses without a Python loop over states or arcs, and
    keeps the byte classes in the `ByteDfa` (`class_edges`) for later analyses.

`tests/automata/fsa_test.py` checks these fast paths against the plain pipeline.
States are numbered breadth-first from the start, arcs in byte order, so that equal
languages give equal tables whatever IR, NFA or OpenFst numbering they came from
(`tests/automata/fsa_canonical_test.py`); `class_edges` still come from the NFA.
"""

import struct

import numpy as np
import pynini
import pywrapfst

from constrained_decoding import errors
from constrained_decoding.automata import _byte_dfa
from constrained_decoding.automata import _nfa
from constrained_decoding.automata import _nfa_pack
from constrained_decoding.constraints import _ir as ir

# Most states subset construction may create before giving up with a typed error: an
# ambiguous repetition such as `(a|b)*a(a|b){20}` doubles them per count (2^21 here),
# and determinizing without a bound would run for minutes and exhaust memory.
MAX_DETERMINIZED_STATES = 100_000

# Tropical weights: Zero (inf) marks a non-final state.
_ZERO = float("inf")
# The `const` format's header start and its fixed-size state record (ConstFst::State).
_CONST_HEADER_PREFIX = _nfa_pack.binary_header(b"const")
_CONST_STATE = _nfa_pack.CONST_STATE


def ir_to_fst(node: ir.Node) -> pynini.Fst:
  """An acceptor for the language of `node` (byte b has label b + 1, token class j 257 + j).

  The result may contain epsilon arcs and be nondeterministic; `fst_to_byte_dfa`
  cleans it up.

  Raises:
    UnsupportedFeatureError: `node` contains a `Terminal` that is not a token class.
  """
  data, _ = _nfa_pack.pack_bytes(_nfa.build_nfa(node), _nfa.BYTE_EDGES, {1})
  return pynini.Fst.read_from_string(data)


# What a determinized epsilon-free unweighted acceptor is, as OpenFst property bits.
_P = pywrapfst.FstProperties
_DETERMINIZED = (_P.UNWEIGHTED | _P.UNWEIGHTED_CYCLES | _P.NO_EPSILONS | _P.NO_I_EPSILONS
                 | _P.NO_O_EPSILONS | _P.O_DETERMINISTIC)
_DETERMINIZED_MASK = (_DETERMINIZED | _P.WEIGHTED | _P.WEIGHTED_CYCLES | _P.EPSILONS
                      | _P.I_EPSILONS | _P.O_EPSILONS | _P.NON_O_DETERMINISTIC)


def _minimize(
    fst: pywrapfst.Fst, *, has_epsilons: bool = True, deterministic: bool = False
) -> pywrapfst.Fst:
  """rmepsilon, determinize and minimize (which also trims); may modify `fst`.

  Plain `pywrapfst` functions, not pynini's wrappers: the result never leaves this
  module, and they skip pynini's per-call conversions.

  Args:
    fst: An acceptor (a `MutableFst` unless `has_epsilons` and `deterministic` are False).
    has_epsilons: False if `fst` is known to have no epsilon arcs, and no weights but One
      (and Zero for non-final states): an NFA packed by `_nfa_pack`.
    deterministic: True if `fst` is known to be deterministic (then it has no
      epsilons either); regexes without shared prefixes (`Red|Blue`) often are.

  Raises:
    CompileBudgetError: Determinizing needs more than `MAX_DETERMINIZED_STATES` states.
  """
  if deterministic:
    if not isinstance(fst, pywrapfst.MutableFst):  # A `ConstFst` (`_nfa_pack.pack_const`).
      fst = pywrapfst.convert(fst, "vector")
    return fst.minimize()
  if has_epsilons:
    fst.rmepsilon()
    if fst.num_states() == 0:  # rmepsilon trims: the empty language.
      return fst
  dfa = pywrapfst.determinize(fst, nstate=MAX_DETERMINIZED_STATES)
  if dfa.num_states() >= MAX_DETERMINIZED_STATES:  # OpenFst stopped there.
    raise errors.CompileBudgetError(
        f"Determinizing the byte automaton needs more than {MAX_DETERMINIZED_STATES} states"
        " (an ambiguous bounded repetition such as '(a|b)*a(a|b){20}' makes it grow"
        " exponentially). Expected an unambiguous pattern: make the repeated part and what"
        " follows it start with different characters.")
  if not has_epsilons:  # `_nfa_pack`'s packing: weights One, so the DFA's are too.
    # Told, minimize skips a pass over every arc that would find it out (~15%).
    dfa.set_properties(_DETERMINIZED, _DETERMINIZED_MASK)
  return dfa.minimize()


def breadth_first(num_states: int, start: int, src, labels, dst
                   ) -> tuple[np.ndarray, np.ndarray]:
  """(order, new_id): the states reachable from `start` in breadth-first order, arcs
  taken in label order, and each state's index in that order (-1: unreachable).

  Labels are byte classes in byte order, then token classes and pseudo-bytes, so two
  minimal DFAs of one language get one numbering. A plain queue (these automata are
  deep chains of literal bytes: one numpy step per level costs more), without loops and
  arcs to the target of the arc before them (a string body's classes).
  """
  src, labels, dst = np.asarray(src), np.asarray(labels), np.asarray(dst)
  same = src[1:] == src[:-1]
  if not ((src[1:] > src[:-1]) | same & (labels[1:] > labels[:-1])).all():  # Unsorted.
    by_label = np.lexsort((labels, src))
    src, dst = src[by_label], dst[by_label]
  useful = src != dst
  useful[1:] &= (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
  ends = np.cumsum(np.bincount(src[useful], minlength=num_states)).tolist()
  targets = dst[useful].tolist()
  new_id = [-1] * num_states
  new_id[start] = 0
  order = [start]
  for state in order:  # `order` grows while it is read: the queue.
    for target in targets[ends[state - 1] if state else 0:ends[state]]:
      if new_id[target] < 0:
        new_id[target] = len(order)
        order.append(target)
  return np.array(order, np.int64), np.array(new_id, np.int64)


def _dfa_from_arcs(start, accepting, src, labels, dst, edges,
                   fragments: tuple = ()) -> _byte_dfa.ByteDfa:
  """Builds a `ByteDfa` from arc arrays over class labels, numbered canonically.

  States are numbered by `breadth_first` (start 0; unreachable ones dropped), so that
  equal minimal automata give equal tables, whatever OpenFst's numbering.

  Args:
    start: The start state (ignored when there are no states).
    accepting: bool `[Q]`, whether each state is final.
    src, labels, dst: The arcs, as int arrays; label k + 1 means byte class k.
    edges: Class k is the bytes `edges[k]..edges[k+1]-1` (`_nfa.BYTE_EDGES`: one per byte);
      values from 256 on are token classes (256 + j), exported as `token_arcs`, then
      pseudo-bytes (`_nfa.FRAGMENT_BASE + k`), exported as `fragment_arcs` or `marker_arcs`.
    fragments: The `ir.Fragment` or `ir.Marker` of each pseudo-byte index k.
  """
  num_states = len(accepting)
  if num_states == 0:
    return _byte_dfa.ByteDfa(
        transitions=np.zeros((0, 256), np.int32),
        accepting=np.zeros((0,), bool),
        start=_byte_dfa.NO_STATE,
    )
  order, new_id = breadth_first(num_states, start, src, labels, dst)
  reached = new_id[src] >= 0
  # Column j holds the arcs labelled j (byte class j - 1); column 0 (epsilon) stays empty.
  table = np.full((len(order), len(edges)), _byte_dfa.NO_STATE, np.int32)
  table[new_id[src[reached]], labels[reached]] = new_id[dst[reached]]
  accepting = accepting[order]
  # Expand classes to values: the column of each value is the label of its class. The
  # 256 byte columns are taken on their own, so the table is row-major (every later
  # stage reads whole rows or (state, byte) pairs) without a copy.
  label_of_value = np.arange(1, len(edges)).repeat(np.diff(edges))
  extra = table.take(label_of_value[_nfa.TOKEN_CLASS_BASE:], axis=1)
  table = table.take(label_of_value[:_nfa.TOKEN_CLASS_BASE], axis=1)
  token_arcs = fragment_arcs = marker_arcs = np.zeros((0, 3), np.int32)
  markers = ()
  if extra.shape[1]:
    state, klass = np.nonzero(extra != _byte_dfa.NO_STATE)
    arcs = np.stack([state, klass, extra[state, klass]], axis=1).astype(np.int32)
    is_pseudo = klass >= len(ir.TOKEN_CLASSES)
    token_arcs = arcs[~is_pseudo]
    pseudo_arcs = arcs[is_pseudo]
    pseudo_arcs[:, 1] -= len(ir.TOKEN_CLASSES)
    fragment_arcs, marker_arcs, fragments, markers = _split_pseudo(pseudo_arcs, fragments)
  byte_edges = np.asarray([e for e in edges if e <= _nfa.TOKEN_CLASS_BASE])
  return _byte_dfa.ByteDfa(transitions=table, accepting=accepting, start=0,
                           token_arcs=token_arcs, class_edges=byte_edges,
                           fragment_arcs=fragment_arcs, fragments=tuple(fragments),
                           marker_arcs=marker_arcs, markers=markers)


def _split_pseudo(arcs: np.ndarray, pseudo: tuple):
  """(fragment arcs, marker arcs, fragments, markers): pseudo-byte arcs `(state, k,
  target)` split by what `pseudo[k]` is, each renumbered densely in its own list."""
  is_marker = np.array([isinstance(p, ir.Marker) for p in pseudo] + [False], bool)
  index = np.zeros(len(pseudo) + 1, np.int32)
  index[~is_marker] = np.arange(int((~is_marker).sum()))
  index[is_marker] = np.arange(int(is_marker.sum()))
  fragment_arcs = arcs[~is_marker[arcs[:, 1]]]
  marker_arcs = arcs[is_marker[arcs[:, 1]]]
  fragment_arcs[:, 1] = index[fragment_arcs[:, 1]]
  marker_arcs[:, 1] = index[marker_arcs[:, 1]]
  fragments = tuple(p for p in pseudo if not isinstance(p, ir.Marker))
  markers = tuple(p for p in pseudo if isinstance(p, ir.Marker))
  return fragment_arcs, marker_arcs, fragments, markers


# Claims that make every property OpenFst copies into a `ConstFst` known: the true ones
# of a minimal DFA, and the cautious side (cyclic, unsorted, ...) of the others.
_CLAIMED = (_P.ACCEPTOR | _P.I_DETERMINISTIC | _P.O_DETERMINISTIC | _P.NO_EPSILONS
            | _P.NO_I_EPSILONS | _P.NO_O_EPSILONS | _P.UNWEIGHTED | _P.UNWEIGHTED_CYCLES
            | _P.ACCESSIBLE | _P.COACCESSIBLE | _P.CYCLIC | _P.INITIAL_CYCLIC
            | _P.NOT_I_LABEL_SORTED | _P.NOT_O_LABEL_SORTED | _P.NOT_TOP_SORTED
            | _P.NOT_STRING)
_ALL_PROPERTIES = _P.FST_PROPERTIES


def _const_bytes(fst: pywrapfst.Fst) -> bytes:
  """`fst` written in the `const` format.

  Converting to a `ConstFst` makes OpenFst compute every property it does not know
  (cycles, sorting, ...: 3x the cost of the copy itself) only to store them in the
  header, which `fst_arcs` skips. So a mutable `fst` is told them for the conversion
  (`_CLAIMED`) and gets its own back afterwards.
  """
  if not isinstance(fst, pywrapfst.MutableFst):
    return pywrapfst.convert(fst, "const").write_to_string()
  stored = fst.properties(_ALL_PROPERTIES, False)
  fst.set_properties(_CLAIMED, _P.COPY_PROPERTIES & ~_P.ERROR)
  try:
    return pywrapfst.convert(fst, "const").write_to_string()
  finally:
    fst.set_properties(stored, _ALL_PROPERTIES)


def fst_arcs(fst: pywrapfst.Fst) -> tuple:
  """(start, accepting, src, labels, dst) of an epsilon-free acceptor, as numpy arrays
  (bool `[Q]`, int arcs in state order).

  Read through OpenFst's binary `const` format: a `ConstFst` stores fixed-size state
  records and then all arcs in state order, so (unlike the `vector` format, whose
  records have variable length) the whole file is read by two `np.frombuffer` calls;
  converting to `const` is one copy (`_const_bytes`).
  """
  data = _const_bytes(fst)
  if not data.startswith(_CONST_HEADER_PREFIX):
    raise ValueError(
        "Expected a ConstFst over standard arcs without symbol tables, got the header"
        f" {data[:40]!r} instead."
    )
  offset = len(_CONST_HEADER_PREFIX) + 8  # Skip the properties.
  start, num_states, num_arcs = struct.unpack_from("<qqq", data, offset)
  offset += 24
  states = np.frombuffer(data, _CONST_STATE, num_states, offset)
  arcs = np.frombuffer(data, "<i4", 4 * num_arcs, offset + _CONST_STATE.itemsize * num_states)
  labels = arcs[0::4]
  if labels.size and labels.min() <= _nfa.EPSILON_LABEL:
    raise ValueError("Expected an epsilon-free automaton, got epsilon arcs instead.")
  return (start, states["final"] != _ZERO, np.arange(num_states).repeat(states["num_arcs"]),
          labels, arcs[3::4])


def _export_fast(fst: pywrapfst.Fst, edges=_nfa.BYTE_EDGES, fragments: tuple = ()
                 ) -> _byte_dfa.ByteDfa:
  """Exports a DFA read by `fst_arcs` (numpy, no loop over states or arcs)."""
  return _dfa_from_arcs(*fst_arcs(fst), edges, fragments)


def fst_to_byte_dfa(fst: pynini.Fst) -> _byte_dfa.ByteDfa:
  """The minimal trimmed `ByteDfa` of a byte acceptor (labels b + 1, 0 = epsilon).

  Removes epsilons, determinizes and minimizes with OpenFst, keeps only states that
  are accessible and co-accessible, and numbers them breadth-first from the start
  (state 0), bytes in order (`breadth_first`): one language, one table. The
  empty language gives a DFA with 0 states and `start == NO_STATE`. `fst` is not
  modified; symbol tables, if any, are ignored.
  """
  fst = fst.copy()
  fst.set_input_symbols(None)
  fst.set_output_symbols(None)
  return _export_fast(_minimize(fst))


def compile_byte_dfa(node: ir.Node, *, fragments: bool = False) -> _byte_dfa.ByteDfa:
  """The minimal `ByteDfa` of an IR node; the same as `fst_to_byte_dfa(ir_to_fst(node))`.

  Faster than that composition: OpenFst works over byte classes (sets of bytes that
  no range of the NFA separates) instead of single bytes, and the classes are expanded
  back to bytes only in the exported table.

  With `fragments`, each distinct `ir.Fragment` is one pseudo-byte arc (`fragment_arcs`,
  `fragments`) instead of its body, for `_splice.py`.

  Raises:
    UnsupportedFeatureError: `node` contains a `Terminal` that is not a token class.
  """
  fst, edges, pseudo = minimal_class_fst(node, fragments=fragments)
  return _export_fast(fst, edges, pseudo)


def minimal_class_fst(node: ir.Node, *, fragments: bool = False
                      ) -> tuple[pywrapfst.Fst, list[int], tuple]:
  """The minimal deterministic acceptor of `node` over its byte classes, before export.

  Returns (fst, edges, pseudo): arc label k + 1 covers the values edges[k] ..
  edges[k + 1] - 1 (bytes, and past 255 the pseudo-bytes of `ir.RuleRef`s and, with
  `fragments`, of fragments: `pseudo`). `compile_byte_dfa` expands it into a
  `ByteDfa`; `_rtn.py` reads its call arcs.
  """
  # Lists of ints, acyclic: the collector would look at them in vain (`ir.gc_paused`).
  # They are freed before it resumes: alive then, they counted as new objects and the
  # first allocation after it resumed walked them all (~1 ms a schema, ~2% of a corpus
  # pass).
  with ir.gc_paused():
    nfa = _nfa.build_nfa(node, fragments)
    finals = _nfa.remove_epsilons(nfa)
    edges = _nfa.byte_classes(nfa.bounds)
    data, deterministic = _nfa_pack.pack_const(nfa, edges, finals)
    pseudo = tuple(nfa.pseudo)
    del nfa, finals
  fst = _minimize(
      pywrapfst.Fst.read_from_string(data), has_epsilons=False, deterministic=deterministic
  )
  return fst, edges, pseudo
