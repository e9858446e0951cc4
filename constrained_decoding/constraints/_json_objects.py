"""Object members in any order: an automaton over the set of declared keys written so far.

Public function:
  any_order_members(members, extra, ws, depends, budget, sizes, extra_size)
      the IR of the non-empty member lists (any order, each declared key at most once,
      `required` and `dependentRequired` enforced), or None past `budget`.

Why a subset automaton: a JSON object may list its members in any order, and a parser
keeps one value per key. An automaton that accepts each declared key at most once and
checks `required` at the closing brace must remember which keys it has seen, so its
states are the subsets of declared keys (2^n for n keys); the minimal DFA of that
language has as many. Each member's value is written on an arc out of every subset
without it, so the language costs about 2^(n-1) copies of each value: small objects are
cheap, large ones are not. `budget` bounds that cost (in IR nodes); past it the caller
falls back to schema order (`_json_schema.py`), which is linear in the schema.

Additional members (keys other than the declared ones) may come before the declared
members and after them, any number of times, but not between two declared members:
anywhere would copy their key automaton and schema-free value once per subset, which
dominates the cost (measured: GPQA with extras 4x slower to compile). Two of them may
share a key (excluding that is not regular), and each value satisfies the schema, so
whichever one a parser keeps is valid.
"""

import functools
from collections.abc import Mapping, Sequence

from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_values as jv

_START = -1  # Nothing written yet: the next member has no comma before it.
_HEAD = -2  # Only additional members written so far.
_TAIL = -3  # Additional members after the declared ones (no declared member follows).


def any_order_members(
    members: Sequence[tuple[str, ir.Node, bool]],
    extra: ir.Node | None,
    ws: jv.Whitespace,
    depends: Mapping[str, Sequence[str]],
    budget: int,
    sizes: Sequence[int],
    extra_size: int = 0,
    wide_budget: int | None = None,
    memo: dict | None = None,
) -> tuple[ir.Node, bool] | None:
  """The member lists between `{` and `}` in any order, and whether `{}` is allowed.

  Args:
    members: (key, member IR `"key": value`, is_required) for each declared key; a
      member whose value accepts nothing must already be left out (unless required).
    extra: IR of one additional member, or None when none are allowed.
    ws: Whitespace policy (commas).
    depends: `dependentRequired`: key -> keys that must be present when it is.
    budget: Most IR nodes the automaton may hold (member sizes times the subsets
      each is written from).
    sizes: IR size of each member, as the caller measures it.
    extra_size: IR size of `extra` (written before and after the declared members).
    wide_budget: Most copies of wide parts (`wide_parts`) the automaton may hold:
      each copy of a string body costs a near-loop state with its own token edges
      once composed with a vocabulary, far more than its IR size says.
    memo: `ir.fold` memo of `wide_parts`, shared between the calls of one lowering.

  Returns:
    (IR of the non-empty member lists, whether the empty object is allowed), or None
    when the automaton would exceed `budget`.
  """
  n = len(members)
  if 3 * extra_size + (n and (1 << (n - 1)) * sum(sizes)) > budget:
    return None
  if wide_budget is not None and n and (
      (1 << (n - 1)) * sum(wide_parts(m, memo) for _, m, _ in members) > wide_budget):
    return None
  index = {key: i for i, (key, _, _) in enumerate(members)}
  required = sum(1 << i for i, (_, _, is_required) in enumerate(members) if is_required)
  needs = [0] * n  # needs[i]: the keys that must be present once key i is.
  for key, targets in depends.items():
    if key in index:  # A target that cannot be written forbids the key (bit n: never set).
      needs[index[key]] |= sum(1 << index.get(t, n) for t in targets if t != key)

  def complete(subset: int) -> bool:
    if subset & required != required:
      return False
    return all(not subset >> i & 1 or subset & needs[i] == needs[i] for i in range(n))

  # States: _START (nothing written); _HEAD (only additional members so far); each
  # non-empty subset of declared keys written; _TAIL (additional members after a
  # complete subset). Additional members come before or after the declared ones, not
  # between them: then their key and value (a string body and a schema-free value,
  # the costly parts) exist twice, not once per subset.
  state_of = {_START: 0}
  arcs = []

  def state(key) -> int:
    if key not in state_of:
      state_of[key] = len(state_of)
      todo.append(key)
    return state_of[key]

  todo = [_START]
  while todo:
    subset = todo.pop()
    if subset == _TAIL:
      continue
    seen = 0 if subset in (_START, _HEAD) else subset
    for i, (_, member, _) in enumerate(members):
      if seen >> i & 1 or member == ir.NOTHING:
        continue
      label = member if subset == _START else ir.concat(ws.comma, member)
      arcs.append((state_of[subset], label, state(seen | 1 << i)))
    if extra is None:
      continue
    if subset in (_START, _HEAD):
      label = extra if subset == _START else ir.concat(ws.comma, extra)
      arcs.append((state_of[subset], label, state(_HEAD)))
    elif complete(subset):
      arcs.append((state_of[subset], ir.concat(ws.comma, extra), state(_TAIL)))
  if _TAIL in state_of:
    arcs.append((state_of[_TAIL], ir.concat(ws.comma, extra), state_of[_TAIL]))
  finals = tuple(sorted(state_of[s] for s in state_of
                        if s == _TAIL or s == _HEAD and complete(0)
                        or s not in (_START, _HEAD, _TAIL) and complete(s)))
  can_be_empty = complete(0)
  if not finals:
    return ir.NOTHING, can_be_empty
  return ir.Graph(num_states=len(state_of), arcs=tuple(arcs), finals=finals), can_be_empty


