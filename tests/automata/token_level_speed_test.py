"""The token-level compile's fast paths against the plain computations they replace."""

import dataclasses
import random

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _array_file
from constrained_decoding.automata import _compose
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _loops
from constrained_decoding.automata import _unique_strings
from constrained_decoding.automata import _wide


def _live_oracle(num_states, src, dst, start, accepting) -> np.ndarray:
  """Reachable from `start` and co-reachable from `accepting`, by Python set closure."""
  forward, backward = {}, {}
  for a, b in zip(src.tolist(), dst.tolist()):
    forward.setdefault(a, set()).add(b)
    backward.setdefault(b, set()).add(a)

  def closure(seeds, graph):
    seen, stack = set(seeds), list(seeds)
    while stack:
      for r in graph.get(stack.pop(), ()):
        if r not in seen:
          seen.add(r)
          stack.append(r)
    return seen

  both = closure([start], forward) & closure(np.flatnonzero(accepting).tolist(), backward)
  return np.isin(np.arange(num_states), list(both))


@pytest.mark.parametrize("seed", range(40))
def test_live_states_equal_set_closure(seed):
  """Random graphs with parallel edges, chains deeper than one BFS level, frontiers long
  enough to be deduplicated (past 256), unreachable and dead states."""
  rng = np.random.default_rng(seed)
  num_states = int(rng.integers(1, 2000))
  chain = np.arange(num_states - 1)
  shape = seed % 4
  if shape == 0:  # Sparse random graph.
    src = rng.integers(0, num_states, 3 * num_states)
    dst = rng.integers(0, num_states, 3 * num_states)
  elif shape == 1:  # A long chain with repeated edges and a few shortcuts back.
    src = np.concatenate([chain, chain, rng.integers(0, num_states, 5)])
    dst = np.concatenate([chain + 1, chain + 1, rng.integers(0, num_states, 5)])
  elif shape == 2:  # A star: one level of ~num_states states.
    src = np.concatenate([np.zeros(num_states, np.int64), rng.integers(0, num_states, 50)])
    dst = np.concatenate([np.arange(num_states), rng.integers(0, num_states, 50)])
  else:  # No edges at all, or very few.
    src = rng.integers(0, num_states, seed % 3)
    dst = rng.integers(0, num_states, seed % 3)
  accepting = rng.random(num_states) < [0.01, 0.001, 0.05, 0.5][shape]
  start = int(rng.integers(0, num_states))
  for s, d in ((src, dst), (src.astype(np.int32), dst.astype(np.int32))):
    got = _compose._live_states(num_states, s, d, start, accepting)  # pylint: disable=protected-access
    assert got.dtype == bool and got.shape == (num_states,)
    np.testing.assert_array_equal(got, _live_oracle(num_states, s, d, start, accepting))


def test_token_hash_equals_hash_of_every_token():
  """`token_hash` by byte positions over length-sorted tokens = `hash_of` token by token
  (lengths 0..300 in random order, None, high bytes)."""
  rng = random.Random(0)
  tokens = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 2, 3, 7, 40, 300])))
            for _ in range(300)] + [None, b"", b"\xff" * 5]
  rng.shuffle(tokens)
  table = _unique_strings._hash_tokens(tokens)  # pylint: disable=protected-access
  assert table.dtype == np.int32 and table.shape == (len(tokens), 4)
  for row, data in zip(table.tolist(), tokens):
    assert tuple(row) == _unique_strings.hash_of(data or b"")
  assert _unique_strings._hash_tokens([]).shape == (0, 4)  # pylint: disable=protected-access


def test_array_file_round_trip(tmp_path):
  """Every dtype and shape (0-d, empty, 2-D, unaligned sizes) comes back equal and
  writable; damaged, truncated and foreign files raise ValueError."""
  arrays = {"a": np.arange(7, dtype=np.int32), "b": np.array(3), "c": np.zeros((0, 4)),
            "d": np.arange(12, dtype=np.uint8).reshape(3, 4)[:, ::2], "e": np.ones(5, bool),
            "f": np.array([1, -2], np.int64), "g": np.array([2**32 - 1], np.uint32)}
  path = tmp_path / "x.arrays"
  with open(path, "wb") as f:
    _array_file.write(f, arrays)
  back = _array_file.read(str(path))
  assert list(back) == list(arrays)
  for name, value in arrays.items():
    assert back[name].dtype == value.dtype and back[name].shape == value.shape
    np.testing.assert_array_equal(back[name], value)
    assert back[name].flags.writeable and back[name].flags.aligned
  assert memoryview(back["a"])[6] == 6  # The trie walks index memoryviews of them.
  data = path.read_bytes()
  for bad in (data[:-3], data[:20], b"PK\x03\x04" + data[4:], data[:len(_array_file.MAGIC) + 8]
              + b"{" + data[len(_array_file.MAGIC) + 9:]):
    path.write_bytes(bad)
    with pytest.raises(ValueError):
      _array_file.read(str(path))


