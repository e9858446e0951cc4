"""Register operations on token edges: objects whose keys are checked on the device.

A JSON object that may list n declared keys in any order, each at most once, needs 2^n
automaton states if the automaton alone remembers the keys written (`_json_objects`).
Past a budget the front end instead writes a linear automaton with `ir.Marker`s:
`{` then `clear`, each declared key's closing quote then `set` of its bit, and before `}`
a `need` of the required keys' bits (`docs/any_order_objects.md`). The row keeps the
bits in a few int32 register words; this module turns the markers into guards and
operations on the token edges that cross them.

1. `contract(dfa)`: the byte DFA with its marker arcs folded into the byte arcs that
   follow them. A marker arc q --m--> q' gives q the byte arcs of q' (and of what q'
   reaches by more markers), each tagged with the markers crossed; the bytes must not
   collide with q's own (then the object keeps the subset or schema-order automaton,
   `RegisterError`). The result is a plain byte DFA for composition, plus the tags.
2. Liveness. A state whose every continuation crosses a `set` (inside a key of an object
   without additional properties: `"na` before `name` and `names`) is a dead end once
   those keys are written. `live_sets` finds, per state, whether some continuation
   crosses no `set` first (always live) or else which (word, bits) it could set.
3. `attach(token_dfa, ...)`: for every explicit token edge, the operations its bytes
   cross (walked in the contracted DFA from the edge's byte state), plus a liveness
   check of its target: a *guard*. Edges with guards are kept out of the mask rows; the
   device evaluates a state's guarded edges against the row's registers
   (`runtime/_runtime.py`) and applies the operations of the edge it takes.

A guard is a sequence of primitive operations (`kind`, word, operand), applied in order
to a copy of the row's registers:
  CLEAR   word := 0.
  SET     fails if any operand bit is set in word; word |= operand.
  NEED    fails unless every operand bit is set in word.
  LIVE    (after the others) the guard fails unless at least one LIVE op of the guard
          finds an operand bit clear in its word; a guard without LIVE ops needs none.
  COUNT   fails unless word < operand; word += 1 (arrays whose items are counted in a
          register: `,` before another item, `_json_array_schemas.counted_array`).
  ATLEAST fails unless word >= operand (`]` of such an array).
The front end places a COUNT only where an ATLEAST or untagged way on exists beside it
(`,` next to `]`, with minItems <= maxItems), so a full count is never a dead end.
Exact: a token is allowed iff its bytes are in the object language given the keys
written so far and it leaves the row where some continuation is still possible (under
the front end's construction, which never lets a `need` fail where keys may still be
added, see `live_sets`).
"""

import collections
import dataclasses

import numpy as np

from constrained_decoding.automata import _compose, _unique_strings
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.errors import CompileBudgetError
from constrained_decoding.tables import (GUARD_ATLEAST, GUARD_CLEAR, GUARD_COUNT, GUARD_LIVE,
                                         GUARD_NEED, GUARD_SET, GUARD_UCLOSE, apply_guard)
from constrained_decoding.vocab import _joined

CLEAR, SET, NEED, LIVE = GUARD_CLEAR, GUARD_SET, GUARD_NEED, GUARD_LIVE
COUNT, ATLEAST = GUARD_COUNT, GUARD_ATLEAST
UOPEN, UCLOSE = _unique_strings.UOPEN, GUARD_UCLOSE
_KIND = {"clear": CLEAR, "set": SET, "need": NEED, "count": COUNT, "atleast": ATLEAST,
         "uopen": UOPEN, "uclose": UCLOSE}
# Most primitive operations one guard may hold (its crossed markers plus LIVE words).
MAX_GUARD_OPS = 64


class RegisterError(CompileBudgetError):
  """The markers of an automaton cannot be folded into its byte arcs (see `contract`)."""

  def __init__(self, why: str):
    super().__init__(
        f"A constraint checked on the device in register words (an object's keys, an"
        f" array's or object's count, an array's distinct string items) cannot be"
        f" compiled: {why} Pass property_order='schema' to write objects' keys in schema"
        f" order, or lenient=('uniqueItems',) to let string items repeat.")


def has_markers(node: ir.Node) -> bool:
  """Whether the IR holds an `ir.Marker` (memoized by node identity, linear)."""
  return ir.fold(node, lambda n, children: isinstance(n, ir.Marker) or any(children))


