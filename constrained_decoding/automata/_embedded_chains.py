r"""Counted chains inside larger constraints: a string property with `maxLength`, ...

`_counting.py` compiles a constraint that *is* one counted chain (`P X{n,m} S` with P
and S plain bytes). Here any number of chains sit anywhere in a constraint (string
values with `maxLength` inside an object, the parts of an e-mail address, bounded runs
inside a pattern), and the rest of the constraint composes as usual (wide-state loops,
spliced schema-free JSON fragments):

1. `extract` replaces each eligible `Repeat(X, n, m)` of the IR (the shape
   `_counting.find_chain` accepts) by an `ir.Fragment` whose body is the *compressed*
   repeat `X{n', m'}` (`_counting._compressed`: every bound past ~2L, L the longest
   token, shares one shape), so the byte DFA stays small whatever m is. An `ir.Graph`
   that is one path ending in a run of one label (`_path_repeat`: a `propertyNames`
   pattern `^[a-z][a-z0-9_]{0,31}$` intersected with JSON strings) is its head, then
   that run as a repeat. A character of K right before `X{n,m}` (an e-mail host name
   `[A-Za-z0-9](?:[A-Za-z0-9]|[-.][A-Za-z0-9]){0,31}`) joins the chain as its position 0
   (`_headed_chain`), so the state before it counts too instead of walking every token
   that starts in K (53,100 explicit edges per such state with Gemma 3).
2. `splice_chains` replaces each pseudo-byte arc s --F--> c of such a fragment by a copy
   of the compressed chain's byte DFA: s is its position 0 (s may read other bytes,
   none the chain reads), and every accepting copy state also continues like c (c
   must read no byte the chain's start reads, so that a token wholly in the chain's
   class K never leaves it).
3. `compile_tables` composes: outer states as `_compose` does (wide-state terminals,
   spliced fragments' given edges), chain states by walking only the sub-trie of the
   tokens not wholly in K, plus *counting* terminals for the tokens wholly in K, as in
   `_counting.py`. This gives a compressed token DFA, packed as usual; then the real
   chains are laid out position by position (one block of (m + 1) * stride states per
   copy), each real state sharing the group, mask row and terminal row of its
   compressed state. Edges inside a copy that move forward become relative; all others
   are absolute: a target inside a chain reached from elsewhere is always within one
   token of the chain's start, where positions are not compressed (`f[i] = i`).

Slotted chains (`_slotted_chains.py`: a small pattern with `maxLength`, lowered to an
`ir.Graph` numbered layer by layer) go the same way: `extract` makes each recognized
graph a fragment whose chain is laid out in full (`compressed_of` the identity, `stride`
its slots and the states inside a character: UTF-8, escapes), and their counting
entries (one terminal per slot pair and per way of finishing an escape, filtered to the
counts that land on live cells) are added once liveness is known.

Exact, like `_counting.py`: every tokenization is kept and a token may cross a chain's
start or end. Returns None (plain composition applies) when a chain's arc cannot be
spliced or a compressed position shared by several real ones would need an absolute
target.

Public names:
  extract(node, span)   -> (node with chain fragments, {fragment name: EmbeddedChain}).
  compile_tables(...)   -> (ConstraintTables, stats dict) or None.
"""

import collections.abc
import dataclasses
import itertools

import numpy as np

from constrained_decoding import _arrays
from constrained_decoding import _packing
from constrained_decoding import tables as _tables
from constrained_decoding.automata import _compose
from constrained_decoding.automata import _counting
from constrained_decoding.automata import _registers
from constrained_decoding.automata import _slotted_chains
from constrained_decoding.automata import _slotted_counting
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.errors import CompileBudgetError

_NAME_PREFIX = "counted-chain/"


@dataclasses.dataclass(frozen=True, eq=False)
class EmbeddedChain:
  """One distinct chain `X{n,m}` of a constraint, with its compressed byte DFA.

  Attributes:
    chain: The chain (`prefix` and `suffix` empty).
    n2, m2: The compressed bounds.
    compressed_of: int64 `[m + 1]`: the compressed position of each real position (for
      an unbounded chain `X{n,}`, `[n + 1 + 2 span]`: its strip too, see `_counting.py`).
    dfa: Byte DFA of the compressed repeat `X{n', m'}`.
    cell: int64 `[m' + 1, stride]`: `dfa` state at each compressed position and slot
      (slot 0: between two X; slot k > 0: inside one X), -1 where there is none.
    stride: Slots per position.
    inner: `body` states of the slots 1.. (inside an X).
    body: Byte DFA of X.
    slotted: For a slotted chain (`_slotted_chains.py`: a layered `ir.Graph`, laid out
      in full, `compressed_of` the identity), its slots; None for `X{n,m}`. Then
      `body` is None and `inner` empty.
  """

  chain: _counting.Chain
  n2: int
  m2: int
  compressed_of: np.ndarray
  dfa: ByteDfa
  cell: np.ndarray
  stride: int
  inner: list
  body: ByteDfa | None
  slotted: _slotted_chains.Slotted | None = None


