"""Shared fragments: compose a sub-language with the vocabulary once, splice in copies.

An additional property's value in a JSON Schema object is schema-free JSON: a byte
automaton of ~300 states (every scalar's lexer once per nesting context) that is the
same in every schema, yet composing it with the vocabulary costs far more than the rest
of a typical schema. So the IR marks it as an `ir.Fragment`; `_fsa` leaves each
occurrence as one pseudo-byte arc s --F--> c, and here

* `build_fragment` composes the fragment's automaton with the vocabulary once (per
  compiler, i.e. per vocabulary and options; cached on disk next to the terminals): its
  explicit edges that stay inside, its terminal edges, and its *exits*, the places
  where a token leaves the fragment after a complete value (`1,` or `abc"}`): (origin
  state, full-trie node of the token prefix that ends with the first byte after the
  value, that byte). Exits are found by composing the fragment with one extra dead-end
  state per byte that may follow a JSON value (`EXIT_BYTES`), where the walks stop and
  are recorded.
* `splice` replaces each arc s --F--> c by a copy of the fragment's states, s acting as
  the fragment's start, and gives each accepting copy state c's transitions besides
  its own (they read disjoint bytes: a complete value is followed by `,`, `}`, ...).
  The copies' edges are the fragment's, renumbered; only the exits are walked, from
  c on the exit byte, together with the rest of the automaton's walks.

The result is the automaton inlining the fragment would give (not necessarily
minimal), with the same token edges, found without walking the copies' states.
Splicing needs c to read only `EXIT_BYTES` that no accepting fragment state reads;
otherwise `splice` returns None and the compiler inlines the fragment. A source s that
also reads bytes of its own (a union of objects where one declares a key another leaves
free-form: `"age":` reads an integer or any value) is walked plainly, its row the union
of both sides, made deterministic by a small subset construction (`_merge_rows`).

Public names:
  EXIT_BYTES                         bytes that may follow a fragment's text.
  FragmentAutomaton, build_fragment  a fragment composed with the vocabulary.
  splice(dfa, automata)              the byte DFA with fragment copies + their edges.
"""

import dataclasses
import functools
import hashlib

import numpy as np
import pywrapfst

from constrained_decoding.automata import _compose
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _nfa
from constrained_decoding.automata import _nfa_pack
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._detokenizer import VocabTrie
from constrained_decoding.constraints import _ir as ir

# What may follow a JSON value: a separator, a closing bracket or whitespace.
EXIT_BYTES = b",]} \t\n\r"
_EXIT_BYTE_ARRAY = np.frombuffer(EXIT_BYTES, np.uint8).astype(np.int64)
_IS_EXIT_BYTE = np.zeros(256, bool)
_IS_EXIT_BYTE[_EXIT_BYTE_ARRAY] = True


@dataclasses.dataclass(frozen=True, eq=False)
class FragmentAutomaton:
  """A fragment composed with one vocabulary (see the module doc).

  Attributes:
    name: The fragment's name.
    dfa: Its minimal byte DFA (start 0; empty for the empty language).
    edges: (source, token, target) int32 arrays: explicit edges that stay inside.
    terminals: {state: [(bitmap, target), ...]} terminal edges, in precedence order.
    exit_from, exit_node, exit_byte: int32 `[X]`: tokens leaving after a complete
      value: from state exit_from, the tokens at and below full-trie node exit_node
      read their bytes up to exit_node's inside the fragment, ending in an accepting
      state, then exit_byte (exit_node's last byte), which the fragment does not read
      there.
  """

  name: str
  dfa: ByteDfa
  edges: tuple[np.ndarray, np.ndarray, np.ndarray]
  terminals: dict
  exit_from: np.ndarray
  exit_node: np.ndarray
  exit_byte: np.ndarray

  @functools.cached_property
  def shifted_transitions(self) -> np.ndarray:
    """`dfa.transitions + 1` (NO_STATE becomes 0), for `splice`'s one-gather renumbering."""
    return self.dfa.transitions + 1