@dataclasses.dataclass(frozen=True, eq=False)
class Contracted:
  """A byte DFA without marker arcs, and the operations its byte arcs carry.

  Attributes:
    dfa: The byte DFA (marker arcs folded into byte arcs).
    arc_ops: (state, byte) -> tuple of primitive ops `(kind, word, operand)` applied
      before reading the byte.
    num_words: Register words the operations use (1 + the largest word).
    source: The DFA `contract` folded (marker arcs kept), or None: what the compiler
      inlines fragments into when `_splice.splice` refuses (`_splice.inline`).
  """

  dfa: ByteDfa
  arc_ops: dict
  num_words: int
  source: ByteDfa | None = None


def _primitive(marker: ir.Marker) -> tuple[int, int, int]:
  return (_KIND[marker.kind], marker.word, marker.operand)


def contract(dfa: ByteDfa) -> Contracted:
  """Folds `dfa.marker_arcs` into byte arcs (module doc, step 1).

  Raises:
    RegisterError: A marker leads to an accepting state, a token-class or fragment arc,
      or to bytes its source state reads itself.
  """
  trans = dfa.transitions.copy()
  marker_out: dict[int, list] = {}
  for state, index, target in dfa.marker_arcs.tolist():
    marker_out.setdefault(state, []).append((_primitive(dfa.markers[index]), target))
  special = set(dfa.token_arcs[:, 0].tolist()) | set(dfa.fragment_arcs[:, 0].tolist())

  def reached(state: int, ops: tuple, seen: frozenset):
    """(byte, ops, target) of the byte arcs after the markers from `state`."""
    out = []
    for op, target in marker_out.get(state, ()):
      if target in seen:
        raise RegisterError("A cycle of register markers reads no byte.")
      if dfa.accepting[target] or target in special:
        raise RegisterError(
            "A register marker is followed by the end of the text or a token class.")
      row = dfa.transitions[target]
      for byte in np.flatnonzero(row != NO_STATE).tolist():
        out.append((byte, ops + (op,), int(row[byte])))
      out += reached(target, ops + (op,), seen | {target})
    return out

  arc_ops = {}
  for state in marker_out:
    for byte, ops, target in reached(state, (), frozenset({state})):
      if trans[state, byte] != NO_STATE:
        raise RegisterError(
            f"After a register marker the byte {bytes([byte])!r} is also read without it.")
      trans[state, byte] = target
      arc_ops[(state, byte)] = ops
  words = [word for ops in arc_ops.values() for _, word, _ in ops]
  plain = dataclasses.replace(dfa, transitions=trans, marker_arcs=np.zeros((0, 3), np.int32),
                              markers=())
  return Contracted(plain, arc_ops, 1 + max(words, default=-1), source=dfa)


def live_sets(contracted: Contracted) -> dict[int, tuple[tuple[int, int, int], ...]]:
  """The states that may be dead ends, each with the `LIVE` operations (one per word of
  the bits whose `set` it needs) that a token ending there must pass.

  A state is *free* when it is accepting, has a token-class or fragment arc, has an arc
  whose first operation is not a `set`, or reaches a free state by untagged arcs. Every
  other state (inside a key of an object without additional properties) can only go on
  through a `set`: it is live iff one of the (word, bit) it reaches by untagged arcs and
  then a `set` arc is still clear. Free states count as live: the front end's objects
  can always be finished from them (a `need` before `}` fails only while a required key
  is missing, and that key is clear, so it may still be written).

  Returns:
    state -> ((LIVE, word, bits), ...) for the states that are not free, words ascending.
  """
  dfa = contracted.dfa
  q = dfa.num_states
  free = dfa.accepting.astype(bool).copy()
  free[dfa.token_arcs[:, 0]] = True
  free[dfa.fragment_arcs[:, 0]] = True
  sets: dict[int, list] = {}
  for (state, _), ops in contracted.arc_ops.items():
    kind, word, operand = ops[0]
    if kind == SET:
      sets.setdefault(state, []).append((word, operand))
    else:
      free[state] = True
  src, dst = _distinct_pairs(*_untagged_arcs(dfa, contracted.arc_ops), q)
  # Free propagates backwards along untagged arcs: a breadth-first search over
  # predecessor lists (arcs sorted by target). Its levels are many (keys are chains of
  # states) and small: `_reached`'s few numpy calls a level.
  order = np.argsort(dst, kind="stable")
  pred_src, pred_start = src.take(order), np.searchsorted(dst.take(order), np.arange(q + 1))
  free = _compose._reached(q, np.flatnonzero(free), pred_start, pred_src)  # pylint: disable=protected-access
  successors: dict[int, list] = {}
  stuck = ~free[src]  # Arcs of the states left, the few inside keys.
  for a, b in zip(src[stuck].tolist(), dst[stuck].tolist()):
    successors.setdefault(a, []).append(b)
  memo: dict[int, dict] = {}
  for root in np.flatnonzero(~free).tolist():  # Post-order, iteratively (long keys).
    stack = [(root, False)]
    while stack:
      state, expanded = stack.pop()
      if expanded:
        words: dict[int, int] = {}
        for word, bits in sets.get(state, ()):
          words[word] = words.get(word, 0) | bits
        for nxt in successors.get(state, ()):
          for word, bits in memo.get(nxt, {}).items():  # {} on a cycle: nothing new.
            words[word] = words.get(word, 0) | bits
        memo[state] = words
      elif state not in memo:
        memo[state] = {}  # Entered; its successors come first.
        stack.append((state, True))
        stack.extend((nxt, False) for nxt in successors.get(state, ()) if nxt not in memo)
  return {state: tuple((LIVE, word, bits) for word, bits in sorted(memo[state].items()))
          for state in np.flatnonzero(~free).tolist()}