def extract(node: ir.Node, span: int) -> tuple[ir.Node, dict[str, EmbeddedChain]]:
  """`node` with each eligible bounded repeat replaced by a chain fragment, and the chains
  by fragment name (empty when there is none: then `node` is returned unchanged).

  `span` is above the longest token in bytes (`_counting.compile_chain`'s).
  """
  chains: dict[str, EmbeddedChain] = {}
  names: dict[tuple, str] = {}
  rejected: set = set()

  def named(key, build) -> str | None:
    # The fragment name of the chain `build()` makes for `key`, built once; None (and
    # remembered) where there is no chain.
    if key in rejected:
      return None
    name = names.get(key)
    if name is None:
      embedded = build()
      if embedded is None:
        rejected.add(key)
        return None
      name = names[key] = f"{_NAME_PREFIX}{len(names)}"
      chains[name] = embedded
    return name

  def chain_fragment(repeat: ir.Repeat) -> ir.Node | None:
    name = named((repeat.node, repeat.min, repeat.max),
                 lambda: _embedded_chain(repeat, span))
    if name is None:
      return None
    embedded = chains[name]
    return ir.Fragment(name, ir.repeat(repeat.node, embedded.n2,
                                       None if embedded.chain.max is None else embedded.m2))

  def slotted_fragment(graph: ir.Graph) -> ir.Node | None:
    # Cheap checks first: hashing a graph hashes its labels' whole subtrees, and the
    # IR of a big schema holds thousands of graphs that are no chain (key exclusions).
    if not _slotted_chains.may_be_slotted(graph) or graph in rejected:
      return None
    name = names.get(graph)
    if name is None:
      slotted = _slotted_chains.find_slotted(graph)
      if slotted is None:
        rejected.add(graph)
        return None
      dfa, cell = _slotted_chains.chain_dfa(slotted)
      layers = slotted.length + 1
      name = names[graph] = f"{_NAME_PREFIX}{len(names)}"
      chains[name] = EmbeddedChain(
          chain=_counting.Chain(prefix=b"", body=graph, char_class=slotted.char_class,
                                min=0, max=slotted.length, suffix=b""),
          n2=0, m2=slotted.length, compressed_of=np.arange(layers), dfa=dfa, cell=cell,
          stride=slotted.stride, inner=[], body=None, slotted=slotted)
    return ir.Fragment(name, graph)

  def headed_fragment(parts: tuple, k: int) -> ir.Node | None:
    # `K X{n,m}` with X's class K (ASCII): one chain of n + 1..m + 1 positions whose
    # first reads only K, so the state before K counts too (the `@` of an e-mail
    # address, before `[A-Za-z0-9](?:[A-Za-z0-9]|[-.][A-Za-z0-9]){0,31}`).
    head, repeat = parts[k], parts[k + 1]
    name = named(("headed", repeat.node, repeat.min, repeat.max, head),
                 lambda: _headed_chain(head, repeat, span))
    if name is None:
      return None
    embedded = chains[name]
    return ir.Fragment(name, ir.concat(head, ir.repeat(
        repeat.node, embedded.n2 - 1, None if embedded.chain.max is None else embedded.m2 - 1)))

  def concat_with_head(n: ir.Concat) -> ir.Node | None:
    parts = n.parts
    for k in range(len(parts) - 1):
      if (isinstance(parts[k], ir.CharClass) and isinstance(parts[k + 1], ir.Repeat)
          and parts[k + 1].max is not None and parts[k].ranges
          and parts[k].ranges[-1][1] < 0x80):
        fragment = headed_fragment(parts, k)
        if fragment is not None:
          rest = [ir.transform(p, before=chain_or_descend) for p in parts[:k] + parts[k + 2:]]
          return ir.concat(*rest[:k], fragment, *rest[k:])
    return None

  def path_fragment(graph: ir.Graph) -> ir.Node | None:
    # A path graph ending in a bounded run of one class (a `propertyNames` pattern such
    # as `^[a-z][a-z0-9_]{0,31}$`, intersected with JSON strings): its head, then the run
    # as a chain.
    split = _path_repeat(graph)
    if split is None:
      return None
    head, run = split
    fragment = chain_fragment(run)
    return None if fragment is None else ir.concat(*head, fragment)

  def chain_or_descend(n: ir.Node) -> ir.Node | None:
    # Top-down: a repeat is judged as written, before anything inside it is replaced.
    # Bytes, classes, terminals, rule references and (schema-free) fragments stay as they are.
    if isinstance(n, ir.Repeat) and (n.max is not None or n.min >= _counting.MIN_COUNT_WIDE):
      return chain_fragment(n)
    if isinstance(n, ir.Concat):
      return concat_with_head(n)
    if isinstance(n, ir.Graph):
      found = slotted_fragment(n)
      return found if found is not None else path_fragment(n)
    return None

  if not _any_node(node, chain_or_descend, (ir.Repeat, ir.Concat, ir.Graph)):
    return node, {}  # Most constraints hold no chain: no rewrite (~2x the search).
  out = ir.transform(node, before=chain_or_descend)
  return (out, chains) if chains else (node, {})


