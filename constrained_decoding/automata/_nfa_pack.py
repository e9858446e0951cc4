"""An epsilon-free `_nfa.Nfa` (or arc columns) -> OpenFst's binary formats, as bytes.

`pywrapfst.Fst.read_from_string` parses such bytes in one C++ call: the `vector` format
(`pack_bytes`, `pack_arcs`), ~2x faster than `add_arc`, and the `const` format
(`pack_const`, `pack_const_arcs`), one copy, ~20x faster again. Labels are `_nfa`'s:
label `k + 1` is class `k` of the byte classes `edges`, 0 is epsilon. Packing also
tells whether the NFA is already deterministic, so that `_fsa` can skip determinization.

Public names:
  pack_bytes(nfa, edges, finals)   the `vector` bytes, and whether already deterministic.
  pack_arcs(num_states, start, accepting, arc_state, label, dst)  the same from arc columns.
  pack_const(nfa, edges, finals), pack_const_arcs(...)  the same in the `const` format.
  binary_header(fst_type)          the start of an OpenFst binary file.
  CONST_STATE                      the `const` format's state record, as a numpy dtype.
"""

import itertools
import struct

import numpy as np

from constrained_decoding.automata._nfa import EPSILON_LABEL, Nfa

_MAGIC = 2125659606  # OpenFst's binary FST magic number.
_FILE_VERSION = 2  # VectorFst file version.
# kExpanded | kMutable | kAcceptor: what `VectorFst` itself would set for our NFA.
# The other property bits stay "unknown", so OpenFst computes them when it needs them.
_NFA_PROPERTIES = 0x1 | 0x2 | 0x10000

_INF_BITS = 0x7F800000  # Tropical Zero (inf) as the bits of a little-endian float32.


def _string_field(text: bytes) -> bytes:
  return struct.pack("<i", len(text)) + text


def binary_header(fst_type: bytes) -> bytes:
  """The start of an OpenFst binary file of `fst_type` (b"vector", b"const") over
  standard arcs: magic, fst type, arc type, version, flags (0: no symbol tables); the
  properties (uint64), start, number of states and of arcs (int64 each) follow."""
  return (struct.pack("<i", _MAGIC) + _string_field(fst_type) + _string_field(b"standard")
          + struct.pack("<ii", _FILE_VERSION, 0))


_HEADER_PREFIX = binary_header(b"vector")
_CONST_HEADER_PREFIX = binary_header(b"const")
# kExpanded | kAcceptor: a `ConstFst` is not mutable; the other bits stay unknown.
_CONST_PROPERTIES = 0x1 | 0x10000
# The `const` format's fixed-size state record (ConstFst::State); its arcs follow all
# the states, 4 words each (label, label, weight, next).
CONST_STATE = np.dtype([
    ("final", "<f4"), ("first_arc", "<u4"), ("num_arcs", "<u4"),
    ("num_input_epsilons", "<u4"), ("num_output_epsilons", "<u4"),
])