def _untagged_arcs(dfa, arc_ops: dict) -> tuple[np.ndarray, np.ndarray]:
  """(source, target) of the arcs with some byte that carries no operation, one per
  (state, byte class) such byte exists for (repeats possible).

  Counted on the DFA's byte classes (`ByteDfa.byte_classes`, all bytes of a class go
  to one target), not on `[Q, 256]`: a class arc is untagged unless every one of its
  bytes carries operations, and tagged (state, byte) pairs are few.
  """
  table, _, size = dfa.byte_classes
  arc = table != NO_STATE
  if arc_ops:  # Drop the (state, class) arcs whose every byte is tagged.
    keys = np.array(list(arc_ops), np.int64)
    class_of = np.repeat(np.arange(len(size)), size)
    pairs, tagged = np.unique(keys[:, 0] * len(size) + class_of[keys[:, 1]],
                              return_counts=True)
    arc.reshape(-1)[pairs[tagged == size[pairs % len(size)]]] = False
  # Flat positions (row-major, as `np.nonzero` orders them): one index array, one gather.
  at = np.flatnonzero(arc)
  return at // len(size), table.reshape(-1).take(at)


@dataclasses.dataclass(frozen=True, eq=False)
class Guards:
  """The guards of a token DFA's explicit edges.

  Attributes:
    edge_guard: int32 `[E]`; each explicit edge's guard id, -1 for none.
    ops: int32 `[G, O, 3]`; each guard's primitive ops (kind, word, operand) in order,
      padded with kind -1.
    num_words: Register words per row.
    hash_consts: int32 `[H, 4]`; the hash rows UCLOSE and UHASH operations name.
    state_hashing: int32 `[S]`; per token-DFA state, the first word of the block whose
      item it is inside, -1 for none.
    token_hash: int32 `[V, 4]`; `_unique_strings.token_hash` of the vocabulary.
  """

  edge_guard: np.ndarray
  ops: np.ndarray
  num_words: int
  # Distinct strings (`_unique_strings.py`): None/empty without them.
  hash_consts: np.ndarray | None = None
  state_hashing: np.ndarray | None = None
  token_hash: np.ndarray | None = None