def _headed_chain(head: ir.CharClass, repeat: ir.Repeat, span: int) -> EmbeddedChain | None:
  """The chain `head X{n,m}` (`head` X's class K, ASCII), laid out as `X{n+1,m+1}` whose
  position 0 reads only K: X at position 0 is K, as K never starts X's other
  alternatives (`_counting.find_chain`). None when `repeat` is no chain over `head`."""
  chain = _counting.find_chain(repeat)
  if chain is None or chain.char_class != head or chain.max is None:
    return None
  chain = dataclasses.replace(chain, min=chain.min + 1, max=chain.max + 1)
  n2, m2, compressed_of = _counting._compressed(chain.min, chain.max, span)  # pylint: disable=protected-access
  layout = _counting.compressed_dfa(chain, n2, m2)
  if layout is None:
    return None
  dfa, cell, stride, inner, body = layout
  first = int(cell[0, 0])
  if first != dfa.start:
    return None
  transitions = dfa.transitions.copy()
  transitions[first, ~_counting._lead_bytes(head)] = NO_STATE  # pylint: disable=protected-access
  dfa = dataclasses.replace(dfa, transitions=transitions)
  return EmbeddedChain(chain=chain, n2=n2, m2=m2, compressed_of=compressed_of, dfa=dfa,
                       cell=np.where(cell >= 0, cell, -1), stride=stride, inner=inner,
                       body=body)


def _path_repeat(graph: ir.Graph) -> tuple[list[ir.Node], ir.Repeat] | None:
  """(head labels, Repeat(K, a, b)) when `graph` is one path from state 0 whose last b
  arcs all read the same label K and whose finals are exactly the last b - a + 1 states
  (its language is then `head K{a,b}`); None otherwise (or when b is below
  `_counting.MIN_COUNT_WIDE`, where no chain is counted)."""
  n, arcs = graph.num_states, graph.arcs
  if len(arcs) != n - 1 or n - 1 < _counting.MIN_COUNT_WIDE or not graph.finals:
    return None
  out = {}
  for a, label, b in arcs:
    if a in out:
      return None
    out[a] = (label, b)
  labels, state, seen = [], 0, {0}
  while state in out:
    label, state = out[state]
    if state in seen:
      return None
    seen.add(state)
    labels.append((label, state))
  if len(seen) != n:
    return None
  order = [0] + [b for _, b in labels]  # States along the path.
  run = labels[-1][0]
  j0 = len(labels)
  while j0 > 0 and labels[j0 - 1][0] == run:
    j0 -= 1
  position = {q: j for j, q in enumerate(order)}
  finals = sorted(position[q] for q in graph.finals)
  if finals[0] < j0 or finals != list(range(finals[0], n)):
    return None
  b = n - 1 - j0
  if b < _counting.MIN_COUNT_WIDE:
    return None
  return [label for label, _ in labels[:j0]], ir.Repeat(run, finals[0] - j0, b)


def _any_node(node: ir.Node, found, kinds: tuple | None = None) -> bool:
  """Whether `found(n)` is not None for some sub-node n that `ir.transform(node,
  before=found)` visits (found ones are not entered, nor are fragments), in the same
  top-down order, stopping at the first.

  `kinds` (optional): the node types `found` can hit; it is not called on others, and
  leaves of other types are skipped (a schema's IR is mostly leaves and unions: ~40k
  nodes a corpus pass)."""
  skip = (frozenset() if kinds is None
          else frozenset(t for t in _LEAF_TYPES if not issubclass(t, kinds)))
  plan: dict[type, tuple] = {}  # node type -> (ask `found`?, children getter or None)
  seen, stack = set(), [node]
  pop, push, see = stack.pop, stack.extend, seen.add
  while stack:
    n = pop()
    kind = type(n)
    if kind in skip:
      continue
    key = id(n)
    if key in seen:
      continue
    see(key)
    ask, get = plan.get(kind) or plan.setdefault(kind, _plan(kind, kinds))
    if ask and found(n) is not None:
      return True
    if get is not None:
      push(reversed(get(n)))
  return False


def _plan(kind: type, kinds: tuple | None) -> tuple:
  """`_any_node`'s handling of nodes of type `kind`: whether `found` is asked about
  them, and how their children are read (None: not entered, a fragment)."""
  if issubclass(kind, ir.Fragment):
    get = None
  else:
    get = ir._CHILDREN.get(kind, ir.children)  # pylint: disable=protected-access
  return kinds is None or issubclass(kind, kinds), get