def pack_bytes(nfa: Nfa, edges: list[int], finals) -> tuple[bytes, bool]:
  """The NFA in OpenFst's binary `vector` format, label `k + 1` meaning class `k`.

  `read_from_string` parses this in one C++ call, about twice as fast as `add_arc`.
  Every field of a state record is one or two 32-bit words (weights are float32, the
  arc count an int64), so the records are packed as one list of ints: weight One (0.0)
  is the word 0 and Zero (inf) is `_INF_BITS`.

  Returns:
    The bytes, and whether the NFA is already deterministic (no epsilon arcs, no
    label twice on one state), in which case determinization can be skipped.
  """
  if not nfa.epsilons and len(nfa.arcs) >= 64:  # Below that, numpy's overhead loses.
    return _pack_bytes_numpy(nfa, edges, finals)
  class_of = {edge: k for k, edge in enumerate(edges)}
  words: list[int] = []  # `words += tuple` is cheaper than a `words.extend` call.
  epsilons = nfa.epsilons
  deterministic = not epsilons
  for state, arcs in enumerate(nfa.arcs):
    final = 0 if state in finals else _INF_BITS
    num_ranges = len(arcs)
    if num_ranges == 3 and state not in epsilons:  # Fast path: one arc, one class.
      lo, hi, dst = arcs
      label = class_of[lo] + 1
      if label == class_of[hi + 1]:
        words += (final, 1, 0, label, label, 0, dst)
        continue
    header = len(words)
    words += (final, 0, 0)
    for target in epsilons.get(state, ()):
      words += (EPSILON_LABEL, EPSILON_LABEL, 0, target)
    for k in range(0, num_ranges, 3):
      dst = arcs[k + 2]
      first, last = class_of[arcs[k]] + 1, class_of[arcs[k + 1] + 1]
      if first == last:
        words += (first, first, 0, dst)
      else:
        for label in range(first, last + 1):
          words += (label, label, 0, dst)
    count = (len(words) - header - 3) // 4
    words[header + 1] = count
    # Deterministic: no label twice among the state's arcs (one set per state).
    if deterministic and count > 1 and len(set(words[header + 3::4])) != count:
      deterministic = False
  num_arcs = (len(words) - 3 * len(nfa.arcs)) // 4
  header = _HEADER_PREFIX + struct.pack(
      "<Qqqq", _NFA_PROPERTIES, 0, len(nfa.arcs), num_arcs
  )
  # `struct.pack` converts a list of ints faster than `array` or numpy do.
  return header + struct.pack(f"<{len(words)}i", *words), deterministic


def _pack_bytes_numpy(nfa: Nfa, edges: list[int], finals) -> tuple[bytes, bool]:
  """`pack_bytes` for an NFA without epsilon arcs, with numpy instead of a loop per arc.

  The same bytes: state records in state order, each the final weight, the arc count
  (int64) and the arcs `(label, label, weight One, next)` in the order of the state's
  ranges, labels ascending within a range.
  """
  accepting, arc_state, label, dst, deterministic = _numpy_arcs(nfa, edges, finals)
  return pack_arcs(len(accepting), 0, accepting, arc_state, label, dst), deterministic


def _numpy_arcs(nfa: Nfa, edges: list[int], finals):
  """(accepting, arc state, label, next, deterministic) of an epsilon-free NFA, with
  numpy: one arc per class of each range, in the order of the state's ranges, labels
  ascending within a range; deterministic when no state has two arcs with one label."""
  arcs = nfa.arcs
  num_states = len(arcs)
  per_state = np.fromiter(map(len, arcs), np.int64, num_states) // 3
  flat = np.fromiter(itertools.chain.from_iterable(arcs), np.int64, 3 * int(per_state.sum()))
  bounds = np.asarray(edges, np.int64)
  first = np.searchsorted(bounds, flat[0::3]) + 1  # Label of the class of lo.
  last = np.searchsorted(bounds, flat[1::3] + 1)  # Label of the class ending at hi.
  labels_per_range = last - first + 1
  range_state = np.repeat(np.arange(num_states), per_state)
  ends = np.cumsum(labels_per_range)
  num_arcs = int(ends[-1]) if len(ends) else 0
  label = np.repeat(first - (ends - labels_per_range), labels_per_range) + np.arange(num_arcs)
  arc_state = np.repeat(range_state, labels_per_range)
  accepting = np.zeros(num_states, bool)
  final_states = np.fromiter(finals, np.int64)
  accepting[final_states[final_states < num_states]] = True
  key = arc_state * (len(edges) + 1) + label
  if num_states * (len(edges) + 1) <= 1 << 22:
    deterministic = num_arcs == 0 or int(np.bincount(key).max()) <= 1
  else:
    key.sort()
    deterministic = not (key[1:] == key[:-1]).any()
  return accepting, arc_state, label, np.repeat(flat[2::3], labels_per_range), deterministic