def attach(token_dfa, byte_state: np.ndarray, contracted: Contracted,
           token_bytes, crossed_at: dict | None = None) -> Guards:
  """The guard of every explicit edge of `token_dfa` (module doc, step 3).

  Args:
    token_dfa: The composition of `contracted.dfa` with the vocabulary (`edge_source`,
      `edge_token`, `edge_target`, `state_terminals`, `terminal_bits` are read).
    byte_state: int `[S]`; the byte-DFA state of each token-DFA state.
    contracted: What `contract` returned.
    token_bytes: The bytes of each token id.
    crossed_at: edge -> ((byte position, operations), ...) its bytes cross, when the
      caller walked them (a push-down automaton's tokens cross calls and returns,
      `_pda.compose_token_pda`); else walked here in `contracted.dfa`.

  Raises:
    RegisterError: A terminal edge (a token bitmap) leaves a state whose tokens may
      cross an operation or lead to a dead end, or a guard needs more than
      `MAX_GUARD_OPS` operations.
  """
  dfa = contracted.dfa
  live = live_sets(contracted)
  blocks = _unique_strings.hashing_states(contracted)
  # Arcs that finish a string item: states inside an item keep their terminal bitmaps,
  # whose tokens never read those arcs (`_check_terminals` verifies it).
  closing = {arc for arc, ops in contracted.arc_ops.items() if ops[0][0] == UCLOSE}
  tagged_states = {state for state, _ in contracted.arc_ops} - set(blocks)
  _check_terminals(token_dfa, byte_state, tagged_states, live, closing, dfa.transitions,
                   token_bytes, blocks)
  live_needs = list(live.values())
  live_index = np.full(dfa.num_states, -1, np.int32)
  live_index[list(live)] = np.arange(len(live))
  # Per token-DFA state first: one gather per edge, not two. (Gathers by int32 ids are
  # `take`s: indexing with them goes through numpy's casting iterator, 1.5-4x slower.)
  needs_live = live_index.take(byte_state).take(token_dfa.edge_target)
  if crossed_at is None:
    tagged_bytes = np.zeros(256, bool)
    for _, byte in contracted.arc_ops:
      tagged_bytes[byte] = True
    # Only tokens holding a byte some operation is read with can cross one: walk those.
    # (Their tagged extent is > 0; `_crossed_hits` asks for the same extents, so one
    # pass over the vocabulary's bytes serves both on a process's first compile.)
    crossing = _tagged_extent(token_bytes, tagged_bytes).astype(bool).take(
        token_dfa.edge_token).nonzero()[0]
    # Source states and tokens of those edges alone (a tenth to a fifth of the edges with
    # spliced JSON values, whose copies' edges repeat per copy), then the edge ids back.
    edge, *rest = _crossed_hits(contracted, byte_state.take(token_dfa.edge_source[crossing]),
                                token_dfa.edge_token[crossing], np.arange(len(crossing)),
                                token_bytes)
    hits = (crossing[edge], *rest)
  hashes = {}
  uniques = any(k in (UOPEN, UCLOSE) for ops in contracted.arc_ops.values() for k, _, _ in ops)
  if crossed_at is None and not uniques:  # Edges grouped by the ops they cross, in numpy.
    edge_guard, guard_ids = _guard_ids(*_hit_groups(hits, needs_live, live_needs),
                                       needs_live, live_needs)
    return Guards(edge_guard, _guard_table(guard_ids), contracted.num_words)
  if crossed_at is None:
    crossed_at = _hits_by_edge(hits)
  if uniques:
    rows = _unique_strings.HashRows()
    crossed = {}
    for i, hits in crossed_at.items():
      block = blocks.get(int(byte_state[token_dfa.edge_source[i]]))
      crossed[i] = _unique_strings.rewrite(hits, token_bytes[token_dfa.edge_token[i]] or b"",
                                           block, rows)
    state_hashing = np.array([blocks.get(int(q), -1) for q in byte_state], np.int32)
    hashes = dict(hash_consts=rows.array(), state_hashing=state_hashing,
                  token_hash=_unique_strings.token_hash(token_bytes))
  else:
    crossed = {i: tuple(op for _, ops in hits for op in ops) for i, hits in crossed_at.items()}
  edges = np.array(sorted(crossed), np.int64)
  group_ops = [crossed[e] + (live_needs[needs_live[e]] if needs_live[e] >= 0 else ())
               for e in edges.tolist()]
  edge_guard, guard_ids = _guard_ids(edges, np.arange(len(edges)), group_ops, needs_live,
                                     live_needs)
  return Guards(edge_guard, _guard_table(guard_ids), contracted.num_words, **hashes)


def _guard_table(guard_ids: dict[tuple, int]) -> np.ndarray:
  """int32 `[G, O, 3]`: each guard's ops in order, padded with kind -1 (operands 0)."""
  width = max(map(len, guard_ids), default=1)
  table = np.full((max(len(guard_ids), 1), width, 3), -1, np.int32)
  for ops, gid in guard_ids.items():
    table[gid, :len(ops)] = ops
  table[..., 1:] = np.where(table[..., :1] < 0, 0, table[..., 1:])
  return table