# IR node types without children (`ir.children` is empty).
_LEAF_TYPES = (ir.Bytes, ir.CharClass, ir.ByteClass, ir.Terminal, ir.RuleRef, ir.Marker)


def _embedded_chain(repeat: ir.Repeat, span: int) -> EmbeddedChain | None:
  chain = _counting.find_chain(repeat)
  if chain is None:
    return None
  unbounded = chain.max is None
  n2, m2, compressed_of = _counting._compressed(  # pylint: disable=protected-access
      chain.min, chain.min if unbounded else chain.max, span)
  layout = _counting.compressed_dfa(chain, n2, m2)
  if unbounded:  # The strip after the last position behaves as it (`_counting.py`).
    compressed_of = np.concatenate([compressed_of, np.full(2 * span, m2, np.int64)])
  if layout is None:
    return None
  dfa, cell, stride, inner, body = layout
  return EmbeddedChain(chain=chain, n2=n2, m2=m2, compressed_of=compressed_of, dfa=dfa,
                       cell=np.where(cell >= 0, cell, -1), stride=stride, inner=inner,
                       body=body)


@dataclasses.dataclass(frozen=True, eq=False)
class _Copy:
  """A spliced copy of a chain: `cell` in the spliced DFA's numbering."""

  chain: EmbeddedChain
  cell: np.ndarray


def splice_chains(dfa: ByteDfa, chains: dict[str, EmbeddedChain], arc_ops: dict | None = None
                  ) -> tuple[ByteDfa, list[_Copy], dict | None] | None:
  """`dfa` with every chain fragment arc replaced by a copy of its chain (see the module
  doc), the other fragment arcs kept, and `arc_ops` (register operations of `dfa`'s byte
  arcs, `_registers.contract`) for the spliced DFA; None when some arc cannot be spliced.

  State numbers of `dfa` are kept (copies are appended); a continuation c that only the
  arc led to stays, unreachable (composition trims it). A copy's accepting states read
  c's bytes with c's operations.
  """
  fragments = list(dfa.fragments)
  is_chain = np.array([f.name in chains for f in fragments] + [False], bool)
  arcs = dfa.fragment_arcs
  mine = is_chain[arcs[:, 1]] if len(arcs) else np.zeros(0, bool)
  chain_arcs, other_arcs = arcs[mine], arcs[~mine]
  trans = dfa.transitions
  sources = chain_arcs[:, 0]
  special = np.concatenate([arcs[:, 0], dfa.token_arcs[:, 0]])
  if (len(np.unique(sources)) != len(sources) or np.isin(sources, other_arcs[:, 0]).any()
      or np.isin(sources, dfa.token_arcs[:, 0]).any() or np.isin(chain_arcs[:, 2], special).any()):
    return None
  q = dfa.num_states
  sizes = [chains[fragments[k].name].dfa.num_states - 1 for k in chain_arcs[:, 1].tolist()]
  total = q + sum(sizes)
  new_trans = np.full((total, 256), NO_STATE, np.int32)
  new_trans[:q] = trans
  accepting = np.zeros(total, bool)
  accepting[:q] = dfa.accepting
  copies = []
  offset = q
  ops = None if arc_ops is None else dict(arc_ops)
  ops_of: dict[int, list] = {}
  for (state, byte), crossed in (arc_ops or {}).items():
    ops_of.setdefault(state, []).append((byte, crossed))
  for (s, k, c), size in zip(chain_arcs.tolist(), sizes):
    embedded = chains[fragments[k].name]
    cdfa = embedded.dfa
    phi = np.full(cdfa.num_states, -1, np.int64)
    phi[cdfa.start] = s
    rest = np.flatnonzero(np.arange(cdfa.num_states) != cdfa.start)
    phi[rest] = np.arange(offset, offset + size)
    offset += size
    lookup = np.concatenate([[NO_STATE], phi]).astype(np.int32)
    new_trans[phi[rest]] = lookup[cdfa.transitions[rest] + 1]
    start_row = lookup[cdfa.transitions[cdfa.start] + 1]
    reads = start_row != NO_STATE
    if (new_trans[s][reads] != NO_STATE).any() or (trans[c][reads] != NO_STATE).any():
      return None  # s or c reads a byte the chain's start reads.
    if embedded.slotted is not None:
      # A token wholly in K counts from the chain's start and never leaves it: s and c
      # read no first byte of a character of K (the start slot may read fewer than K).
      klass = _counting._lead_bytes(embedded.chain.char_class)  # pylint: disable=protected-access
      if (new_trans[s][klass] != NO_STATE).any() or (trans[c][klass] != NO_STATE).any():
        return None
    new_trans[s][reads] = start_row[reads]
    finals = phi[np.flatnonzero(cdfa.accepting)]
    follow = np.flatnonzero(trans[c] != NO_STATE)
    if (new_trans[np.ix_(finals, follow)] != NO_STATE).any():
      return None
    new_trans[np.ix_(finals, follow)] = trans[c, follow]
    accepting[finals] |= dfa.accepting[c]
    for byte, crossed in ops_of.get(c, ()):
      for f in finals.tolist():
        ops[(f, byte)] = crossed
    copies.append(_Copy(embedded, np.where(embedded.cell >= 0, phi[embedded.cell], -1)))
  class_edges = [np.arange(257) if d.class_edges is None else d.class_edges
                 for d in [dfa] + [chains[f.name].dfa for f in fragments if f.name in chains]]
  # Keep the other fragments, renumbered densely.
  keep = [k for k, f in enumerate(fragments) if f.name not in chains]
  index = np.full(len(fragments), -1, np.int32)
  index[keep] = np.arange(len(keep))
  other_arcs = other_arcs.copy()
  other_arcs[:, 1] = index[other_arcs[:, 1]]
  spliced = ByteDfa(transitions=new_trans, accepting=accepting, start=dfa.start,
                    token_arcs=dfa.token_arcs, class_edges=np.unique(np.concatenate(class_edges)),
                    fragment_arcs=other_arcs, fragments=tuple(fragments[k] for k in keep))
  return spliced, copies, ops


