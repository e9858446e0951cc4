"""Objects whose size bounds need several distinct additional keys: every key hashed
and checked distinct on the device, the members counted in a register.

Function (`lw` is the lowering in progress, `_json_schema._Lowerer`):
  distinct_key_object(lw, keyed, extra_key, extra_rest, depends, sizes, pointer)
      the object's IR, or why it cannot be built this way (a sentence).

Why. `{"minProperties": 4}` beside one declared key needs three additional members
with pairwise distinct keys: a parser keeps one value per key, so `{"a":1,"a":2,"a":3,
"k":0}` has two properties. Distinct strings are not a regular language, so an
automaton alone can count only one additional member towards a minimum (what
`_json_object_schemas._counted_members` does; it refuses larger minimums). Here every
key is written between `uopen`/`uclose` register markers, the hash check of arrays of
distinct strings (`automata/_unique_strings.py`, `docs/unique_items.md`): a key equal to
one written before is refused at the token that would finish it, so the number of
members is the number of properties, counted by a `count` marker before each `,` and
checked by an `atleast` marker before `}`.

The automaton over the declared keys written (subsets, as `_json_objects.
any_order_members`) carries what depends on which keys are present: `required`,
`dependentRequired`, and the size bounds of `dependentSchemas` (`{"k": {"minProperties":
4}}`, `$dependentMinProperties`). Additional members come after the declared ones (a
narrowing, as in `any_order_members`: then each group of bounds holds one copy of the
additional member, not one per subset). A subset is kept only if some complete object
within its bounds extends it, so the count never fills before a required key is written
(no dead end). Narrowings: additional members after the declared ones; at most
`maxProperties` members, else `DEFAULT_MEMBERS` (a row keeps one hash per member); one
spelling per key (`json.dumps`'), as for distinct string items.
"""

from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_array_schemas
from constrained_decoding.constraints import _json_objects
from constrained_decoding.constraints import _json_values as jv

# Most members such an object may have when `maxProperties` does not say (each needs a
# hash in the row's registers: two int32 words), and most it may have at all (those of
# arrays of distinct strings, `_json_array_schemas.DEFAULT_`/`MAX_UNIQUE_STRINGS`).
DEFAULT_MEMBERS = 32
MAX_MEMBERS = 64
# Most IR nodes of the declared members' copies (one per subset without the key).
MAX_SUBSET_SIZE = 10_000


