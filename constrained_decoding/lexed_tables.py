"""`LexedTables`: the host -> device contract of grammars with a lexer (issue 18).

What `cd.Compiler(vocab).compile(cd.Grammar(..., lexer=True))` returns, and what the
public runtime functions (`cd.init_state`, `cd.allowed_bits`, `cd.advance`, ...) step
with `runtime/_lexed.py` when they are given it instead of `ConstraintTables`: the
two-level tables of `constraints/_lexed_arrays.LexedArrays` (a lexer-state x token
table and canonical LR(1) tables), without the host information. Like
`ConstraintTables` it holds numpy arrays on the host and jax arrays (or tracers) on the
device, and is registered as a JAX pytree right here, so it goes straight into
`jax.jit`, `jax.device_put` and the decode loops; importing this module imports jax,
never pynini.

Public:
  LexedTables                               the tables (an immutable pytree).
  lexed_tables_from_arrays(arrays, ...)     them from a host `LexedArrays`.
  lane_prefix_tables(state_seq_lanes, seq_items)   the derived lane-prefix tables.
  chain_shift_table(goto_chain, action, class_members)   the derived goto + shift table.
"""

import dataclasses

import jax
import numpy as np
from jaxtyping import Array, Bool, Int, UInt32

from constrained_decoding import _arrays


# numpy on the host, jax arrays (or tracers) on the device.
_Arr = np.ndarray | Array

# The device arrays, in `LexedArrays.ARRAY_FIELDS` order.
_ARRAY_FIELDS = (
    "lex_start", "lr_start", "state_outcomes", "state_seq_lanes", "state_slot_lane",
    "outcome_seq", "outcome_final", "seq_items", "class_members", "state_big_slot",
    "state_big_row", "set_bits", "state_small_tokens", "state_small_slot",
    "state_viable", "state_free", "state_end_item", "state_end_tail", "state_nl_any",
    "state_nl_width", "class_width", "class_paren", "nl_needs_indent", "max_width",
    "eos_bits", "action", "action_bits", "goto_id", "goto_chain", "rule_lhs", "rule_len")