def _small_vocab() -> cd.Vocabulary:
  """Bytes plus JSON-ish multi-byte tokens (keys, punctuation, string pieces)."""
  words = [b'",', b'":', b'": "', b'"}', b'{"', b'name', b'age', b'tags', b'true', b'null',
           b'12', b'ab', b'abc', b'c", "', b'\\n', b'\\"', b'e"', b', "', b'[]', b'"],']
  return cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + words + [None],
                                        eos_ids=[256 + len(words)])


_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"type": "string"}}},
     "required": ["name"]},
    {"type": "array", "items": {"enum": ["abc", "name", True, None]}, "maxItems": 3},
    {"type": "object", "additionalProperties": {"type": "string", "pattern": "^a+b?$"}},
    {"type": "string", "format": "date"},
]


def _fields(tables) -> dict:
  return {f.name: getattr(tables, f.name) for f in dataclasses.fields(tables)}


def test_cached_terminals_give_identical_tables(tmp_path, monkeypatch):
  """Compiles with the disk cache cold, then from it in a fresh compiler (terminals,
  sub-tries and exits read back), equal field by field to compiles without any cache."""
  monkeypatch.setattr(_loops, "MIN_TERMINAL_TOKENS", 8)  # Wide states in a tiny vocabulary.
  vocab = _small_vocab()
  options = cd.CompileOptions(cache_dir=str(tmp_path), memoize=False)
  cold, warm = cd.Compiler(vocab, options), None
  reference = cd.Compiler(vocab, cd.CompileOptions(cache_dir=None, memoize=False))
  loaded = []
  original = _loops.loop_exits
  for schema in _SCHEMAS:
    spec = cd.JsonSchema(schema)
    first = cold.compile(spec)
    warm = cd.Compiler(vocab, options)
    monkeypatch.setattr(_loops, "loop_exits", lambda *a, **k: loaded.append(a) or original(*a, **k))
    second = warm.compile(spec)
    monkeypatch.setattr(_loops, "loop_exits", original)
    expected = _fields(reference.compile(spec))
    for got in (first, second):
      for name, value in _fields(got).items():
        if isinstance(value, np.ndarray):
          np.testing.assert_array_equal(value, expected[name], err_msg=name)
          assert value.dtype == expected[name].dtype, name
        else:
          assert value == expected[name] or value is expected[name], name
  assert list(tmp_path.glob("wide-v*.arrays"))
  assert not loaded  # The second compilers read every terminal's exits from disk.


def test_loaded_exits_equal_computed(tmp_path, monkeypatch):
  """A terminal read back from disk carries `exits` equal, field by field, to those
  `loop_exits` computes from its loop and sub-trie."""
  monkeypatch.setattr(_loops, "MIN_TERMINAL_TOKENS", 8)
  vocab = _small_vocab()
  options = cd.CompileOptions(cache_dir=str(tmp_path))
  dfa = _fsa.compile_byte_dfa(cd.JsonSchema(_SCHEMAS[0]).to_ir())
  cd.Compiler(vocab, options).wide_states.find(dfa)
  wide = cd.Compiler(vocab, options).wide_states.find(dfa)
  checked = 0
  for edge in wide.values():
    for terminal, _ in edge.parts:
      if "exits" not in terminal.__dict__:
        continue
      computed = _loops.loop_exits(terminal.loop, terminal.entry, terminal.subtrie,
                                   terminal.full_node, after_first_byte=terminal.after_first_byte)
      for f in dataclasses.fields(computed):
        a, b = getattr(terminal.exits, f.name), getattr(computed, f.name)
        np.testing.assert_array_equal(a, b, err_msg=f.name)
        assert a.dtype == b.dtype, f.name
      checked += 1
  assert checked