# Keys per register word: 31, so that every operand is a positive int32.
KEYS_PER_WORD = 31


def register_object(keyed: Sequence[tuple[str, ir.Node, bool]], member,
                    extra: ir.Node | None, ws: jv.Whitespace, first_word: int,
                    counted: tuple[int, int | None] | None = None) -> tuple[ir.Node, int]:
  """The object with its declared keys in any order, each at most once, checked by
  register markers (`automata/_registers.py`, `docs/any_order_objects.md`): linear in
  the schema, where `any_order_members` is exponential in the number of keys.

  `{` (whitespace) `clear` · member (`,` member)* · (whitespace) `need` `}`, a member
  being a declared key with `set` of its bit right after its closing quote, or an
  additional one (anywhere, any number of times; two may share a key, as in
  `any_order_members`). `{}` when no key is required.

  Args:
    keyed: (key, value IR, is_required) of each declared key that may be written.
    member: `member(key, value, marker)` -> the IR of `"key" marker: value`.
    extra: IR of one additional member, or None when none are allowed.
    ws: Whitespace policy.
    first_word: The first register word this object may use.
    counted: (minProperties, maxProperties) counted in one more word (`count` before
      each `,`, `atleast` before `}`), or None. Only for objects without required keys
      (a full count must leave `}` open) whose members cannot repeat a key towards the
      minimum (no additional members, or a minimum of at most 1).

  Returns:
    (the object's IR, the number of register words it uses).
  """
  num_words = -(-len(keyed) // KEYS_PER_WORD)  # Key bits; a counted object may have none.
  if counted is None:
    num_words = max(1, num_words)
  required = [0] * num_words
  members = []
  for i, (key, value, is_required) in enumerate(keyed):
    word, bit = first_word + i // KEYS_PER_WORD, 1 << i % KEYS_PER_WORD
    if is_required:
      if value == ir.NOTHING:  # A required key no value satisfies: no object does.
        return ir.NOTHING, 0
      required[word - first_word] |= bit
    members.append(member(key, value, ir.Marker("set", word, bit)))
  if extra is not None:
    members.append(extra)
  one = ir.union(*members)
  clear = [ir.Marker("clear", first_word + w, 0) for w in range(num_words)]
  need = [ir.Marker("need", first_word + w, bits) for w, bits in enumerate(required) if bits]
  comma, least = ws.comma, []
  if counted:
    low, high = counted
    counter = first_word + num_words
    clear.append(ir.Marker("clear", counter, 0))
    comma = jv.counted_comma(ws, ir.Marker("count", counter,
                                           jv.UNBOUNDED_COUNT if high is None else high - 1))
    least = [ir.Marker("atleast", counter, low - 1)] if low > 1 else []
    num_words += 1
  body = ir.concat(ws.open(b"{"), *clear, one, ir.repeat(ir.concat(comma, one), 0, None),
                   ws.gap, *need, *least, ir.Bytes(b"}"))
  if any(is_required for _, _, is_required in keyed) or counted and counted[0] > 0:
    return body, num_words
  return ir.union(ws.empty(b"{}"), body), num_words


def schema_order_members(members: list, extra: ir.Node | None, ws: jv.Whitespace,
                         memo: dict | None = None):
  """Comma-separated object members in order, optional ones skippable, then extras.

  Args:
    members: (member IR, is_required) in schema order.
    extra: The IR of one additional member, or None if none are allowed.
    ws: Whitespace policy (for commas).
    memo: `ir.fold` memo of `ir_size`, shared between the calls of one lowering.

  Returns:
    (IR of the non-empty member lists, whether the empty object is allowed).
  """
  sized = [(member, is_required, ir_size(member, memo)) for member, is_required in members]
  first, can_be_empty, _ = _member_lists(sized, ws) if sized else (ir.NOTHING, True, 0)
  if extra is None:
    return first, can_be_empty
  if not can_be_empty:
    return ir.concat(first, ir.repeat(ir.concat(ws.comma, extra), 0, None)), False
  # `(first | extra) (, extra)*` with one copy of `extra` (often schema-free JSON, the
  # largest part): 0 -first-> 1, 0 -> 2, 2 -extra-> 1, 1 -comma-> 2; 1 is final.
  arcs = [(0, ir.EPSILON, 2), (2, extra, 1), (1, ws.comma, 2)]
  if first != ir.NOTHING:
    arcs.append((0, first, 1))
  return ir.Graph(num_states=3, arcs=tuple(arcs), finals=(1,)), True


def _member_lists(members: list, ws: jv.Whitespace):
  """(non-empty lists, empty allowed, IR size) for (member, is_required, size) triples.

  Divide and conquer: a list over A + B is `NA , NB`, `NA` (if B may be empty) or `NB`
  (if A may be empty), written `NA (, NB)? | NB` or `(NA ,)? NB | NA`. Only when both
  halves may be empty must one of them be written twice, and the smaller one is. The
  naive "first present member" construction copies the last member once per member
  before it; this copies no member more than a few times in typical schemas (and at
  most O(n^1.6) members in total), which keeps nested objects small.
  """
  if len(members) == 1:
    member, is_required, size = members[0]
    return member, not is_required, size
  half = len(members) // 2
  a, a_empty, a_size = _member_lists(members[:half], ws)
  b, b_empty, b_size = _member_lists(members[half:], ws)
  then_b = ir.concat(ws.comma, b)
  a_then = ir.concat(a, ws.comma)
  if not a_empty or (b_empty and b_size <= a_size):
    # NA (, NB)?  |  NB if A may be empty.
    node = ir.concat(a, ir.repeat(then_b, 0, 1) if b_empty else then_b)
    parts, size = [node], a_size + b_size
    if a_empty:
      parts.append(b)
      size += b_size
  else:
    # (NA ,)? NB  |  NA if B may be empty.
    parts = [ir.concat(ir.repeat(a_then, 0, 1), b)]
    size = a_size + b_size
    if b_empty:
      parts.append(a)
      size += a_size
  return ir.union(*parts), a_empty and b_empty, size


# A bounded repeat the compiler counts (`automata/_embedded_chains.py`) is laid out at
# most this many times whatever its bound (its compressed length with the longest
# vocabularies), so `maxLength` 2,000 costs what 200 does.
COUNTED_REPEAT_COPIES = 200


def ir_size(node: ir.Node, memo: dict | None = None) -> int:
  """Number of IR nodes in the tree (shared subtrees counted once per occurrence, a
  bounded repeat's body once per copy, at most `COUNTED_REPEAT_COPIES` for a counted one).
  `memo`: shared between calls (`ir.fold`), so nested objects are measured once."""
  return ir.fold(node, _size, memo=memo)


def _size(n: ir.Node, children: tuple) -> int:
  """`ir_size` of `n` given its children's. A leaf, most nodes, costs one test (a
  `Fragment` has none here: one arc of the byte automaton until spliced)."""
  if not children:
    return 1
  if type(n) is ir.Repeat:  # pylint: disable=unidiomatic-typecheck
    copies = max(1, n.min if n.max is None else n.max)
    if copies > COUNTED_REPEAT_COPIES and _is_counted(n):
      copies = COUNTED_REPEAT_COPIES
    return 1 + children[0] * copies
  return 1 + sum(children)


@functools.lru_cache(maxsize=256)
def _is_counted(repeat: ir.Repeat) -> bool:
  from constrained_decoding.automata import _counting  # pylint: disable=g-import-not-at-top

  return _counting.find_chain(repeat) is not None


# A bounded position of a class of at least this many code points (a hostname label's
# `[A-Za-z0-9]`, a `maxLength` string's body) gets its own explicit token edges once
# composed; `NARROW_PER_WIDE` of them cost about one wide part.
NARROW_CLASS = 32
NARROW_PER_WIDE = 8


def wide_parts(node: ir.Node, memo: dict | None = None) -> float:
  """Copies of wide parts in an IR tree, the measure of what a copy costs once composed:
  unbounded repeats of a class of at least 128 code points (string bodies, free text)
  and fragments (schema-free values) count 1 each (a loop over most of a vocabulary);
  other positions of a class of at least `NARROW_CLASS` code points, bounded repeats
  unrolled, `1 / NARROW_PER_WIDE` each.

  Measured with Gemma 3 (issue 15, an object of three members whose first one varies,
  written 4 times): a copy costs ~0.7 ms with a string, 5.5 to 9 ms with `format`
  `email`, `hostname`, `uri` or `ipv6` or a `maxLength` 20 string, which count 0 wide
  parts but 8 to 65 such positions. `memo`: shared between calls (`ir.fold`)."""
  wide, narrow = ir.fold(node, _wide_and_narrow, memo=memo)
  return wide + narrow / NARROW_PER_WIDE


def _wide_and_narrow(n: ir.Node, children: tuple) -> tuple[int, int]:
  """(wide parts, narrow class positions) of `n` given its children's (`wide_parts`)."""
  if not children:
    kind = type(n)
    if kind is ir.CharClass:
      return 0, int(sum(hi - lo + 1 for lo, hi in n.ranges) >= NARROW_CLASS)
    return (1, 0) if kind is ir.Fragment else (0, 0)
  if type(n) is ir.Repeat:  # pylint: disable=unidiomatic-typecheck
    if n.max is None and _is_wide(n.node):
      return 1, 0
    copies = max(1, n.min if n.max is None else n.max)
    return children[0][0] * copies, children[0][1] * copies
  if len(children) == 1:
    return children[0]
  return sum(w for w, _ in children), sum(k for _, k in children)


def _is_wide(node: ir.Node) -> bool:
  if isinstance(node, ir.CharClass):
    return sum(hi - lo + 1 for lo, hi in node.ranges) >= 128
  if isinstance(node, ir.Union):
    return any(_is_wide(a) for a in node.alternatives)
  return False