# Static: they fix shapes (logits width, stack widths), or name the vocabulary (one
# value per vocabulary, so grammars of one vocabulary still share compiled steps).
_META_FIELDS = ("vocab_size", "stack_depth", "indent_depth", "vocab_fingerprint")
# Derived from the array fields on the host when the tables are made (never saved):
# each lexer state's distinct lane prefixes (first two lexemes), so a step runs each
# once per row (`runtime/_lexed_lanes.py`, `lane_prefix_tables`); `goto_chain` with the
# shift that follows each reduction (`chain_shift_table`).
_DERIVED_FIELDS = ("state_prefix_items", "state_lane_prefix", "goto_chain_shift")


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class LexedTables:
  """Two-level tables of a grammar with a lexer, for the device (an immutable pytree).

  ```python
  tables = cd.Compiler(vocab).compile(cd.Grammar.builtin("python"))
  state = cd.init_state(tables, batch_size=4)
  state = cd.advance(tables, state, tokens)
  ```

  Fields: as `constraints._lexed_arrays.LexedArrays` (S lexer states, K outcome slots
  per state, L lexemes per token, Q parser states, T terminals in Tw words, W = ceil(V
  / 32) words).
  """
  lex_start: Int[_Arr, "G"]
  lr_start: Int[_Arr, "G"]
  state_outcomes: Int[_Arr, "S K"]
  state_seq_lanes: Int[_Arr, "S Ks"]
  state_slot_lane: Int[_Arr, "S K"]
  outcome_seq: Int[_Arr, "O"]
  outcome_final: Int[_Arr, "O"]
  seq_items: Int[_Arr, "Qs L"]
  class_members: Int[_Arr, "C M"]
  state_big_slot: Int[_Arr, "S Kb"]
  state_big_row: Int[_Arr, "S Kb"]
  set_bits: UInt32[_Arr, "Mb W"]
  state_small_tokens: Int[_Arr, "S N"]
  state_small_slot: Int[_Arr, "S N"]
  state_viable: UInt32[_Arr, "S Tw"]
  state_free: Bool[_Arr, "S"]
  state_end_item: Int[_Arr, "S"]
  state_end_tail: Int[_Arr, "S"]
  state_nl_any: Bool[_Arr, "S"]
  state_nl_width: Bool[_Arr, "S"]
  class_width: Int[_Arr, "C"]
  class_paren: Int[_Arr, "C"]
  nl_needs_indent: Bool[_Arr, "Q"]
  max_width: Int[_Arr, ""]
  eos_bits: UInt32[_Arr, "W"]
  action: Int[_Arr, "Q T"]
  action_bits: UInt32[_Arr, "Q Tw"]
  goto_id: Int[_Arr, "Q Nt"]
  goto_chain: Int[_Arr, "E T"]
  rule_lhs: Int[_Arr, "R"]
  rule_len: Int[_Arr, "R"]
  vocab_size: int
  stack_depth: int
  indent_depth: int
  # `Vocabulary.fingerprint` of the vocabulary the tables were compiled for ("" when
  # unknown): `generate` checks it against the model's, as for `ConstraintTables`.
  vocab_fingerprint: str = ""
  # Derived (`lane_prefix_tables`), filled in from `state_seq_lanes` and `seq_items`
  # when those are concrete; None inside transformations that rebuild the tables from
  # other leaves (the runtime then runs every lane from its first lexeme).
  state_prefix_items: Int[_Arr, "S F P"] | None = None
  state_lane_prefix: Int[_Arr, "S Ks"] | None = None
  # Derived (`chain_shift_table`) from `goto_chain`, `action` and `class_members` when
  # those are concrete (None: the runtime looks the shift up in `action`).
  goto_chain_shift: Int[_Arr, "E T"] | None = None

  def __post_init__(self):
    if self.state_prefix_items is None and _concrete(self.state_seq_lanes, self.seq_items):
      prefixes, lane_prefix = lane_prefix_tables(np.asarray(self.state_seq_lanes),
                                                 np.asarray(self.seq_items))
      object.__setattr__(self, "state_prefix_items", prefixes)
      object.__setattr__(self, "state_lane_prefix", lane_prefix)
    if (self.goto_chain_shift is None
        and _concrete(self.goto_chain, self.action, self.class_members)):
      object.__setattr__(self, "goto_chain_shift", chain_shift_table(
          np.asarray(self.goto_chain), np.asarray(self.action),
          np.asarray(self.class_members)))

  @property
  def num_constraints(self) -> int:
    """Number of stacked grammars (rows pick theirs with `constraint_ids`)."""
    return int(np.shape(self.lex_start)[0])

  @property
  def shape_key(self) -> tuple:
    """Tables with equal keys share one compiled step function."""
    return (tuple(np.shape(getattr(self, f)) for f in _ARRAY_FIELDS + _DERIVED_FIELDS),
            self.vocab_size,
            self.stack_depth, self.indent_depth)

  @property
  def nbytes(self) -> dict:
    """Bytes of each device array, and their "total"."""
    out = {f: int(np.asarray(getattr(self, f)).nbytes) for f in _ARRAY_FIELDS
           + _DERIVED_FIELDS if getattr(self, f) is not None}
    out["total"] = sum(out.values())
    return out

  def replace(self, **changes) -> "LexedTables":
    if {"state_seq_lanes", "seq_items"} & changes.keys():  # derived again from the new
      changes = {**dict.fromkeys(_DERIVED_FIELDS[:2]), **changes}
    if {"goto_chain", "action", "class_members"} & changes.keys():
      changes = {"goto_chain_shift": None, **changes}
    return dataclasses.replace(self, **changes)

  def save(self, path, *, vocab, description: str = "") -> None:
    """Writes the tables to one file that `cd.load_tables` reads without pynini.

    As `ConstraintTables.save`: `vocab` is the `Vocabulary` they were compiled for (its
    fingerprint is stored and checked on load); `description` is free text, e.g.
    `spec.describe()`. The format is in `_tables_file.py`.

    Raises:
      VocabularyMismatchError: `vocab` is not the vocabulary of the tables.
    """
    from constrained_decoding import _tables_file  # pylint: disable=g-import-not-at-top  (cycle)

    _tables_file.save_tables(self, path, vocab=vocab, description=description)

  def __repr__(self) -> str:
    return (f"LexedTables(grammars={self.num_constraints}, "
            f"lexer_states={np.shape(self.state_free)[0]}, "
            f"parser_states={np.shape(self.action)[0]}, vocab_size={self.vocab_size}, "
            f"stack_depth={self.stack_depth}, indent_depth={self.indent_depth})")


jax.tree_util.register_dataclass(
    LexedTables, data_fields=list(_ARRAY_FIELDS + _DERIVED_FIELDS),
    meta_fields=list(_META_FIELDS))


def _concrete(*arrays) -> bool:
  """Whether every array is a concrete 2-d array (numpy, or jax outside tracing)."""
  return all(isinstance(a, (np.ndarray, jax.Array)) and a.ndim == 2
             and not isinstance(a, jax.core.Tracer) for a in arrays)


