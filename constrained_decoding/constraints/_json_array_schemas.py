"""JSON Schema arrays lowered to IR: `items`, `prefixItems`, `minItems`/`maxItems`,
`contains` with `minContains`/`maxContains`, `uniqueItems`.

Function (`lw` is the lowering in progress, `_json_schema._Lowerer`):
  lower_array(lw, schema, pointer)   the JSON texts of the arrays `schema` accepts.

`minItems`/`maxItems` write the item once per position it may take (`[a, a?, a?]`),
which is fine for small items; when those copies would exceed `MAX_COPIED_ITEMS` IR
nodes (an array of at most 50 objects) and registers are on, the item is written once
and a register word counts the commas (`counted_array`).
"""

import json

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_keywords
from constrained_decoding.constraints import _json_negation
from constrained_decoding.constraints import _json_object_schemas
from constrained_decoding.constraints import _json_objects
from constrained_decoding.constraints import _json_values as jv
from constrained_decoding.constraints._json_keywords import (
    _items,
    _pointer,
    _short,
)

# Most distinct item values `uniqueItems: true` is supported for (2^N subset states).
MAX_UNIQUE_VALUES = 8
# Arrays of distinct strings (`unique_strings`): the most items a row keeps the hashes
# of (a `maxItems` above it is refused), and the items an array without `maxItems` may
# hold (a narrowing: longer arrays are valid but not written).
MAX_UNIQUE_STRINGS = 64
DEFAULT_UNIQUE_STRINGS = 32
# Most states of a `contains` automaton over (items written, matching items written).
MAX_CONTAINS_STATES = 4_096
# Most IR nodes of the item copies `minItems`/`maxItems` may write before the items are
# counted in a register instead (`counted_array`).
MAX_COPIED_ITEMS = 2_000
# Most different `contains` schemas (merged from `allOf` parts) an array is held to.
MAX_ALL_CONTAINS = 3