def test_shape_memo_keeps_bitmaps_of_terminals_read_back(tmp_path, monkeypatch):
  """A terminal read from a cache file that also holds its sub-trie is kept in the
  shape memo as its bitmap alone (its sub-trie goes to the sub-trie memo), so sub-tries
  do not crowd out bitmaps; compiles from that warm cache give the cold cache's
  tables."""
  monkeypatch.setattr(_loops, "MIN_TERMINAL_TOKENS", 8)
  vocab = _small_vocab()
  cold = cd.Compiler(vocab, cd.CompileOptions(cache_dir=str(tmp_path), memoize=False))
  expected = [_fields(cold.compile(cd.JsonSchema(s))) for s in _SCHEMAS]
  warm = cd.Compiler(vocab, cd.CompileOptions(cache_dir=str(tmp_path), memoize=False))
  for schema, want in zip(_SCHEMAS, expected):
    for name, value in _fields(warm.compile(cd.JsonSchema(schema))).items():
      if isinstance(value, np.ndarray):
        np.testing.assert_array_equal(value, want[name], err_msg=name)
  shapes = [t for t, _ in warm.wide_states._shape_memo._items.values()]  # pylint: disable=protected-access
  subtries = warm.wide_states._subtrie_memo  # pylint: disable=protected-access
  assert shapes and all(t.subtrie is None for t in shapes)
  assert any(subtries.get(t.key) is not None for t in shapes)


def test_terminal_memory_is_bounded_and_eviction_keeps_tables(tmp_path, monkeypatch):
  """With a tiny memory budget the per-vocabulary memos keep one terminal each, stay
  under budget otherwise, and compiles (reading evicted terminals back from disk, or
  rebuilding them without a disk cache) give the same tables as with room for all."""
  monkeypatch.setattr(_loops, "MIN_TERMINAL_TOKENS", 8)
  vocab = _small_vocab()
  roomy = cd.Compiler(vocab, cd.CompileOptions(cache_dir=None, memoize=False))
  expected = [_fields(roomy.compile(cd.JsonSchema(s))) for s in _SCHEMAS]
  assert len(roomy.wide_states._subtrie_memo) > 1  # pylint: disable=protected-access
  monkeypatch.setattr(_wide, "MAX_MEMORY_BYTES", 1)
  for cache_dir in (None, str(tmp_path)):
    tight = cd.Compiler(vocab, cd.CompileOptions(cache_dir=cache_dir, memoize=False))
    for _ in range(2):
      for schema, want in zip(_SCHEMAS, expected):
        for name, value in _fields(tight.compile(cd.JsonSchema(schema))).items():
          if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, want[name], err_msg=name)
      memos = (tight.wide_states._subtrie_memo, tight.wide_states._shape_memo)  # pylint: disable=protected-access
      assert all(len(memo) == 1 for memo in memos)
  memo = _wide._BoundedMemo(100)  # pylint: disable=protected-access
  terminal = _loops.LoopTerminal(key="k", bits=np.zeros(10, np.uint32), num_tokens=0,
                                 subtrie=None)  # 40 bytes each.
  for key in "abc":
    memo.put(key, terminal)
  assert len(memo) == 2 and memo.nbytes == 80 and memo.get("a") is None
  assert memo.get("b") is terminal  # Now the most recently used: "c" goes next.
  memo.put("d", terminal)
  assert memo.get("c") is None and memo.get("b") is terminal and memo.nbytes == 80


_LOOP_PATTERNS = [
    r'\{("[a-z]{1,3}": "([^"\\]|\\.)*", )*"k": [0-9]+\}',
    r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"(, "[^"]*")*',
    r"(ab|cd[^x]|e.)*f[^\n]*\n",
    r"[a-z ]+(\.[a-z ]+)*|x(yz)*",
]


@pytest.mark.parametrize("index_states", [True, False])
@pytest.mark.parametrize("pattern", _LOOP_PATTERNS)
def test_canonical_loop_backward_search_equals_forward(pattern, index_states, monkeypatch):
  """`canonical_loop` with predecessors (backward-first search) gives the states and
  loop automaton of the plain forward search, for every state of the DFA and random
  `skip` masks; the loop automaton is the DFA's rows of those states renumbered (both
  ways of renumbering: an index array, a search among the loop's states)."""
  if not index_states:
    monkeypatch.setattr(_loops, "_INDEX_STATES", 0)
  dfa = _fsa.compile_byte_dfa(cd.Regex(pattern).to_ir())
  predecessors = _loops.state_predecessors(dfa.byte_classes[0])
  rng = np.random.default_rng(len(pattern))
  nontrivial = 0
  for trial in range(4):
    skip = rng.random(dfa.num_states) < [0.0, 0.05, 0.2, 0.5][trial]
    for q in np.flatnonzero(~skip).tolist():
      states, loop = _loops.canonical_loop(dfa, q, skip)
      fast_states, fast_loop = _loops.canonical_loop(dfa, q, skip, predecessors)
      assert fast_states == states
      np.testing.assert_array_equal(fast_loop, loop)
      position = {r: i for i, r in enumerate(states)}
      expected = [[position.get(t, -1) for t in dfa.transitions[r].tolist()] for r in states]
      assert loop.tolist() == expected
      assert fast_loop.dtype == loop.dtype == np.int32
      nontrivial += len(states) > 1
  assert nontrivial