def _guard_ids(crossing: np.ndarray, group_of: np.ndarray, group_ops: list,
               needs_live: np.ndarray, live_needs: list
               ) -> tuple[np.ndarray, dict[tuple, int]]:
  """(guard id of each edge, -1 for none; guard ops -> id), ids in order of first use
  by edge.

  An edge's ops are those its token crosses then the `LIVE` checks of its target. The
  edges that cross ops (`crossing`, ascending) come in groups with equal ops (`group_of`
  each, `group_ops[g]` the crossed and live ops of group g); every other edge with a
  live set (`needs_live[edge] >= 0`) has ops `live_needs[needs_live[edge]]`. Edges with
  equal ops share a guard, so the Python loop visits the first edge of each group and
  of each live set, in edge order, and numpy hands the ids out to the rest.

  Raises:
    RegisterError: A guard needs more than `MAX_GUARD_OPS` operations.
  """
  edge_guard = np.full(len(needs_live), -1, np.int32)
  plain = np.flatnonzero(needs_live >= 0)
  plain = plain[~np.isin(plain, crossing)]
  sets, first_plain = np.unique(needs_live[plain], return_index=True)
  groups, first_crossing = np.unique(np.asarray(group_of, np.int64), return_index=True)
  visits = sorted([(int(edge), int(g), 0) for edge, g in zip(crossing[first_crossing], groups)]
                  + [(int(edge), int(k), 1) for edge, k in zip(plain[first_plain], sets)])
  guard_ids: dict[tuple, int] = {}
  guard_of = (np.full(len(group_ops), -1, np.int32),
              np.full(len(live_needs) + 1, -1, np.int32))  # Live index -1: no set.
  for _, index, live in visits:
    ops = live_needs[index] if live else group_ops[index]
    if not ops:
      continue
    if len(ops) > MAX_GUARD_OPS:
      raise RegisterError(
          f"A token crosses {len(ops)} register operations. Expected at most"
          f" {MAX_GUARD_OPS}.")
    guard_of[live][index] = guard_ids.setdefault(ops, len(guard_ids))
  if len(crossing):
    edge_guard[crossing] = guard_of[0][np.asarray(group_of, np.int64)]
  edge_guard[plain] = guard_of[1][needs_live[plain]]
  return edge_guard, guard_ids


def _hit_groups(hits, needs_live: np.ndarray, live_needs: list
                ) -> tuple[np.ndarray, np.ndarray, list]:
  """`_guard_ids`' (crossing edges, group of each, ops of each group) from
  `_crossed_hits`: edges whose tokens cross the same op lists in the same order and
  whose targets need the same live set form one group (one `np.unique` over rows of
  op-list indices, instead of one tuple per edge)."""
  edge, _, op_index, ops_of = hits
  crossing, start, count = np.unique(edge, return_index=True, return_counts=True)
  if not len(crossing):
    return crossing, np.zeros(0, np.int64), []
  rows = np.full((len(crossing), int(count.max()) + 1), -1, np.int64)
  rows[np.repeat(np.arange(len(crossing)), count), _ranges(count)] = op_index
  rows[:, -1] = needs_live[crossing]
  keys, group_of = _unique_rows(rows, max(len(ops_of), len(live_needs)))
  group_ops = [tuple(op for j in key[:-1] if j >= 0 for op in ops_of[j])
               + (live_needs[key[-1]] if key[-1] >= 0 else ())
               for key in keys.tolist()]
  return crossing, group_of.reshape(-1), group_ops


def _unique_rows(rows: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
  """`np.unique(rows, axis=0, return_inverse=True)` for int rows of values in
  -1..bound-1: each row packed into one int64 (first column most significant, so codes
  sort as the rows do) when the columns fit, a 1-D unique ~10x faster than of rows."""
  bits = int(bound).bit_length()  # Fields hold value + 1 <= bound.
  if rows.shape[1] * bits > 62:
    keys, inverse = np.unique(rows, axis=0, return_inverse=True)
    return keys, inverse.reshape(-1)
  code = np.zeros(len(rows), np.int64)
  for column in rows.T:
    code <<= bits
    code += column + 1
  _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
  return rows[first], inverse.reshape(-1)


def _distinct_pairs(src: np.ndarray, dst: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray]:
  """The distinct (src, dst) pairs of states below q, sorted by src then dst: a sort of
  one int64 key per pair (`np.unique(..., axis=0)` takes ~100x longer on the ~10^5 arcs
  of a schema with string bodies)."""
  keys = np.sort(src.astype(np.int64) * q + dst)
  keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if len(keys) else keys
  return keys // q, keys % q


def _ranges(lengths: np.ndarray) -> np.ndarray:
  """Concatenated `arange(n)` for each n of `lengths`."""
  ends = np.cumsum(lengths)
  return np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - lengths, lengths)