def _lower_contains(lw, schema: dict, pointer: str) -> ir.Node:
  """Arrays of `minItems` to `maxItems` items (`prefixItems`, then `items`),
  `minContains` (default 1) to `maxContains` of them matching `contains`.

  An automaton over (items written, matching items written), each capped where more
  no longer matters: an item either counts (`items` and `contains`) or not (`items`
  and, with a `maxContains`, not `contains`: `_json_negation.negate`); without a
  maximum, an item need not be counted, so no negation is needed.
  """
  where = _pointer(pointer, "contains")
  if "$alsoContains" in schema:
    return _lower_all_contains(lw, schema, pointer)
  m = _json_keywords.count(schema, "minContains", pointer)
  m = 1 if m is None else m
  top = _json_keywords.count(schema, "maxContains", pointer)
  rest = {k: v for k, v in schema.items() if k not in ("contains", "minContains",
                                                       "maxContains")}
  if m == 0 and top is None:
    return lower_array(lw, rest, pointer)
  prefix_schemas = schema.get("prefixItems", [])
  if not isinstance(prefix_schemas, list):
    raise errors.SchemaError(
        f"prefixItems at {_pointer(pointer, 'prefixItems')} is {_short(prefix_schemas)}."
        " Expected an array of schemas. Fix the value.")
  if schema.get("uniqueItems", False) is not False:
    lw.unsupported(where, (
        f"contains at {where} next to uniqueItems is not supported. Expected contains"
        " with items, prefixItems, minItems, maxItems, minContains and maxContains only."
        " Remove one of them, or pass lenient=True to ignore contains."))
    return lower_array(lw, rest, pointer)
  low = _json_keywords.count(schema, "minItems", pointer) or 0
  high = _json_keywords.count(schema, "maxItems", pointer)
  if top is not None and high is not None and top >= high:
    top = None  # maxContains can never be exceeded: no negation needed.
    if m == 0:
      return lower_array(lw, rest, pointer)
  if top is not None and top < m or high is not None and (high < low or high < m):
    return ir.NOTHING
  cap = m if top is None else top  # Matches counted up to here.
  full = high if high is not None else max(low, 1, len(prefix_schemas))  # Items counted
  # up to here: past the prefix, every position reads `items`.
  size = (full + 1) * (cap + 1)
  if full > 1 and size > MAX_CONTAINS_STATES:  # Linear in `cap` alone, as before.
    keyword, counted = ("maxItems", high) if high is not None else ("minItems", low)
    raise errors.CompileBudgetError(
        f"contains at {where} with {'maxContains' if top is not None else 'minContains'}"
        f" {cap} next to {keyword} {counted} at {_pointer(pointer, keyword)} needs an"
        f" automaton of {size} states (items written times matching items written)."
        f" Expected at most {MAX_CONTAINS_STATES}. Lower the bounds, or drop one of them.")
  negated = None
  if top is not None:
    negated = _json_negation.negate(schema["contains"],
                                    lambda ref: lw.resolve(ref, pointer), where)
  positions = []  # (item, hit, miss) at each prefix position, then for `items`.
  for i, items in [*enumerate(prefix_schemas[:full]), (None, _items(schema))]:
    at = _pointer(pointer, "items") if i is None else _pointer(pointer, "prefixItems", i)
    item = lw.lower(items, at)
    hit = lw.lower_conjunction([(items, at), (schema["contains"], where)], where)
    miss = item
    if negated is not None:
      miss = lw.lower_conjunction([(items, at), (negated, where)], where)
    positions.append((item, hit, miss))
  if top is None and all(isinstance(hit, ir.RuleRef) and lw.is_free_form(hit) and hit == item
                         for item, hit, _ in positions):
    # Every item counts (`contains: true` next to free-form items, free_form_depth=None):
    # the count is the length. (The automaton's two call arcs per position would be
    # one union of calls, which the grammar passes lift into a nondeterministic rule.)
    return lower_array(lw, {**rest, "minItems": max(low, m)}, pointer)
  ws = lw.ws
  # States: 0 start, 1 after `]`, 2 + n * (cap + 1) + k after `[` and n items of which
  # k count (n capped at `full` without a maxItems, k at `cap` without a maxContains).
  def state(n: int, k: int) -> int:
    return 2 + n * (cap + 1) + k

  arcs = [(0, ws.open(b"["), state(0, 0))]
  if low == 0 and m == 0:
    arcs.append((0, ws.empty(b"[]"), 1))
  for n in range(full + 1):
    after = n + 1 if high is not None else min(n + 1, full)
    sep = ws.comma if n else ir.EPSILON
    for k in range(min(n if high is not None or n < full else cap, cap) + 1):
      if n and n >= low and k >= m:
        arcs.append((state(n, k), ws.close(b"]"), 1))
      if high is not None and n == high:
        continue
      item, hit, miss = positions[min(n, len(positions) - 1)]
      stay = item if top is None and k == cap else miss
      arcs.append((state(n, k), ir.concat(sep, stay), state(after, k)))
      if k < cap:
        arcs.append((state(n, k), ir.concat(sep, hit), state(after, k + 1)))
  arcs = [(a, label, b) for a, label, b in arcs if label != ir.NOTHING]
  return ir.Graph(num_states=2 + size, arcs=tuple(arcs), finals=(1,))


def _lower_all_contains(lw, schema: dict, pointer: str) -> ir.Node:
  """Arrays with, for each of several `contains` schemas (`allOf` parts merged:
  `contains` and `$alsoContains`), at least one item matching it: an automaton over
  the set of those met so far, each item read as matching any subset of them.
  Refused next to `prefixItems`, `minItems`, `maxItems`, `uniqueItems`, or past
  `MAX_ALL_CONTAINS` of them."""
  where = _pointer(pointer, "contains")
  wanted = [schema["contains"], *schema["$alsoContains"]]
  others = [k for k in ("prefixItems", "minItems", "maxItems", "uniqueItems")
            if k in schema and schema[k] is not False]
  if others or len(wanted) > MAX_ALL_CONTAINS:
    raise errors.UnsupportedSchemaError(
        f"contains at {where}: {len(wanted)} different contains merged from allOf parts"
        f"{' next to ' + ', '.join(others) if others else ''} are not supported. Expected"
        f" at most {MAX_ALL_CONTAINS} of them, with items only. Merge them by hand.")
  items = _items(schema)
  at = _pointer(pointer, "items")
  item = lw.lower(items, at)
  k = len(wanted)
  full = (1 << k) - 1
  hits = {}
  for subset in range(1, full + 1):
    parts = [(items, at), *((wanted[i], where) for i in range(k) if subset >> i & 1)]
    hits[subset] = lw.lower_conjunction(parts, where)
  ws = lw.ws
  opened = 2 + full + 1  # After `[`; 2 + met after an item, met the subset so far.
  arcs = [(0, ws.open(b"["), opened), (opened, item, 2)]
  arcs += [(opened, hits[subset], 2 + subset) for subset in hits]
  for met in range(full + 1):
    arcs.append((2 + met, ir.concat(ws.comma, item), 2 + met))
    arcs += [(2 + met, ir.concat(ws.comma, hits[subset]), 2 + (met | subset))
             for subset in hits if subset & ~met]
  arcs.append((2 + full, ws.close(b"]"), 1))
  arcs = [(x, label, y) for x, label, y in arcs if label != ir.NOTHING]
  return ir.Graph(num_states=opened + 1, arcs=tuple(arcs), finals=(1,))