def lane_prefix_tables(state_seq_lanes: np.ndarray, seq_items: np.ndarray,
                       length: int = 2):
  """Each lexer state's distinct lane prefixes and each lane's index among them.

  Lanes of a state that start with the same lexemes run the same first micro-steps on
  the same row (deterministic), so the runtime runs each prefix (the first `length`
  lexemes, or the whole sequence when shorter) once per row and starts its lanes after
  it (docs/lexer_runtime.md, "Lane schedule").

  Returns:
    (state_prefix_items int32 [S, F, length]: the distinct prefixes of a state's lanes
    (lexeme classes, -1 past a shorter sequence), in ascending order, rows of -1 as
    padding (F >= 1); state_lane_prefix [S, Ks]: the row there of each lane's prefix, -1
    for padding and lanes without lexemes; int16 below 32,768 rows).
  """
  lanes = np.asarray(state_seq_lanes)
  items = np.asarray(seq_items)
  items = np.pad(items, [(0, 0), (0, max(0, length - items.shape[1]))],
                 constant_values=-1)[:, :length]
  # One key per live lane: (state, prefix digits in base C + 2, -1 as 0), so one sort
  # finds every state's distinct prefixes in ascending order. The digits are coded once
  # per sequence, and the keys are int32 where they fit (Python with Gemma 3: 803 states
  # x 155^2 codes): 12 -> 8 ms of CPU against int64 keys coded per lane and np.unique.
  radix = int(max(items.max(initial=0), 0)) + 2
  span = radix ** length
  code = np.zeros(items.shape[0], np.int64)
  for k in range(length):
    code = code * radix + (items[:, k].astype(np.int64) + 1)
  dtype = np.int32 if lanes.shape[0] * span < 2**31 else np.int64
  live = (lanes >= 0) & (items[np.maximum(lanes, 0), 0] >= 0)
  key = (np.arange(lanes.shape[0], dtype=dtype)[:, None] * span
         + code[np.maximum(lanes, 0)].astype(dtype))[live]
  distinct = _arrays.sorted_unique(key)
  state = distinct // span
  column = np.arange(len(distinct)) - np.searchsorted(state, state)
  width = int(column.max(initial=0)) + 1
  out = np.full((lanes.shape[0], width, length), -1, np.int32)
  rest = distinct % span
  for k in reversed(range(length)):
    out[state, column, k] = rest % radix - 1
    rest //= radix
  lane_prefix = np.full(lanes.shape, -1, np.int16 if width < 2**15 else np.int32)
  lane_prefix[live] = column[np.searchsorted(distinct, key)]
  return out, lane_prefix


def chain_shift_table(goto_chain: np.ndarray, action: np.ndarray,
                      class_members: np.ndarray) -> np.ndarray | None:
  """`goto_chain` [E, T] with, for each entry, the shift the same terminal takes next.

  A lane's reduction on terminal t enters `goto_chain[e, t]` (state q, or -1); its next
  micro-step shifts the lexeme there when t is the first member of the lexeme's class
  that q has an action for and that action is a shift. Packed per (e, t) in one int32:
  `q + 1` in the low 16 bits, `s + 1` above, s the shift's target, or -1 where q takes
  no shift on t or where an earlier member of a class holding t has an action at q (the
  next micro-step might take that member: no shift is fused there; exact either way).
  So a micro-step reads the goto and the following shift in one gather
  (`runtime/_lexed_lanes.py`). None where parser states pass 65,534.
  """
  chain = np.asarray(goto_chain).astype(np.int32)
  action = np.asarray(action)
  if action.shape[0] >= 2**16 - 1:
    return None
  state = np.maximum(chain, 0)
  terms = np.arange(chain.shape[1])[None, :]
  act = np.where(chain >= 0, action[state, terms], 0)
  blocked = np.zeros(chain.shape, bool)
  for row in np.asarray(class_members):
    row = row[row >= 0]
    for k in range(1, len(row)):  # an earlier member with an action at q
      blocked[:, row[k]] |= (action[state[:, row[k]][:, None], row[:k][None, :]]
                             != 0).any(axis=1)
  shift = np.where((act > 0) & ~blocked, act - 1, -1)
  return ((chain + 1) | ((shift + 1) << 16)).astype(np.int32)


def lexed_tables_from_arrays(arrays, *, vocab_fingerprint: str = "") -> LexedTables:
  """`LexedTables` (numpy arrays, on the host) from a host `LexedArrays`."""
  return LexedTables(
      **{f: np.asarray(getattr(arrays, f)) for f in _ARRAY_FIELDS},
      vocab_size=int(arrays.vocab_size), stack_depth=int(arrays.stack_depth),
      indent_depth=int(arrays.indent_depth), vocab_fingerprint=vocab_fingerprint)