def build_fragment(fragment: ir.Fragment, trie: VocabTrie, wide_states, *,
                   max_edges: int = 20_000_000, deadline: float = float("inf"),
                   what: str = "The constraint") -> FragmentAutomaton | None:
  """Composes `fragment` with the vocabulary of `trie` (`wide_states`: its terminal cache).

  Returns None for a fragment this cannot splice (then inline it): one with token
  classes inside, or whose terminals need sub-trie walks (near-loop states) that can
  leave it, since those walks do not stop at its exits.

  Raises:
    CompileBudgetError: Composition exceeds `max_edges` or `deadline`.
  """
  dfa = _fsa.compile_byte_dfa(fragment.body)
  if len(dfa.token_arcs):
    return None
  empty = np.zeros(0, np.int32)
  q = dfa.num_states
  if q == 0:
    return FragmentAutomaton(fragment.name, dfa, (empty,) * 3, {}, empty, empty, empty)
  key = _cache_key(dfa, trie, wide_states.num_words)
  cached = wide_states.load_arrays(key)
  if cached is not None:
    try:
      return _from_arrays(fragment.name, dfa, cached)
    except (KeyError, ValueError, IndexError):
      pass  # A damaged file: build anew (and overwrite it).
  # The probe: one dead-end sink per byte that may follow a value, entered from every
  # accepting state that does not read that byte itself.
  accepting = np.flatnonzero(dfa.accepting)
  free = dfa.transitions[accepting][:, _EXIT_BYTE_ARRAY] == NO_STATE  # [A, B]
  used = np.flatnonzero(free.any(axis=0))
  trans = np.concatenate([dfa.transitions, np.full((len(used), 256), NO_STATE, np.int32)])
  for sink, j in enumerate(used, start=q):
    trans[accepting[free[:, j]], _EXIT_BYTE_ARRAY[j]] = sink
  exit_bytes = _EXIT_BYTE_ARRAY[used]
  edges = np.union1d(dfa.class_edges if dfa.class_edges is not None else np.arange(257),
                     np.concatenate([exit_bytes, exit_bytes + 1]))
  probe = ByteDfa(transitions=trans, accepting=np.concatenate([dfa.accepting,
                                                               np.ones(len(used), bool)]),
                  start=0, class_edges=edges)
  is_sink = np.arange(probe.num_states) >= q
  wide = wide_states.find(probe, is_sink)
  given = _compose.GivenEdges(is_sink, (empty,) * 3, {}, (empty,) * 3)
  stopped = []
  src, tok, dst = _compose.token_edges(probe, trie, wide=wide, given=given,
                                       max_edges=max_edges, deadline=deadline, what=what,
                                       stop_at=q, stopped=stopped)
  if (dst >= q).any():
    return None
  terminals = _compose._terminal_edges(probe, wide, None, 0)  # pylint: disable=protected-access
  exit_from, exit_node, exit_byte = _exits(stopped, trie)
  arrays = _to_arrays(FragmentAutomaton(fragment.name, dfa, (src, tok, dst), terminals,
                                        exit_from, exit_node, exit_byte))
  wide_states.save_arrays(key, **arrays)
  return _from_arrays(fragment.name, dfa, arrays)  # As loaded: one object per bitmap.


# Bump when the cached layout or what a fragment's edges are changes.
_FRAGMENT_FORMAT = 3


def _cache_key(dfa: ByteDfa, trie: VocabTrie, num_words: int) -> str:
  """The cache key of a fragment: its automaton (not its name: the IR a name stands for
  may change between versions), the vocabulary and the format."""
  digest = hashlib.sha1(f"fragment-{_FRAGMENT_FORMAT}-{trie.fingerprint}-{num_words}".encode())
  for array in (dfa.transitions, dfa.accepting, dfa.class_edges):
    digest.update(b"|" if array is None else np.ascontiguousarray(array).tobytes())
  return "fragment-" + digest.hexdigest()[:24]