def _lower_unique_array(lw, schema: dict, pointer: str) -> ir.Node | None:
  """An array with `uniqueItems: true` whose every position (each of `prefixItems`,
  then `items` for the rest, up to `maxItems`) takes finitely many values, at most
  `MAX_UNIQUE_VALUES` of them all positions together (enums, booleans, small integer
  ranges): every sequence of distinct values, as an automaton over the set of values
  used so far. Distinct items make the count of items the set's size, so the set also
  says which position comes next. None after recording the keyword in lenient mode
  when that is not the case."""
  where = _pointer(pointer, "uniqueItems")
  positions = _unique_positions(lw, schema, pointer)
  if positions is None:
    strings = unique_strings(lw, schema, pointer)
    if not isinstance(strings, str) and strings is not None:
      return strings
    lenient = (" Or pass lenient=(\"uniqueItems\",) to allow repeats (other unsupported"
               " keywords still raise).")
    if isinstance(strings, str):
      lw.unsupported(where, f"uniqueItems at {where}: {strings}{lenient}")
      return None
    lw.unsupported(where, (
        f"uniqueItems at {where} needs items with at most {MAX_UNIQUE_VALUES} possible"
        " values, all positions together (an enum, booleans, a small integer range;"
        " prefixItems count too, and items: false ends the array after them), or string"
        " items: distinct values from a larger set are not a regular language. Bound the"
        f" items with an enum.{lenient}"))
    return None
  values, spellings = positions
  min_items = _json_keywords.count(schema, "minItems", pointer) or 0
  max_items = min(len(spellings), len(values))
  if min_items > max_items:
    return ir.NOTHING
  # States: 0 before `[`, 1 after `]`, 2 + mask for the set of values used so far.
  ws = lw.ws
  arcs = []
  if min_items == 0:
    arcs.append((0, ws.empty(b"[]"), 1))
  for mask in range(1 << len(values)):
    size = bin(mask).count("1")
    if size > max_items:
      continue
    if size >= max(min_items, 1):
      arcs.append((2 + mask, ws.close(b"]"), 1))
    if size == max_items:
      continue
    before = ws.open(b"[") if mask == 0 else ws.comma
    source = 0 if mask == 0 else 2 + mask
    for j, spelled in spellings[size].items():
      if not mask >> j & 1:
        arcs.append((source, ir.concat(before, spelled), 2 + (mask | 1 << j)))
  return ir.Graph(num_states=2 + (1 << len(values)), arcs=tuple(arcs), finals=(1,))


def _unique_positions(lw, schema: dict, pointer: str):
  """(the distinct values as canonical JSON texts; for each position an array may
  reach, value index -> the IR of its spellings there) for `_lower_unique_array`, or
  None when a reachable position takes infinitely many values or all together more
  than `MAX_UNIQUE_VALUES`.

  Past `prefixItems` every position reads `items`: one more entry stands for all of
  them, repeated up to `MAX_UNIQUE_VALUES` positions (no more distinct values exist).
  """
  prefix_schemas = schema.get("prefixItems", [])
  if not isinstance(prefix_schemas, list):
    raise errors.SchemaError(
        f"prefixItems at {_pointer(pointer, 'prefixItems')} is {_short(prefix_schemas)}."
        " Expected an array of schemas. Fix the value.")
  max_items = _json_keywords.count(schema, "maxItems", pointer)
  limit = MAX_UNIQUE_VALUES if max_items is None else min(max_items, MAX_UNIQUE_VALUES)
  nodes = [lw.lower(s, _pointer(pointer, "prefixItems", i))
           for i, s in enumerate(prefix_schemas[:limit])]
  if len(nodes) < limit:
    rest = lw.lower(_items(schema), _pointer(pointer, "items"))
    nodes += [rest] * (limit - len(nodes))
  values: dict[str, int] = {}
  spellings = []
  for position, node in enumerate(nodes):
    # No array reaches this position when nothing meets it, or when the positions
    # before it take fewer distinct values than there are of them.
    if node == ir.NOTHING or len(values) < position:
      break
    groups = _distinct_values(node)
    if groups is None:
      return None
    at = {}
    for value, group in groups.items():
      at[values.setdefault(value, len(values))] = group
    if len(values) > MAX_UNIQUE_VALUES:
      return None
    spellings.append(at)
  return list(values), spellings