def pack_const(nfa: Nfa, edges: list[int], finals) -> tuple[bytes, bool]:
  """An epsilon-free NFA in OpenFst's binary `const` format, label `k + 1` meaning class
  `k`, and whether it is deterministic (no label twice on one state).

  `pywrapfst.Fst.read_from_string` takes a `ConstFst` in one copy, ~20x faster than a
  `vector` file (one allocation per state); determinization reads either. The same arcs
  as `pack_bytes`, in the same order.

  Raises:
    ValueError: The NFA has epsilon arcs (`remove_epsilons` first).
  """
  if nfa.epsilons:
    raise ValueError("Expected an NFA without epsilon arcs; call remove_epsilons first.")
  if len(nfa.arcs) >= 64:  # Below that, numpy's overhead loses.
    accepting, arc_state, label, dst, deterministic = _numpy_arcs(nfa, edges, finals)
    return pack_const_arcs(len(accepting), 0, accepting, arc_state, label, dst), deterministic
  class_of = {edge: k for k, edge in enumerate(edges)}
  state_words: list[int] = []  # Per state: final weight, first arc, arcs, 0, 0.
  arc_words: list[int] = []  # Per arc: label, label, weight One, next.
  deterministic = True
  for state, arcs in enumerate(nfa.arcs):
    begin = len(arc_words)
    for k in range(0, len(arcs), 3):
      dst = arcs[k + 2]
      first, last = class_of[arcs[k]] + 1, class_of[arcs[k + 1] + 1]
      for label in range(first, last + 1):
        arc_words += (label, label, 0, dst)
    count = (len(arc_words) - begin) >> 2
    state_words += (0 if state in finals else _INF_BITS, begin >> 2, count, 0, 0)
    if deterministic and count > 1 and len(set(arc_words[begin::4])) != count:
      deterministic = False
  header = _CONST_HEADER_PREFIX + struct.pack(
      "<Qqqq", _CONST_PROPERTIES, 0, len(nfa.arcs), len(arc_words) >> 2)
  # `struct.pack` converts a list of ints faster than `array` or numpy do.
  return (header + struct.pack(f"<{len(state_words)}i", *state_words)
          + struct.pack(f"<{len(arc_words)}i", *arc_words)), deterministic


def pack_const_arcs(num_states: int, start: int, accepting: np.ndarray, arc_state: np.ndarray,
                    label: np.ndarray, dst: np.ndarray) -> bytes:
  """`pack_arcs` in the `const` format: the `CONST_STATE` records (final weight One if
  `accepting`, else Zero; first arc; arc count; no epsilons), then all arcs
  `(label, label, One, next)`. `arc_state` must be non-decreasing."""
  num_arcs = len(arc_state)
  arc_count = np.bincount(arc_state, minlength=num_states)
  states = np.zeros(num_states, CONST_STATE)
  states["final"] = np.where(accepting, np.float32(0), np.float32(np.inf))
  states["first_arc"] = np.cumsum(arc_count) - arc_count
  states["num_arcs"] = arc_count
  arcs = np.zeros((num_arcs, 4), "<i4")
  arcs[:, 0] = label
  arcs[:, 1] = label
  arcs[:, 3] = dst
  header = _CONST_HEADER_PREFIX + struct.pack("<Qqqq", _CONST_PROPERTIES, start, num_states,
                                              num_arcs)
  return header + states.tobytes() + arcs.tobytes()


def pack_arcs(num_states: int, start: int, accepting: np.ndarray, arc_state: np.ndarray,
              label: np.ndarray, dst: np.ndarray) -> bytes:
  """An epsilon-free acceptor in OpenFst's binary `vector` format (`pack_bytes`'s
  layout): per state its final weight (One if `accepting`, else Zero), arc count and
  arcs `(label, label, One, next)`. `arc_state` must be non-decreasing: a state's arcs
  are written in the order given.
  """
  num_arcs = len(arc_state)
  arc_count = np.bincount(arc_state, minlength=num_states)
  # State s's record starts after 3 words per earlier state and 4 per earlier arc.
  arcs_before = np.cumsum(arc_count) - arc_count
  at = 3 * np.arange(num_states) + 4 * arcs_before
  words = np.zeros(3 * num_states + 4 * num_arcs, np.int32)
  words[at] = np.where(accepting, 0, _INF_BITS)
  words[at + 1] = arc_count
  arc_at = 3 * (arc_state + 1) + 4 * np.arange(num_arcs)
  words[arc_at] = label
  words[arc_at + 1] = label
  words[arc_at + 3] = dst
  header = _HEADER_PREFIX + struct.pack("<Qqqq", _NFA_PROPERTIES, start, num_states,
                                        num_arcs)
  return header + words.astype("<i4", copy=False).tobytes()