def _to_arrays(automaton: FragmentAutomaton) -> dict:
  """The arrays `_from_arrays` rebuilds `automaton` from (its DFA is recompiled)."""
  bits, index = [], {}
  rows = []  # (state, rank, bitmap, target) per terminal edge.
  for state, edges in automaton.terminals.items():
    for rank, (bitmap, target) in enumerate(edges):
      k = index.setdefault(bitmap.tobytes(), len(bits))  # Equal bitmaps stored once.
      if k == len(bits):
        bits.append(bitmap)
      rows.append((state, rank, k, target))
  src, tok, dst = automaton.edges
  return dict(src=src, tok=tok, dst=dst, exit_from=automaton.exit_from,
              exit_node=automaton.exit_node, exit_byte=automaton.exit_byte,
              terminal_rows=np.array(rows, np.int32).reshape(-1, 4),
              terminal_bits=np.array(bits) if bits else np.zeros((0, 0), np.uint32))


def _from_arrays(name: str, dfa: ByteDfa, arrays: dict) -> FragmentAutomaton:
  """The fragment `_to_arrays` stored."""
  terminals: dict[int, list] = {}
  # One array object per bitmap, shared by its edges: `_compose._pack_terminals`
  # compares bitmaps by identity first (a view per edge would be compared by content).
  bits = list(arrays["terminal_bits"])
  for state, rank, k, target in arrays["terminal_rows"].tolist():
    edges = terminals.setdefault(state, [])
    if rank != len(edges):
      raise ValueError("terminal edges out of order")
    edges.append((bits[k], target))
  return FragmentAutomaton(name, dfa, _by_source_and_token(arrays["src"], arrays["tok"],
                                                           arrays["dst"]), terminals,
                           arrays["exit_from"], arrays["exit_node"], arrays["exit_byte"])


def _by_source_and_token(src: np.ndarray, tok: np.ndarray, dst: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A fragment's edges sorted by (source, token), once per compiler (~2 ms for ~29k).

  `splice` renumbers a copy's states increasingly (its start, then a block of new states
  above every other), so each copy's edges stay in the order `_compose._sorted_edges`
  gives the whole automaton: one run its timsort takes whole, where the walks' order left
  ~12k runs per copy. Half of a corpus schema's edges are copies' (k8s_deployment: 377k
  of 650k), and its final sort takes 13.0 -> 7.0 ms.
  """
  order = (src.astype(np.int64) << 32 | tok).argsort(kind="stable")
  return src[order], tok[order], dst[order]


def _exits(stopped: list, trie: VocabTrie) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(from, node, byte) of the walks stopped at a sink ((node, state, origin) arrays or
  ints), sorted by (from, node); node's last byte is the one leading into the sink."""
  node = np.concatenate([np.atleast_1d(n) for n, _, _ in stopped] + [[]]).astype(np.int32)
  origin = np.concatenate([np.atleast_1d(o) for _, _, o in stopped] + [[]]).astype(np.int32)
  order = np.lexsort((node, origin))
  node_byte = np.zeros(trie.num_nodes, np.int32)
  node_byte[trie.child_node] = trie.child_byte
  return origin[order], node[order], node_byte[node[order]]