def unique_strings(lw, schema: dict, pointer: str) -> ir.Node | str | None:
  """An array with `uniqueItems: true` of string items, the items checked distinct on
  the device (`automata/_unique_strings.py`): a block of register words keeps a hash of
  each item, `uopen`/`uclose` markers around each item's body, and the items are counted
  as in `counted_array` (at most `maxItems`, else `DEFAULT_UNIQUE_STRINGS`). Items are
  written canonically (one spelling per string, `json.dumps`), so equal strings have
  equal bytes.

  Returns the IR; None when the items are not strings; or why such an array cannot be
  checked (a sentence for the error message).
  """
  if "prefixItems" in schema:
    return None
  body = _string_body(lw.lower(_items(schema), _pointer(pointer, "items")))
  if body is None:
    return None
  # Below a union of objects (`use_registers` off there) the markers of two alternatives
  # that disagree meet before any byte and fail to fold (`_registers.RegisterError`):
  # the compiler then lowers again with property_order="any_bounded", refused here.
  # Inside a recursive schema the block stays in the row's registers while the stack
  # works: string items contain no call, so it is never live across a push.
  if not (lw.registers_allowed and lw.options.property_order == "any"):
    return ("string items are checked distinct in register words on the device, which"
            " property_order other than 'any' does not use (nor alternatives of"
            " anyOf/oneOf whose arrays differ, which the compiler then lowers with"
            " property_order='any_bounded'). Expected the array alike in every"
            " alternative, and property_order='any'.")
  min_items = _json_keywords.count(schema, "minItems", pointer) or 0
  max_items = _json_keywords.count(schema, "maxItems", pointer)
  cap = max(DEFAULT_UNIQUE_STRINGS, min_items) if max_items is None else max_items
  if cap > MAX_UNIQUE_STRINGS:
    keyword = "minItems" if max_items is None else "maxItems"
    return (f"{keyword} at {_pointer(pointer, keyword)} allows {cap} distinct strings;"
            f" a row keeps the hashes of at most {MAX_UNIQUE_STRINGS}. Expected"
            f" {keyword} <= {MAX_UNIQUE_STRINGS}.")
  if min_items > cap:
    return ir.NOTHING
  if not _endless(body):
    return ("its string items can be finished in only finitely many ways after some"
            " prefix (a maxLength, an enum, or a pattern with a bounded end), and a row"
            " would have to foresee that every ending is taken. Expected items of"
            " unbounded length, such as {\"type\": \"string\"} or a pattern ending in"
            " + or *.")
  block = lw.register_blocks.setdefault(("unique strings", cap), lw.register_words)
  if block == lw.register_words:
    lw.register_words += 3 + 2 * cap
  count = lw.register_blocks.setdefault(("unique strings count", cap), lw.register_words)
  if count == lw.register_words:
    lw.register_words += 1
  lw.log.info("JSON Schema: the array at %s keeps its strings distinct on the device.",
              pointer)
  item = ir.concat(ir.Marker("uopen", block, 0), ir.Bytes(b'"'), body,
                   ir.Marker("uclose", block, cap), ir.Bytes(b'"'))
  return ir.concat(ir.Marker("clear", block + 2, 0),
                   counted_array(item, lw.ws, min_items, cap, count))