def compile_tables(dfa: ByteDfa, copies: list[_Copy], given: _compose.GivenEdges | None,
                   wide: dict, trie, vocab, *, token_class_bits, min_bucket: int,
                   max_edges: int, max_table_bytes: int, deadline: float, what: str,
                   cache_dir: str | None = None, contracted=None):
  """Tables for the spliced `dfa` whose chain `copies` count (see the module doc), or None
  when plain composition must do it. Returns (tables, stats) with `CompileInfo`'s sizes.

  `given`: the spliced schema-free fragments' edges (`_splice.splice`), or None; `wide`:
  the wide states found with chain and fragment states skipped; `cache_dir`: where the
  per-class token counts are kept (None: in memory only); `contracted`: the
  `_registers.Contracted` of `dfa` when it has register operations (objects whose keys,
  arrays whose items, the device checks), or None. Guards go on the compressed token
  DFA's explicit edges, so every real state sharing a compressed one shares them (a
  chain's positions only count characters of its class: no operation inside).

  Raises:
    CompileBudgetError: Explicit edges beyond `max_edges`, time past `deadline`, or the
      real chains' states alone beyond `max_table_bytes`.
  """
  q = dfa.num_states
  w = _tables.num_words(vocab.vocab_size)
  budget = dict(max_edges=max_edges, deadline=deadline, what=what)
  copy_of = np.full(q, -1, np.int64)
  pos = np.full(q, -1, np.int64)
  slot = np.full(q, -1, np.int64)
  for k, copy in enumerate(copies):
    js, ks = np.nonzero(copy.cell >= 0)
    states = copy.cell[js, ks]
    copy_of[states], pos[states], slot[states] = k, js, ks
  in_chain = copy_of >= 0
  # Chain states walk the tokens not wholly in their class K (the others count).
  classes: dict = {}
  for k, copy in enumerate(copies):
    classes.setdefault(copy.chain.chain.char_class, []).append(k)
  counts_of, parts = {}, []
  for klass, members in classes.items():
    counts = counts_of[klass] = _counting._class_counts(vocab, klass, cache_dir)  # pylint: disable=protected-access
    states = np.flatnonzero(np.isin(copy_of, members))
    readable = (dfa.transitions[states] != NO_STATE).any(axis=0)
    subtrie = _counting._chain_subtrie(counts, readable, trie)  # pylint: disable=protected-access
    if len(subtrie.token_ids):
      parts += _compose._walk(dfa, subtrie, states, **budget)  # pylint: disable=protected-access
  empty = np.zeros(0, np.int32)
  if given is not None:
    parts.append(given.edges)
  edges = _compose._concatenate_columns(parts) if parts else (empty,) * 3  # pylint: disable=protected-access
  all_given = _compose.GivenEdges(
      in_chain | (given.states if given is not None else False), edges,
      given.terminals if given is not None else {},
      given.frontier if given is not None else (empty,) * 3)
  src, tok, dst = _compose.token_edges(dfa, trie, wide=wide, given=all_given, **budget)
  terminal_edges = _compose._terminal_edges(dfa, wide, token_class_bits, w)  # pylint: disable=protected-access
  terminal_edges.update(all_given.terminals)
  counting = _counting.CountingTerminals(w)
  entries_of: dict[int, list] = {}
  moves: list[tuple[np.ndarray, np.ndarray]] = []  # Chains' and slotted chains' moves.
  for copy in copies:
    e = copy.chain
    if e.slotted is not None:
      # Entries once liveness is known (below); the moves of every present cell now.
      _slotted_counting.add_slotted(counting, e.slotted, copy.cell,
                                    counts_of[e.chain.char_class], vocab,
                                    copy.cell >= 0, None, moves)
    elif not counting.add_chain(e.chain, copy.cell, e.m2, e.stride, e.inner, e.body,
                                counts_of[e.chain.char_class], vocab, entries_of, moves):
      return None
  downs = {k: counting.strip_down(cp.chain.chain, cp.chain.stride,
                                  counts_of[cp.chain.chain.char_class])
           for k, cp in enumerate(copies) if cp.chain.chain.max is None}
  term_src = [s for s, listed in terminal_edges.items() for _ in listed]
  term_dst = [t for listed in terminal_edges.values() for _, t in listed]
  live = _compose._live_states(  # pylint: disable=protected-access
      q, np.concatenate([src, np.array(term_src, np.int32)] + [a for a, _ in moves],
                        dtype=np.int32),
      np.concatenate([dst, np.array(term_dst, np.int32)] + [b for _, b in moves],
                     dtype=np.int32),
      dfa.start, dfa.accepting)
  if not live[dfa.start]:
    return None  # Let plain composition report the empty constraint.
  for copy in copies:  # Slotted chains allow only tokens that land on live cells.
    e = copy.chain
    if e.slotted is not None:
      usable = (copy.cell >= 0) & live[np.maximum(copy.cell, 0)]
      _slotted_counting.add_slotted(counting, e.slotted, copy.cell,
                                    counts_of[e.chain.char_class], vocab, usable,
                                    entries_of, [])
  live_states = np.flatnonzero(live)
  order = np.concatenate([[dfa.start], live_states[live_states != dfa.start]])
  new_id = np.full(q, -1, np.int64)
  new_id[order] = np.arange(len(order))
  c = len(order)
  state_terminals, terminal_bits = _compose._pack_terminals(  # pylint: disable=protected-access
      terminal_edges, new_id.tolist(), c, w)
  # (int32 gathers are `take`s: indexing by int32 arrays is 1.5-4x slower, numpy 2.4.)
  keep = (live.take(src) & live.take(dst)).nonzero()[0]
  new_id32 = new_id.astype(np.int32)
  e_src, e_tok, e_dst = _compose._sorted_edges(  # pylint: disable=protected-access
      new_id32.take(src.take(keep)), tok.take(keep), new_id32.take(dst.take(keep)), c,
      _compose._views(trie).token_span)  # pylint: disable=protected-access
  token_dfa = _compose.TokenDfa(num_states=c, accepting=dfa.accepting[order].astype(bool),
                                edge_source=e_src, edge_token=e_tok, edge_target=e_dst,
                                terminal_bits=terminal_bits, state_terminals=state_terminals)
  guards = None
  if contracted is not None:
    guards = _registers.attach(token_dfa, order, contracted, vocab.token_bytes)
  packed = _packing.pack_tables(token_dfa, vocab, min_bucket=min_bucket, guards=guards)
  return _expand(packed, token_dfa, copies, order, new_id, copy_of, pos, slot, counting,
                 entries_of, downs, vocab, min_bucket=min_bucket,
                 max_table_bytes=max_table_bytes, what=what, byte_states=q)