def splice(dfa: ByteDfa, automata: list[FragmentAutomaton | None], *,
           drop_unreached: bool = True,
           arc_ops: dict | None = None) -> tuple[ByteDfa, _compose.GivenEdges] | None:
  """`dfa` with each fragment arc replaced by a copy of its fragment, and the copies'
  edges for `_compose.compose_token_dfa(..., given=...)`; None when some arc cannot
  be spliced (see the module doc), or some fragment could not be built: then inline
  the fragments instead.

  `automata[k]` is the composed `dfa.fragments[k]`. With `drop_unreached=False` the
  states of `dfa` keep their numbers (continuations no longer reached stay, for the
  caller to trim), as `_embedded_chains` needs.

  `arc_ops` (register operations on `dfa`'s byte arcs, `_registers.contract`) come back
  in `GivenEdges.arc_ops` for the spliced DFA: a copy's accepting states read the
  continuation's bytes, so they take its operations too.
  """
  if any(automaton is None for automaton in automata):
    return None
  arcs = dfa.fragment_arcs
  sources = arcs[:, 0]
  q = dfa.num_states
  trans = dfa.transitions
  if (len(np.unique(sources)) != len(sources) or dfa.accepting[sources].any()
      or np.isin(sources, dfa.token_arcs[:, 0]).any()
      or np.isin(arcs[:, 2], dfa.token_arcs[:, 0]).any()):
    return None
  # A source that also reads bytes of its own (a union where one side is free-form):
  # walked plainly, its row the union of both (`_merge_rows`).
  mixed = (trans[sources] != NO_STATE).any(axis=1)
  sizes = []
  for (_, k, _), own in zip(arcs.tolist(), mixed.tolist()):
    fragment = automata[k].dfa
    if fragment.num_states == 0 or fragment.accepting[0]:
      return None
    if own and (fragment.transitions == 0).any():
      return None  # Its copy's start is the source: a loop back would read its bytes too.
    sizes.append(fragment.num_states - 1)
  total = q + sum(sizes)
  # A continuation c that only the fragment arcs led to is unreachable once spliced (the
  # copies' accepting states take its arcs): drop it, so that the DFA stays trimmed.
  # Known before the copies are written (no row leads to it), so the table is built in
  # the final numbering: the copies' rows are written once, not renumbered afterwards.
  keep = np.ones(total, bool)
  reached = set(dfa.token_arcs[:, 2].tolist()) | {dfa.start}
  for c in set(arcs[:, 2].tolist()) - reached:
    keep[c] = bool((trans == c).any()) or not drop_unreached
  dropped = int(total - np.count_nonzero(keep))
  new_id = None  # Old number -> new; entry [-1] maps NO_STATE to itself.
  base = trans.copy()  # The rows of dfa's states, in the final numbering.
  if dropped:
    new_id = np.cumsum(keep, dtype=np.int32) - 1
    new_id = np.append(np.where(keep, new_id, NO_STATE), NO_STATE).astype(np.int32)
    # (Gathers by int32 states are `take`s: indexing by int32 arrays goes through numpy
    # 2.4's casting iterator, 1.5-4x slower.)
    base = new_id.take(trans)
  new_trans = np.full((total - dropped, 256), NO_STATE, np.int32)
  accepting = np.zeros(total, bool)
  accepting[:q] = dfa.accepting
  copies = np.zeros(total, bool)
  phis, new_phis = [], []
  own_rows = {}  # Mixed source (final number) -> its own row (final numbering).
  offset = q
  for (s, k, _), size, own in zip(arcs.tolist(), sizes, mixed.tolist()):
    phi = np.empty(size + 1, np.int32)
    phi[0] = s
    phi[1:] = np.arange(offset, offset + size, dtype=np.int32)
    new_phi = phi if new_id is None else new_id.take(phi)
    # Entry f + 1 of [NO_STATE, new_phi...] maps f, and NO_STATE (-1) to itself; the
    # copy's states after its start are a block (all kept: only states of dfa drop).
    lookup = np.concatenate([[NO_STATE], new_phi])
    shifted = automata[k].shifted_transitions
    if own:
      own_rows[int(new_phi[0])] = base[s].copy()
    base[s] = lookup.take(shifted[0])
    np.take(lookup, shifted[1:], out=new_trans[offset - dropped:offset - dropped + size])
    offset += size
    copies[phi[int(own):]] = True
    phis.append(phi)
    new_phis.append(new_phi)
  # Accepting copy states also continue like c (whose row is final now: c is no copy).
  frontier_parts, terminals = [], {}
  ops = None if arc_ops is None else dict(arc_ops)
  ops_of: dict[int, list] = {}
  for (state, byte), crossed in (arc_ops or {}).items():
    ops_of.setdefault(state, []).append((byte, crossed))
  for (_, k, c), phi, new_phi, own in zip(arcs.tolist(), phis, new_phis, mixed.tolist()):
    automaton = automata[k]
    finals = phi[automaton.dfa.accepting]
    new_finals = new_phi[automaton.dfa.accepting]
    follow = base[c] != NO_STATE
    if (not _IS_EXIT_BYTE[follow].all()
        or (new_trans.take(new_finals, axis=0)[:, follow] != NO_STATE).any()):
      return None
    new_trans[np.ix_(new_finals, np.flatnonzero(follow))] = base[c, follow]
    accepting[finals] = dfa.accepting[c]
    for byte, crossed in ops_of.get(c, ()):
      for f in finals.tolist():
        ops[(f, byte)] = crossed
    for state, edges in automaton.terminals.items():
      if not (own and state == 0):  # A mixed source is walked.
        terminals[int(new_phi[state])] = [(bits, int(new_phi[target]))
                                          for bits, target in edges]
    nxt = base[c].take(automaton.exit_byte)
    reads = np.flatnonzero((nxt != NO_STATE) & ((automaton.exit_from != 0) | (not own)))
    frontier_parts.append((automaton.exit_node[reads], nxt[reads],
                           new_phi.take(automaton.exit_from[reads])))
  new_trans[:q - dropped] = base if new_id is None else base[keep[:q]]
  class_edges = [np.arange(257) if d.class_edges is None else d.class_edges
                 for d in [dfa] + [a.dfa for a in automata]]
  class_edges = np.unique(np.concatenate(class_edges))
  edges = _copy_edges(arcs[:, 1], new_phis, automata, mixed)
  frontier = _columns(frontier_parts)
  token_arcs, start = dfa.token_arcs, dfa.start
  if new_id is not None:
    token_arcs = token_arcs.copy()
    token_arcs[:, [0, 2]] = new_id.take(token_arcs[:, [0, 2]])
    start = int(new_id[dfa.start])
    accepting, copies = accepting[keep], copies[keep]
    if ops is not None:
      ops = {(int(new_id[s]), b): crossed for (s, b), crossed in ops.items() if new_id[s] >= 0}
  if own_rows:
    merged = _merge_rows(new_trans, accepting, own_rows, token_arcs, ops)
    if merged is None:
      return None
    new_trans, accepting = merged
    copies = np.concatenate([copies, np.zeros(len(accepting) - len(copies), bool)])
  return (ByteDfa(transitions=new_trans, accepting=accepting, start=start,
                  token_arcs=token_arcs, class_edges=class_edges),
          _compose.GivenEdges(copies, edges, terminals, frontier, ops))