def _crossed_hits(contracted: Contracted, sources: np.ndarray, tokens: np.ndarray,
                  edges: np.ndarray, token_bytes):
  """The operations that the tokens of `edges` cross from their source byte states (a
  lockstep numpy walk, one byte position at a time): (edge, byte position, index into
  op lists) per hit, sorted by edge then position, and the op lists."""
  empty = np.zeros(0, np.int64)
  if not len(edges) or not contracted.arc_ops:
    return empty, empty, empty, []
  data, starts, _ = _joined.joined(token_bytes)
  keys = np.array(sorted(state * 256 + byte for state, byte in contracted.arc_ops), np.int64)
  ops_of = [contracted.arc_ops[(int(k) >> 8, int(k) & 255)] for k in keys]
  flat = contracted.dfa.transitions.reshape(-1)
  tagged_bytes = np.zeros(256, bool)
  tagged_bytes[keys & 255] = True
  # Each token is walked up to its last byte that some operation is read with (no hit
  # lies past it), longest walks first: the edges still walking are a prefix.
  edge_token = tokens[edges]
  length = _tagged_extent(token_bytes, tagged_bytes).take(edge_token)
  longest = int(length.max())
  # A stable sort of 16-bit keys is a radix sort: ~5x faster than of int64 ones.
  shorter = (longest - length).astype(np.uint16 if longest < 1 << 16 else np.int64)
  by_length = np.argsort(shorter, kind="stable")
  first = starts.take(edge_token[by_length])
  state = sources[edges[by_length]].astype(np.int64)
  # Edges walking at each position: those longer than it.
  alive = len(edges) - np.cumsum(np.bincount(length, minlength=longest + 1))[:longest]
  # The few states an operation leaves get a row of op list indices by byte (-1: none):
  # a position gathers its states' rows, then looks up bytes only where there is one
  # (rather than binary-searching every (state, byte) among `keys`).
  tagged_states, row_of_key = np.unique(keys >> 8, return_inverse=True)
  row_of_state = np.full(contracted.dfa.num_states, -1, np.int64)
  row_of_state[tagged_states] = np.arange(len(tagged_states))
  op_at = np.full((len(tagged_states), 256), -1, np.int64)
  op_at[row_of_key.reshape(-1), keys & 255] = np.arange(len(keys))
  # Per position: the hits' edge indices and op list indices (empty arrays for none).
  hit_position, hit_edge, hit_ops = ([np.zeros(0, np.int64)] for _ in range(3))
  for position, n in enumerate(alive.tolist()):
    here = state[:n]
    byte = data.take(first[:n] + position)
    rows = row_of_state.take(here)
    maybe = (rows >= 0).nonzero()[0]
    if len(maybe):
      at = op_at[rows[maybe], byte[maybe]]
      hit = (at >= 0).nonzero()[0]
      if len(hit):
        hit_position.append(np.full(len(hit), position))
        hit_edge.append(by_length[maybe[hit]])
        hit_ops.append(at[hit])
    state[:n] = flat.take(here * 256 + byte)
  hit_position, hit_edge, hit_ops = map(np.concatenate, (hit_position, hit_edge, hit_ops))
  order = np.lexsort((hit_position, hit_edge))  # By edge, then position.
  return edges[hit_edge[order]], hit_position[order], hit_ops[order], ops_of


def _hits_by_edge(hits) -> dict[int, tuple]:
  """edge -> ((byte position, operations), ...) in order, from `_crossed_hits`; edges
  crossing none are left out."""
  edge, position, op_index, ops_of = hits
  out: dict[int, tuple] = {}
  for e, p, j in zip(edge.tolist(), position.tolist(), op_index.tolist()):
    out[e] = out.get(e, ()) + ((p, ops_of[j]),)
  return out


def _per_vocabulary(memo: dict, token_bytes, wanted, compute) -> np.ndarray:
  """`compute(token_bytes, wanted)` (a read-only array), the last 8 answers kept in `memo`
  keyed by the vocabulary's identity and the byte set (bool `[256]`)."""
  wanted = np.asarray(wanted, bool)
  key = (id(token_bytes), np.packbits(wanted).tobytes())
  cached = memo.get(key)
  if cached is None or cached[0] is not token_bytes:
    answer = compute(token_bytes, wanted)
    answer.setflags(write=False)
    if len(memo) >= 8:
      memo.pop(next(iter(memo)))
    cached = memo[key] = (token_bytes, answer)
  return cached[1]


# (id(token_bytes), packed byte set) -> (token_bytes, answer), per memoized function.
_TOKENS_WITH: dict[tuple, tuple] = {}
_TAGGED_EXTENT: dict[tuple, tuple] = {}


def _tokens_with(token_bytes, wanted: np.ndarray) -> np.ndarray:
  """bool `[V]`: whether each token's bytes hold a byte of `wanted` (bool `[256]`): a
  running count of the vocabulary's bytes in the set, compared at each token's ends (~4
  ms with Gemma 3 on the shared joined bytes; the [V, 32] byte-presence bits this
  replaces cost 20-85 ms to build on a process's first compile). The last few results
  are kept (`_check_closing_tokens` asks the same set once per state)."""
  return _per_vocabulary(_TOKENS_WITH, token_bytes, wanted, _count_tokens_with)