def _expand(packed, token_dfa, copies: list[_Copy], order, new_id, copy_of, pos, slot,
            counting: _counting.CountingTerminals, entries_of: dict, downs: dict, vocab, *,
            min_bucket: int, max_table_bytes: int, what: str, byte_states: int):
  """The real tables: compressed `packed` with each copy's chain laid out in full.

  `downs`: copy index -> the terminal entry of its strip's upper half, for the copies of
  unbounded chains (`_counting.CountingTerminals.strip_down`)."""
  c = token_dfa.num_states
  t_copy, t_pos, t_slot = copy_of[order], pos[order], slot[order]
  outer = t_copy < 0
  n_outer = int(outer.sum())
  lengths = [(len(cp.chain.compressed_of)) * cp.chain.stride for cp in copies]
  bases = np.concatenate([[n_outer], n_outer + np.cumsum(lengths)]).astype(np.int64)
  num_states = int(bases[-1])
  s_pad = _tables.bucket_size(num_states, min_bucket)
  if 9 * s_pad > max_table_bytes:  # group, terminal row and accepting per state
    raise CompileBudgetError(
        f"{what} needs {num_states} states ({9 * s_pad / 2**20:.1f} MiB for them alone). "
        f"Expected at most CompileOptions.max_table_bytes={max_table_bytes}. Lower the "
        "repetition bounds (maxLength, {n,m}) or raise the budget.")
  comp = np.full(num_states, -1, np.int64)  # real state -> compressed token state
  comp[:n_outer] = np.flatnonzero(outer)
  real_abs = np.full(c, -1, np.int64)       # compressed token state -> its one real state
  real_abs[outer] = np.arange(n_outer)
  strides = np.array([cp.chain.stride for cp in copies] + [0], np.int64)
  for k, cp in enumerate(copies):
    f = cp.chain.compressed_of
    byte_cells = cp.cell[f]
    unbounded = cp.chain.chain.max is None
    if unbounded:  # The strip: slot 0 of the last position, which stays one real position.
      byte_cells[cp.chain.chain.min + 1:, 1:] = -1
    comp[bases[k]:bases[k + 1]] = np.where(byte_cells >= 0, new_id[np.maximum(byte_cells, 0)],
                                           -1).reshape(-1)
    uses = np.bincount(f, minlength=cp.cell.shape[0])
    single = np.full(cp.cell.shape[0], -1, np.int64)
    once = uses[f] == 1
    single[f[once]] = np.flatnonzero(once)
    if unbounded:
      single[cp.chain.m2] = cp.chain.chain.min
    mine = np.flatnonzero(t_copy == k)
    i = single[t_pos[mine]]
    real_abs[mine] = np.where(i >= 0, bases[k] + i * cp.chain.stride + t_slot[mine], -1)
  # Explicit edges: forward moves inside one copy relative, the others absolute. An
  # absolute target is right for every real state sharing the source's compressed one:
  # leaving a chain does not depend on the position left, and a target inside a chain
  # reached from outside it is within one token of its start, a position of its own.
  # (A token that leaves a copy and re-enters it from a shared, middle position lands
  # before that position: a negative offset, so absolute.)
  e = len(token_dfa.edge_token)
  # Only edges leaving a chain state may be relative: computed on them alone (a schema's
  # edges are mostly outside its chains, up to millions; they are sorted by source).
  sources = token_dfa.edge_source
  chain_states = np.flatnonzero(t_copy >= 0).astype(sources.dtype)
  lo = np.searchsorted(sources, chain_states, "left")
  hi = np.searchsorted(sources, chain_states, "right")
  inside = _spans(lo, hi)
  # Each state's place in its copy: an offset within one copy is the places' difference
  # (only those are relative; across copies the offset is not used).
  place = t_pos * strides[t_copy] + t_slot
  d_ = token_dfa.edge_target[inside]
  offset = place[d_] - np.repeat(place[chain_states], hi - lo)
  # Moves within an unbounded chain's last position are absolute: the strip shares its
  # edges, and has no inner slots of its own.
  last = np.array([cp.chain.m2 if cp.chain.chain.max is None else -2 for cp in copies] + [-2])
  at_last = (t_copy >= 0) & (t_pos == last[t_copy])
  relative = ((t_copy[d_] == np.repeat(t_copy[chain_states], hi - lo)) & (offset >= 0)
              & ~(np.repeat(at_last[chain_states], hi - lo) & at_last[d_]))
  edge_targets = np.array(packed.edge_targets)
  np.take(real_abs.astype(edge_targets.dtype), token_dfa.edge_target, out=edge_targets[:e],
          mode="clip")  # (Targets are states: in range. "clip" writes without a buffer.)
  moved = inside[relative]
  # Every other edge needs its target's one real state.
  unplaced = np.flatnonzero(edge_targets[:e] < 0)
  if len(unplaced) and not np.isin(unplaced, moved, assume_unique=True).all():
    return None
  edge_targets[moved] = _tables.RELATIVE - offset[relative]
  # Terminal rows: the compressed state's own (targets made real), then its counting
  # entries; one empty row last for dead and padding states.
  nt = token_dfa.terminal_bits.shape[0]
  own = np.asarray(packed.state_terminals)[:c]
  # (Few new objects per state: a compile's full garbage collections cost ~0.1 s each.)
  listed = list(map(entries_of.get, order.tolist(), itertools.repeat(())))
  sizes = np.fromiter(map(len, listed), np.int64, len(listed))
  width = max(own.shape[1], int(sizes.max(initial=0)))
  rows = np.full((c + 1 + len(downs), width, 2), _tables.NO_STATE, np.int32)
  rows[:c, :own.shape[1]] = own
  has = own[:, :, 0] >= 0
  targets = real_abs[np.maximum(own[:, :, 1], 0)]
  if (has & (targets < 0)).any():
    return None
  rows[:c, :own.shape[1], 1] = np.where(has, targets, _tables.NO_STATE)
  if sizes.any():  # Each state's entries after its own terminals.
    flat = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(listed)),
                       np.int64, 2 * int(sizes.sum()))
    t, filt = flat[0::2], flat[1::2]
    at = np.repeat(np.arange(c), sizes)
    r = has.sum(axis=1)[at] + np.arange(len(at)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    rows[at, r, 0] = t + nt
    rows[at, r, 1] = np.where(filt >= 0, filt + nt, filt)  # A bound stays.
  for j, (t, _) in enumerate(downs.values()):
    rows[c + 1 + j, 0] = (t + nt, -1)
  total_t = nt + len(counting.bitmaps)
  t_pad = _tables.bucket_size(total_t, 1)
  terminal_bits = np.zeros((t_pad, token_dfa.terminal_bits.shape[1]), np.uint32)
  terminal_bits[:nt] = token_dfa.terminal_bits
  for j, bits in enumerate(counting.bitmaps, start=nt):  # (Row by row: no stacked copy.)
    terminal_bits[j] = bits
  terminal_counts = np.full((t_pad, 3), _tables.NO_STATE, np.int32)
  if counting.counts:
    terminal_counts[nt:total_t] = counting.counts
  live = comp >= 0
  state_groups = np.full((s_pad, 1), _tables.NO_STATE, np.int32)
  state_groups[:num_states, 0] = np.where(live, comp, _tables.NO_STATE)
  accepting = np.zeros(s_pad, bool)
  accepting[:num_states] = live & token_dfa.accepting[np.maximum(comp, 0)]
  state_terminal_rows = np.full(s_pad, c, np.int32)
  state_terminal_rows[:num_states] = np.where(live, comp, c)
  for j, k in enumerate(downs):  # The upper half of each strip moves back.
    cp = copies[k].chain
    n, span = cp.chain.min, (len(cp.compressed_of) - cp.chain.min - 1) // 2
    state_terminal_rows[bases[k] + (n + 1 + span + np.arange(span)) * cp.stride] = c + 1 + j
  start = int(real_abs[0])
  if start < 0:
    return None
  # Far from the chains' ends the entry lists repeat (relative targets): stored once.
  distinct, row_of = _arrays.unique_rows(rows.reshape(len(rows), -1), return_inverse=True)
  rows = np.full((_tables.bucket_size(len(distinct), min_bucket),) + rows.shape[1:],
                 _tables.NO_STATE, np.int32)
  rows[:len(distinct)] = distinct.reshape((-1,) + rows.shape[1:])
  state_terminal_rows = row_of.reshape(-1)[state_terminal_rows].astype(np.int32)
  # Mask rows: each compressed state's counting entries ORed into its row (the device
  # gathers the row alone). States with equal terminal rows have equal entries (an
  # entry's terminal is past nt, an own one before): fold visits one of each.
  group_mask = np.array(packed.group_mask)
  folded = counting.fold(np.asarray(packed.mask_bits), group_mask[:c],
                         _Tuples(listed), min_bucket,
                         entry_ids=row_of.reshape(-1)[:c].astype(np.int64))
  mask_bits, group_mask[:c] = folded.mask_bits, folded.group_mask
  # Rows removed near the chains' ends (`tables.py`); groups past c remove none.
  excluded = {}
  if len(folded.group_excluded):
    excluded = dict(excluded_bits=folded.excluded_bits, group_excluded=_packing._padded(  # pylint: disable=protected-access
        folded.group_excluded, len(group_mask), 0))
  groups = {}
  if (not packed.has_registers and not np.shape(packed.group_pops)[1]
      and not np.size(packed.capped_rows)):
    shared = _packing.share_groups(np.asarray(packed.edge_start), np.asarray(packed.edge_tokens),
                                   edge_targets, group_mask, c, min_bucket,
                                   group_excluded=excluded.get("group_excluded"))
    if shared is not None:
      group_of, groups = shared
      state_groups[:num_states, 0] = np.where(live, group_of[np.maximum(comp, 0)],
                                              _tables.NO_STATE)
  num_masks = int(group_mask[:c].max(initial=0)) + 1
  groups = dict(dict(group_mask=group_mask, edge_targets=edge_targets, **excluded), **groups)
  tables = dataclasses.replace(
      packed, start=np.array([start], np.int32), accepting=accepting,
      mask_bits=mask_bits, state_groups=state_groups, terminal_bits=terminal_bits,
      state_terminals=rows, state_terminal_rows=state_terminal_rows,
      terminal_counts=terminal_counts,
      token_counts=np.stack(counting.class_counts).astype(np.int8), **groups)
  stats = dict(byte_states=byte_states, token_states=num_states, token_edges=e,
               num_terminals=total_t, num_masks=num_masks)
  return tables, stats


def _spans(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
  """int64: the indices `lo[k]:hi[k]` of each k, concatenated."""
  lo, hi = lo.astype(np.int64), hi.astype(np.int64)
  n = hi - lo
  return np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))


class _Tuples(collections.abc.Sequence):
  """`lists[k]` as a tuple, made when read (`fold` reads one state of each distinct entry
  list)."""

  def __init__(self, lists: list):
    self._lists = lists

  def __len__(self) -> int:
    return len(self._lists)

  def __getitem__(self, k: int) -> tuple:
    return tuple(self._lists[k])