# At most this many union states per spliced DFA (a mixed source's shared prefixes are
# a few bytes: a number or `true` both sides read); beyond it, inline instead.
_MAX_UNION_STATES = 4096


def _merge_rows(trans: np.ndarray, accepting: np.ndarray, own_rows: dict,
                token_arcs: np.ndarray, ops: dict | None):
  """(transitions, accepting) with each mixed source s reading both its own bytes
  (`own_rows[s]`) and its copy's (its row in `trans`), made deterministic by the
  subset construction: a byte both sides read leads to a new state, the union of the
  targets, until all sides but one stop or they meet. A state that is no copy's keeps
  reading what it did, so the spliced copies' edges stay right; union states are
  appended, walked plainly as the sources are. (A copy's start, the source, is not
  entered again: `splice` checks.) None (inline instead) when a union holds a state
  with token arcs or register operations, or there are over `_MAX_UNION_STATES`.
  """
  n = len(trans)
  own_of = {s: n + j for j, s in enumerate(own_rows)}  # s -> its own row's number.
  base = np.concatenate([trans, np.array(list(own_rows.values()), np.int32)])
  base_accepting = np.concatenate([accepting, accepting[list(own_rows)]])
  special = set(token_arcs[:, 0].tolist()) | set(token_arcs[:, 2].tolist())
  if ops:
    special |= {s for s, _ in ops}
  ids = {frozenset((s, own)): s for s, own in own_of.items()}
  pending = list(ids)
  rows, finals = {}, {}
  while pending:
    members = pending.pop()
    if special & members:
      return None
    table = base.take(sorted(members), axis=0)
    row = table.max(axis=0)  # One side's target, where at most one reads the byte.
    several = np.flatnonzero(((table != NO_STATE).sum(axis=0) > 1)
                             & ((table != row).any(axis=0)))
    for byte in several.tolist():
      targets = set()
      for target in set(table[:, byte].tolist()) - {NO_STATE}:
        targets |= {target, own_of[target]} if target in own_of else {target}
      union = frozenset(targets)
      if union not in ids:
        if len(ids) >= len(own_of) + _MAX_UNION_STATES:
          return None
        ids[union] = n + len(ids) - len(own_of)
        pending.append(union)
      row[byte] = ids[union]
    rows[ids[members]] = row
    finals[ids[members]] = bool(base_accepting[sorted(members)].any())
  trans = np.concatenate([trans, np.zeros((len(ids) - len(own_of), 256), np.int32)])
  accepting = np.concatenate([accepting, np.zeros(len(ids) - len(own_of), bool)])
  for state, row in rows.items():
    trans[state] = row
    accepting[state] = finals[state]
  return trans, accepting