def distinct_key_object(lw, keyed: list, extra_key: ir.Node | None,
                        extra_rest: ir.Node | None, depends: dict, sizes: dict,
                        pointer: str) -> ir.Node | str:
  """The object (module doc), or why it cannot be built so.

  Args:
    lw: The lowering in progress.
    keyed: (key, value IR, is_required) of each declared key (a value accepting
      nothing only if required).
    extra_key: The additional keys as quoted JSON strings, or None when none are
      allowed; `extra_rest` what follows such a key (colon and value).
    depends: `dependentRequired`, key -> keys that must be present when it is.
    sizes: "min"/"max" (`minProperties`/`maxProperties`, max None when absent),
      "dependent_min"/"dependent_max" (key -> bound once the key is present).
    pointer: Where the object is (for the log).
  """
  if not (lw.use_registers and lw.options.property_order == "any"):
    return ("the keys are checked distinct in register words on the device, which"
            " property_order other than 'any' does not use, nor alternatives of"
            " anyOf/oneOf that are both objects")
  n = len(keyed)
  ws = lw.ws
  values = [ir.concat(lw.extra_colon, lw.extra_value) if lw.is_free_form(value)
            else ir.concat(ws.colon, value) for _, value, _ in keyed]
  if n and (1 << (n - 1)) * sum(_json_objects.ir_size(v, lw.memos["size"]) for v in values) > MAX_SUBSET_SIZE:
    return (f"its {n} declared keys need an automaton over the sets of them written"
            f" past {MAX_SUBSET_SIZE} IR nodes")
  body = None
  if extra_key is not None:
    body = _json_array_schemas._string_body(extra_key)  # pylint: disable=protected-access
    if body is None or not _json_array_schemas._endless(body):  # pylint: disable=protected-access
      return ("its additional keys can be finished in only finitely many ways after some"
              " prefix, and a row would have to foresee that every ending is taken")
  low, high = sizes["min"], sizes["max"]
  lows, highs = sizes["dependent_min"], sizes["dependent_max"]
  largest_low = max([low, *lows.values()])
  if largest_low > MAX_MEMBERS:
    return (f"it needs {largest_low} members; a row keeps the hashes of at most"
            f" {MAX_MEMBERS} keys")
  cap = min(MAX_MEMBERS, max(DEFAULT_MEMBERS, largest_low) if high is None else high)
  index = {key: i for i, (key, _, _) in enumerate(keyed)}
  required = sum(1 << i for i, (_, _, r) in enumerate(keyed) if r)
  needs = [0] * n
  for key, targets in depends.items():
    if key in index:  # A target that cannot be written forbids the key (bit n).
      needs[index[key]] |= sum(1 << index.get(t, n) for t in targets if t != key)
  writable = [i for i, (_, value, _) in enumerate(keyed) if value != ir.NOTHING]

  def bounds(subset: int) -> tuple[int, int]:
    """(least, most members) of a complete object whose declared keys are `subset`."""
    present = [key for key, i in index.items() if subset >> i & 1]
    least = max([low, *(lows[k] for k in present if k in lows)])
    most = min([cap, *(highs[k] for k in present if k in highs)])
    return least, most

  def complete(subset: int) -> bool:
    return subset & required == required and all(
        not subset >> i & 1 or subset & needs[i] == needs[i] for i in range(n))

  def closes(subset: int) -> bool:
    least, most = bounds(subset)
    return complete(subset) and least <= subset.bit_count() <= most

  def has_tail(subset: int) -> bool:
    least, most = bounds(subset)
    return (extra_key is not None and complete(subset) and least <= most
            and subset.bit_count() < most)

  useful: dict[int, bool] = {}
  for subset in sorted(range(1 << n), key=lambda s: -s.bit_count()):  # Supersets first.
    useful[subset] = (subset.bit_count() <= bounds(subset)[1] and (
        closes(subset) or has_tail(subset)
        or any(useful.get(subset | 1 << i, False) for i in writable if not subset >> i & 1)))
  if not useful[0]:
    return ir.NOTHING
  key_words = ("distinct keys", tuple(keyed), extra_key, extra_rest,
               tuple((k, tuple(v)) for k, v in sorted(depends.items())), repr(sorted(sizes.items())), cap)
  block = lw.register_blocks.setdefault(key_words, lw.register_words)
  if block == lw.register_words:
    lw.register_words += 3 + 2 * cap + 1
  count = block + 3 + 2 * cap

  def hashed(key_body: ir.Node, rest: ir.Node) -> ir.Node:
    return ir.concat(ir.Marker("uopen", block, 0), ir.Bytes(b'"'), key_body,
                     ir.Marker("uclose", block, cap), ir.Bytes(b'"'), rest)

  members = [hashed(ir.Bytes(jv.canonical_string(key).data[1:-1]), rest)
             for (key, _, _), rest in zip(keyed, values)]
  extra = None if extra_key is None else hashed(body, extra_rest)

  def comma(most: int) -> ir.Node:
    return jv.counted_comma(ws, ir.Marker("count", count, most - 1))

  states: dict = {}
  arcs = []

  def state(*name) -> int:
    return states.setdefault(name, len(states))

  end = state("end")
  for subset in range(1 << n):
    if not useful[subset]:
      continue
    here = state("keys", subset)
    least, most = bounds(subset)
    after = here if subset == 0 else state("comma", subset)
    if subset:
      arcs.append((here, comma(most), after))
    for i in writable:
      if not subset >> i & 1 and useful[subset | 1 << i]:
        arcs.append((after, members[i], state("keys", subset | 1 << i)))
    if has_tail(subset):
      arcs.append((after, ir.EPSILON, state("extra", least, most)))
    if subset and closes(subset):
      arcs.append((here, ir.concat(ws.gap, ir.Bytes(b"}")), end))
  for name in list(states):
    if name[0] != "extra":
      continue
    _, least, most = name
    tail = state("tail", least, most)
    arcs.append((states[name], extra, tail))
    arcs.append((tail, comma(most), states[name]))
    at_least = [ir.Marker("atleast", count, least - 1)] if least > 1 else []
    arcs.append((tail, ir.concat(ws.gap, *at_least, ir.Bytes(b"}")), end))
  start = states[("keys", 0)]
  order = {s: i for i, s in enumerate(sorted(states.values(), key=lambda s: s != start))}
  graph = ir.Graph(num_states=len(states),
                   arcs=tuple((order[a], label, order[b]) for a, label, b in arcs),
                   finals=(order[end],))
  lw.log.info("JSON Schema: the object at %s keeps its keys distinct and counts its"
              " members on the device (at most %d).", pointer, cap)
  node = ir.concat(ws.open(b"{"), ir.Marker("clear", block + 2, 0),
                   ir.Marker("clear", count, 0), graph)
  if closes(0):
    return ir.union(ws.empty(b"{}"), node)
  return node