def _string_body(node: ir.Node) -> ir.Node | None:
  """The canonical bodies of the JSON strings `node` denotes (quotes off, any spelling
  that is not `json.dumps`' left out), or None when it denotes anything but strings."""
  def strip(node, last: bool):
    match node:
      case ir.Bytes(data) if data[-1:] == b'"' if last else data[:1] == b'"':
        return ir.Bytes(data[:-1] if last else data[1:])
      case ir.Concat(parts) if parts:
        end = strip(parts[-1] if last else parts[0], last)
        if end is None:
          return None
        return ir.concat(*parts[:-1], end) if last else ir.concat(end, *parts[1:])
      case ir.Union(alternatives) if alternatives:
        stripped = [strip(a, last) for a in alternatives]
        return None if None in stripped else ir.union(*stripped)
    return None

  opened = strip(node, False)
  body = None if opened is None else strip(opened, True)
  return None if body is None else _canonical(body)


_ANY_CHARACTER = jv.encode_text(ir.char_class([(0, ir.MAX_CODE_POINT)]))


def _canonical(node: ir.Node) -> ir.Node:
  """`node` with the full JSON string syntax (`jv.STRING_CHAR`: every escape) replaced by
  canonical characters: a narrowing to one spelling per string."""
  if node == jv.STRING_CHAR:
    return _ANY_CHARACTER
  match node:
    case ir.Concat(parts):
      return ir.concat(*(_canonical(p) for p in parts))
    case ir.Union(alternatives) if alternatives:
      return ir.union(*(_canonical(a) for a in alternatives))
    case ir.Repeat(body, lo, hi):
      return ir.repeat(_canonical(body), lo, hi)
    case ir.Graph(num_states, arcs, finals):
      return ir.Graph(num_states, tuple((a, _canonical(label), b) for a, label, b in arcs),
                      finals)
  return node


def _endless(body: ir.Node) -> bool:
  """Whether every prefix of a text of `body` has infinitely many completions (a cycle
  is reachable from every state of its trimmed byte DFA)."""
  from constrained_decoding.automata import _fsa  # pylint: disable=g-import-not-at-top

  dfa = _fsa.compile_byte_dfa(body)
  if dfa.num_states == 0:
    return False
  successors = [set(row[row >= 0].tolist()) for row in dfa.transitions]
  finite = [False] * dfa.num_states
  changed = True
  while changed:  # A state is finite when all its successors are.
    changed = False
    for q in range(dfa.num_states):
      if not finite[q] and all(finite[t] for t in successors[q]):
        finite[q] = changed = True
  return not any(finite)


def lower_array(lw, schema: dict, pointer: str) -> ir.Node:
  """The JSON arrays `schema` accepts (see the module doc)."""
  if "contains" in schema:
    return _lower_contains(lw, schema, pointer)
  ws = lw.ws
  unique = schema.get("uniqueItems", False)
  if not isinstance(unique, bool):
    raise errors.SchemaError(
        f"uniqueItems at {_pointer(pointer, 'uniqueItems')} is {_short(unique)}. Expected"
        " true or false. Fix the value.")
  if unique:
    node = _lower_unique_array(lw, schema, pointer)
    if node is not None:
      return node
  prefix_schemas = schema.get("prefixItems", [])
  if not isinstance(prefix_schemas, list):
    raise errors.SchemaError(
        f"prefixItems at {_pointer(pointer, 'prefixItems')} is {_short(prefix_schemas)}."
        " Expected an array of schemas. Fix the value."
    )
  min_items = _json_keywords.count(schema, "minItems", pointer) or 0
  max_items = _json_keywords.count(schema, "maxItems", pointer)
  prefix = []
  for i, subschema in enumerate(prefix_schemas):
    if max_items is not None and i >= max_items:
      break
    node = lw.lower(subschema, _pointer(pointer, "prefixItems", i))
    if node == ir.NOTHING:  # No array reaches this position.
      max_items = i if max_items is None else min(max_items, i)
      break
    prefix.append(node)
  rest = lw.lower(_items(schema), _pointer(pointer, "items"))
  if rest == ir.NOTHING:
    max_items = len(prefix) if max_items is None else min(max_items, len(prefix))
  if max_items is not None and max_items < min_items:
    return ir.NOTHING
  if not prefix:
    copies = max(min_items, max_items or 0) - 1
    if (copies > 0 and lw.use_registers and lw.options.property_order == "any"
        and _json_objects.ir_size(rest, lw.memos["size"]) * copies > MAX_COPIED_ITEMS
        # A callee that may use registers could clear the count (`_json_object_schemas`).
        and not _json_object_schemas.calls_register_rule(lw, rest)):
      key = ("array", rest, min_items, max_items)
      word = lw.register_blocks.setdefault(key, lw.register_words)
      if word == lw.register_words:
        lw.register_words += 1
      lw.log.info("JSON Schema: the array at %s counts its items on the device (a register).",
                  pointer)
      return counted_array(rest, ws, min_items, max_items, word)
    return jv.delimited(b"[", b"]", rest, ws, min_items, max_items)
  k = len(prefix)
  more_min = max(0, min_items - k)
  more_max = None if max_items is None else max_items - k
  if rest == ir.NOTHING:
    tail = ir.EPSILON if more_min == 0 else ir.NOTHING
  else:
    tail = ir.repeat(ir.concat(ws.comma, rest), more_min, more_max)
  for i in reversed(range(1, k)):  # `tail`: what may follow the first i elements.
    step = ir.concat(ws.comma, prefix[i], tail)
    tail = ir.union(ir.EPSILON, step) if i >= min_items else step
  parts = [ws.empty(b"[]")] if min_items == 0 else []
  parts.append(ir.concat(ws.open(b"["), prefix[0], tail, ws.close(b"]")))
  return ir.union(*parts)