def _copy_edges(fragment_of: np.ndarray, phis: list, automata: list,
                mixed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The copies' explicit edges (source, token, target) int32, copy by copy: each
  fragment's edges renumbered by its copy's states `phis[i]` (final numbers), written
  once into the output columns: one gather per edge column, no concatenation or later
  renumbering pass (the maps compose on a copy's ~350 states, not its ~29k edges).
  Each `phis[i]` increases, so a copy's edges keep the fragment's (source, token) order.
  A mixed source (`mixed[i]`, walked) gets none of its start state's edges.
  """
  # Edges are sorted by source: a start state's edges come first.
  skips = [int(np.searchsorted(automata[k].edges[0], 1)) if own else 0
           for k, own in zip(fragment_of.tolist(), mixed.tolist())]
  counts = [len(automata[k].edges[0]) - skip for k, skip in zip(fragment_of.tolist(), skips)]
  total = sum(counts)
  src, tok, dst = (np.empty(total, np.int32) for _ in range(3))
  at = 0
  for k, phi, n, skip in zip(fragment_of.tolist(), phis, counts, skips):
    fragment_src, fragment_tok, fragment_dst = (e[skip:] for e in automata[k].edges)
    np.take(phi, fragment_src, out=src[at:at + n])
    tok[at:at + n] = fragment_tok
    np.take(phi, fragment_dst, out=dst[at:at + n])
    at += n
  return src, tok, dst


def _columns(parts: list) -> tuple[np.ndarray, ...]:
  return tuple(np.concatenate(column).astype(np.int32) for column in zip(*parts))


def inline(dfa: ByteDfa, automata: list[FragmentAutomaton | None]) -> ByteDfa | None:
  """The minimal DFA of `dfa`'s language with every fragment arc replaced by its
  fragment's language: the DFA `_fsa.compile_byte_dfa(node)` builds for the IR `dfa`
  came from (`compile_byte_dfa(node, fragments=True)`, marker arcs not yet folded),
  field for field, for the compiler to fall back on when `splice` cannot splice.

  Built from the automata at hand instead of the IR: `dfa` with, per distinct (fragment,
  continuation c), one copy of the fragment's minimal DFA; a fragment arc's source reads
  the copy's first bytes, and the copy's accepting states read c's arcs (and accept
  where c does). That NFA is nearly deterministic (only sources that read bytes
  besides a fragment, which is why `splice` failed, are not), so OpenFst determinizes
  and minimizes it in a fraction of what the inlined IR's NFA takes (pydantic
  discriminated pets: 4.6k NFA states, 847 + 11 copies of 345, instead of 8.7k, which
  determinize to 10k).
  The canonical numbering (`_fsa.breadth_first`) makes the result the same DFA; the
  byte classes are the union of both automata's, as the inlined NFA's bounds are.

  Returns None when this does not apply (the caller compiles the IR instead): a
  fragment that could not be built, that holds token classes, markers or fragments,
  accepts the empty text, or a continuation that starts another fragment.
  """
  if any(a is None or a.dfa.num_states == 0 or a.dfa.accepting[a.dfa.start]
         or len(a.dfa.token_arcs) or len(a.dfa.marker_arcs) or len(a.dfa.fragment_arcs)
         for a in automata):
    return None
  arcs = dfa.fragment_arcs
  if np.isin(arcs[:, 2], arcs[:, 0]).any():
    return None
  byte_edges = np.unique(np.concatenate(
      [np.arange(257) if d.class_edges is None else np.asarray(d.class_edges)
       for d in [dfa] + [a.dfa for a in automata]]))
  first = byte_edges[:-1]
  num_classes = len(first)
  # Labels: byte class k is k + 1, token class j and marker m the classes after them.
  marker_label = num_classes + len(ir.TOKEN_CLASSES) + 1
  parts = [_byte_arcs(dfa.transitions, first, np.arange(dfa.num_states))]
  specials = [(dfa.token_arcs, num_classes + 1), (dfa.marker_arcs, marker_label)]
  for extra, base in specials:
    parts.append((extra[:, 0], extra[:, 1] + base, extra[:, 2]))
  accepting = [dfa.accepting]
  size = dfa.num_states
  copies: dict[tuple[int, int], int] = {}
  for s, k, c in arcs.tolist():
    fragment = automata[k].dfa
    offset = copies.get((k, c))
    if offset is None:
      offset = copies[(k, c)] = size
      size += fragment.num_states
      ids = np.arange(offset, size)
      src, label, dst = _byte_arcs(fragment.transitions, first, ids)
      parts.append((src, label, dst + offset))
      finals = ids[fragment.accepting]
      accepting.append(np.where(fragment.accepting, dfa.accepting[c], False))
      # The accepting copy states continue as c: its byte, token and marker arcs.
      c_src, c_label, c_dst = _byte_arcs(dfa.transitions[c:c + 1], first, np.array([0]))
      for extra, base in specials:
        c_arcs = extra[extra[:, 0] == c]
        c_label = np.concatenate([c_label, c_arcs[:, 1] + base])
        c_dst = np.concatenate([c_dst, c_arcs[:, 2]])
      parts.append((finals.repeat(len(c_label)), np.tile(c_label, len(finals)),
                    np.tile(c_dst, len(finals))))
    # The source reads the copy's first bytes (its start state stays for loops back).
    start_src, start_label, start_dst = _byte_arcs(
        automata[k].dfa.transitions[automata[k].dfa.start:automata[k].dfa.start + 1],
        first, np.array([s]))
    parts.append((start_src, start_label, start_dst + offset))
  src, label, dst = (np.concatenate([np.asarray(p[i], np.int64) for p in parts])
                     for i in range(3))
  order = np.argsort(src, kind="stable")  # pack_arcs wants arcs grouped by state.
  data = _nfa_pack.pack_arcs(size, dfa.start, np.concatenate(accepting), src[order],
                        label[order], dst[order])
  # pylint: disable=protected-access
  fst = _fsa._minimize(pywrapfst.Fst.read_from_string(data), has_epsilons=False)
  edges = byte_edges.tolist()
  if len(dfa.token_arcs) or len(dfa.markers):
    edges += range(_nfa.TOKEN_CLASS_BASE + 1, _nfa.FRAGMENT_BASE + len(dfa.markers) + 1)
  return _fsa._export_fast(fst, edges, tuple(dfa.markers))


def _byte_arcs(transitions: np.ndarray, first: np.ndarray, ids: np.ndarray):
  """(source, label, target) int64 of the byte arcs of `transitions` (rows for the
  states `ids`), one per byte class (first bytes `first`, label = class + 1)."""
  table = transitions[:, first]
  row, klass = np.nonzero(table != NO_STATE)
  return ids[row], klass + 1, table[row, klass].astype(np.int64)