def _count_tokens_with(token_bytes, wanted: np.ndarray) -> np.ndarray:
  data, starts, ends = _joined.joined(token_bytes)
  running = np.zeros(len(data) + 1, np.int32)  # Bytes in `wanted` before each offset.
  np.cumsum(wanted[data], out=running[1:])
  return running[ends] > running[starts]


def _tagged_extent(token_bytes, wanted: np.ndarray) -> np.ndarray:
  """int64 `[V]`: one past the last position of each token holding a byte of `wanted`
  (bool `[256]`), 0 for none: where `_crossed_hits` may stop walking the token. The
  last few results are kept, like `_tokens_with`'s."""
  return _per_vocabulary(_TAGGED_EXTENT, token_bytes, wanted, _find_tagged_extent)


def _find_tagged_extent(token_bytes, wanted: np.ndarray) -> np.ndarray:
  data, starts, ends = _joined.joined(token_bytes)
  extent = np.zeros(len(starts), np.int64)
  at = np.flatnonzero(wanted[data])  # Offsets in the joined bytes, ascending.
  token = np.searchsorted(ends, at, side="right")  # Tokens' bytes are contiguous.
  last = np.append(token[1:] != token[:-1], True) if len(at) else np.zeros(0, bool)
  extent[token[last]] = at[last] - starts[token[last]] + 1
  return extent


def _check_terminals(token_dfa, byte_state, tagged_states: set, live: dict,
                     closing: set = frozenset(), transitions=None, token_bytes=None,
                     inside: dict | None = None) -> None:
  """Terminal edges (bitmaps) carry no guard: their sources must cross no operation and
  their targets be free. The one exception: a state inside a string item (`inside`,
  arrays of distinct strings) has arcs in `closing` ((state, byte) that finish the
  item); the tokens of its bitmaps must never read one (walked, for those holding a
  closing byte; `_unique_strings.item_borders` keeps them out by construction)."""
  states = np.flatnonzero((token_dfa.state_terminals[..., 0] >= 0).any(axis=1))
  sources = byte_state[states]
  # Flags over byte states, and one more index (always False) for "none" (-1).
  none = int(byte_state.max(initial=-1)) + 1
  byte_of = np.where(byte_state >= 0, byte_state, none)
  tagged = _flags(tagged_states, none + 1)
  is_live = _flags(live, none + 1)
  targets = token_dfa.state_terminals[states][:, :, 1]
  bad = tagged[byte_of[states]] | ((targets >= 0)
                                   & is_live[byte_of[np.maximum(targets, 0)]]).any(axis=1)
  first_bad = int(np.argmax(bad)) if bad.any() else len(states)
  if inside:  # In state order, as far as the first bad state.
    for state, source in zip(states[:first_bad].tolist(), sources[:first_bad].tolist()):
      if source in inside:
        _check_closing_tokens(token_dfa, state, source, closing, transitions, token_bytes)
  if first_bad < len(states):
    raise RegisterError(
        "A token bitmap (a string body or a token class) borders a register operation.")


def _flags(states, size: int) -> np.ndarray:
  """bool `[size]`: which of `states` (ints; those outside 0..size-2 ignored, so that
  index size - 1 stays False) each index is."""
  out = np.zeros(size, bool)
  picked = np.fromiter(states, np.int64, len(states))
  out[picked[(picked >= 0) & (picked < size - 1)]] = True
  return out


def _check_closing_tokens(token_dfa, state: int, source: int, closing: set, transitions,
                          token_bytes) -> None:
  """No token of `state`'s bitmaps crosses an arc of `closing` from byte state `source`."""
  wanted = np.zeros(256, bool)
  wanted[sorted({byte for _, byte in closing})] = True
  holding = np.zeros(token_dfa.terminal_bits.shape[1] * 32, bool)
  found = _tokens_with(token_bytes, wanted)
  holding[:len(found)] = found
  words = np.packbits(holding, bitorder="little").view(np.uint32)
  for terminal in token_dfa.state_terminals[state][:, 0].tolist():
    if terminal < 0:
      continue
    both = np.unpackbits((token_dfa.terminal_bits[terminal] & words).view(np.uint8),
                         bitorder="little")
    for token in np.flatnonzero(both).tolist():
      here = source
      for byte in token_bytes[token]:
        if (here, byte) in closing:
          raise RegisterError(
              "A token bitmap holds a token that finishes a string item of an array"
              " with uniqueItems.")
        here = int(transitions[here, byte])
        if here < 0:
          break