def counted_array(item: ir.Node, ws: jv.Whitespace, min_items: int, max_items: int | None,
                  word: int) -> ir.Node:
  """Arrays of `min_items..max_items` items with the item written once: register `word`
  counts the commas (`automata/_registers.py`).

  `clear [` (gap) item (gap `count` `,` (gap) item)* (gap) `atleast` `]`, and `[]` when
  no item is needed. `count` (fails when `max_items - 1` commas are written, never
  without `maxItems`: it only counts for `atleast`) sits right
  before `,` and `atleast` (fails below `min_items - 1`) right before `]`, so a row whose
  count is full still has `]`, and one below the minimum still has `,`: never a dead
  end. `clear` goes before `[`, where no other path reads the same bytes.
  """
  bound = jv.UNBOUNDED_COUNT if max_items is None else max_items - 1
  comma = jv.counted_comma(ws, ir.Marker("count", word, bound))
  atleast = [ir.Marker("atleast", word, min_items - 1)] if min_items > 1 else []
  body = jv.separated(ws.open(b"["), item, comma, ir.concat(ws.gap, *atleast, ir.Bytes(b"]")))
  if min_items == 0:
    body = ir.union(ws.empty(b"[]"), body)
  return ir.concat(ir.Marker("clear", word, 0), body)


def _distinct_values(node: ir.Node) -> dict[str, ir.Node] | None:
  """The JSON values of a finite IR of JSON texts (canonical JSON text -> the IR of its
  texts: a value may have several spellings, whitespace), or None when there are too
  many or infinitely many texts."""
  texts = _finite_texts(node, 4 * MAX_UNIQUE_VALUES)
  if texts is None:
    return None
  spellings: dict[str, list[bytes]] = {}
  for text in sorted(texts):
    value = json.dumps(json.loads(text), sort_keys=True)
    spellings.setdefault(value, []).append(text)
  return {value: ir.union(*(ir.Bytes(t) for t in group))
          for value, group in spellings.items()}


def _finite_texts(node: ir.Node, limit: int) -> set[bytes] | None:
  """All byte strings of `node` if there are at most `limit`, else None."""
  match node:
    case ir.Bytes(data):
      return {data}
    case ir.CharClass(ranges) | ir.ByteClass(ranges):
      if sum(hi - lo + 1 for lo, hi in ranges) > limit:
        return None
      if isinstance(node, ir.ByteClass):
        return {bytes([b]) for lo, hi in ranges for b in range(lo, hi + 1)}
      return {chr(c).encode() for lo, hi in ranges for c in range(lo, hi + 1)}
    case ir.Concat(parts):
      out = {b""}
      for part in parts:
        texts = _finite_texts(part, limit)
        if texts is None or len(out) * len(texts) > limit:
          return None
        out = {a + b for a in out for b in texts}
      return out
    case ir.Union(alternatives):
      out = set()
      for alternative in alternatives:
        texts = _finite_texts(alternative, limit)
        if texts is None:
          return None
        out |= texts
        if len(out) > limit:
          return None
      return out
    case ir.Repeat(body, lo, hi):
      if hi is None:
        return None
      return _finite_texts(ir.union(*(ir.concat(*[body] * n) for n in range(lo, hi + 1))),
                           limit)
  return None  # Graphs, fragments and terminals: not enumerated.