class ByteWalker:
  """Register-aware stepping of a byte DFA with markers: the byte language's reference.

  `start()` is (state, registers); `step(position, byte)` the next position or None when
  the byte is not allowed (its arc's operations fail, or it leads to a dead end given
  the registers, see `live_sets`); `accepting(position)`; `moves(position)` the allowed
  (byte, next position) pairs.

  With `uopen`/`uclose` markers (arrays of distinct strings) a position also holds the
  bytes of the item being written and the items finished, per block, and `uclose`
  compares bytes exactly: an oracle independent of the hashes the device keeps.
  """

  def __init__(self, dfa: ByteDfa):
    self.contracted = contract(dfa)
    self.dfa = self.contracted.dfa
    self.live = live_sets(self.contracted)
    self.blocks = {word for ops in self.contracted.arc_ops.values()
                   for kind, word, _ in ops if kind == UCLOSE}
    self.in_arrays = self._array_states() if self.blocks else set()

  def _array_states(self) -> set:
    """The states where a block's finished items may still matter: every state reached
    from an arc that clears a block's count (the `[` of an array of distinct strings,
    the `{` of an object whose keys are hashed). Elsewhere the items finished are
    forgotten, so that positions before any block merge. A block's end is not a place
    in the DFA (an object's `}` and a nested array's `]` can share it), so nothing after
    a clear forgets: the next clear of the same block empties it anyway."""
    trans = self.dfa.transitions
    frontier = [int(trans[state, byte]) for (state, byte), ops in self.contracted.arc_ops.items()
                if any(k == CLEAR and w - 2 in self.blocks for k, w, _ in ops)]
    seen = set()
    while frontier:
      state = frontier.pop()
      if state in seen or state < 0:
        continue
      seen.add(state)
      frontier.extend(trans[state][trans[state] >= 0].tolist())
    return seen

  def start(self) -> tuple:
    registers = (0,) * self.contracted.num_words
    return (self.dfa.start, registers, (None, ())) if self.blocks else (self.dfa.start,
                                                                        registers)

  def step(self, position, byte: int):
    state, registers = position[:2]
    target = int(self.dfa.transitions[state, byte])
    if target == NO_STATE:
      return None
    ops = self.contracted.arc_ops.get((state, byte), ()) + self.live.get(target, ())
    plain = [op for op in ops if op[0] not in (UOPEN, UCLOSE)]
    after = apply_guard(plain, registers) if plain else registers
    if after is None:
      return None
    if not self.blocks:
      return (target, after)
    current, done = position[2]
    moved = False
    for kind, word, operand in ops:
      if kind == CLEAR and word - 2 in self.blocks:  # A block's count: a new array.
        done = tuple(d for d in done if d[0] != word - 2)
      elif kind == UCLOSE:
        mine = [d for b, d in done if b == word]
        if current in mine or len(mine) >= operand:
          return None
        done, current, moved = tuple(sorted(done + ((word, current),))), None, True
      elif kind == UOPEN:
        current, moved = b"", True
    if current is not None and not moved:
      current += bytes([byte])
    if target not in self.in_arrays:
      done = ()
    return (target, after, (current, done))

  def accepting(self, position) -> bool:
    return bool(self.dfa.accepting[position[0]])

  def moves(self, position) -> list:
    row = self.dfa.transitions[position[0]]
    out = []
    for byte in np.flatnonzero(row != NO_STATE).tolist():
      nxt = self.step(position, byte)
      if nxt is not None:
        out.append((byte, nxt))
    return out

  def shortest_completion(self, position) -> bytes:
    """The fewest bytes that take `position` to acceptance (a breadth-first search).
    Inside a string item of distinct strings only the lowest byte that stays in the
    item and all that leave it are tried: positions hold the item's bytes, so they never
    merge, and a full search would branch on every body byte at every depth. Items
    grown by one byte at a time differ by length, so one of at most 65 is new."""
    parent = {position: None}
    queue = collections.deque([position])
    while queue:
      here = queue.popleft()
      if self.accepting(here):
        path = bytearray()
        while parent[here] is not None:
          here, byte = parent[here]
          path.append(byte)
        return bytes(reversed(path))
      moves = self.moves(here)
      if self.blocks and here[2][0] is not None:
        moves = ([m for m in moves if m[1][2][0] is None]
                 + [m for m in moves if m[1][2][0] is not None][:1])
      for byte, nxt in moves:
        if nxt not in parent:
          parent[nxt] = (here, byte)
          queue.append(nxt)
    raise AssertionError("A live position with no way to acceptance.")

  def accepts(self, data: bytes) -> bool:
    position = self.start()
    for byte in data:
      position = self.step(position, byte)
      if position is None:
        return False
    return self.accepting(position)
