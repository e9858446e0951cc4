"""Wide states (`automata/_wide.py`) and their fast composition path (`_compose.py`).

Oracles: the definition of a loop (shortest distances by breadth-first search over the
whole DFA), plain trie walks of every sub-trie (the composition before `LoopExits`),
the full trie's token bytes, and bitmaps rebuilt token by token.
"""

import os
import random

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _array_file
from constrained_decoding.automata import _compose
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _loops
from constrained_decoding.automata import _wide
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa

GPQA = {"type": "object", "properties": {
    "Final Answer": {"enum": ["A", "B", "C", "D"]}, "Solution": {"type": "string"}},
    "required": ["Final Answer", "Solution"]}


def _reference_loop(trans: np.ndarray, q: int) -> list[int]:
  """Loop of q by its definition: states s with d(q, s) + d(s, q) <= MAX_LOOP_BYTES."""
  n = len(trans)

  def distances(step):
    dist = {q: 0}
    front = [q]
    for d in range(1, n + 1):
      front = [r for s in front for r in step(s) if r not in dist]
      front = list(dict.fromkeys(front))
      for r in front:
        dist[r] = d
    return dist

  ahead = distances(lambda s: [int(r) for r in trans[s] if r != NO_STATE])
  behind = distances(lambda s: [p for p in range(n) if s in trans[p].tolist()])
  inside = {s for s in ahead if s in behind and ahead[s] + behind[s] <= _loops.MAX_LOOP_BYTES}
  inside.add(q)
  order = [q]
  for s in order:  # BFS from q; successors in order of their first byte.
    for r in trans[s].tolist():
      if r in inside and r not in order:
        order.append(r)
  return order


def _random_dfa(rng: random.Random, num_states: int, num_classes: int) -> ByteDfa:
  """A DFA whose bytes fall in `num_classes` random ranges, with a few busy loops."""
  cuts = sorted(rng.sample(range(1, 256), num_classes - 1))
  edges = np.array([0] + cuts + [256])
  table = np.full((num_states, num_classes), NO_STATE, np.int32)
  for s in range(num_states):
    for k in range(num_classes):
      if rng.random() < 0.5:
        table[s, k] = s if rng.random() < 0.3 else rng.randrange(num_states)
  transitions = table[:, np.repeat(np.arange(num_classes), np.diff(edges))]
  return ByteDfa(transitions=np.ascontiguousarray(transitions),
                 accepting=np.ones(num_states, bool), start=0, class_edges=edges)


@pytest.mark.parametrize("seed", range(12))
def test_loop_states_match_the_definition(seed):
  rng = random.Random(seed)
  dfa = _random_dfa(rng, rng.randint(2, 30), rng.randint(2, 12))
  without_classes = ByteDfa(transitions=dfa.transitions, accepting=dfa.accepting, start=0)
  no_skip = np.zeros(dfa.num_states, bool)
  skip = np.array([rng.random() < 0.3 for _ in range(dfa.num_states)])
  # Skipped states (spliced copies) are not there for loops: as if no byte led to them.
  without_skipped = np.where(skip[np.maximum(dfa.transitions, 0)], NO_STATE, dfa.transitions)
  # The backward-first search (with predecessors), one object for both skip masks.
  predecessors = _loops.state_predecessors(dfa.byte_classes[0])
  for q in range(dfa.num_states):
    expected = _reference_loop(dfa.transitions, q)
    assert _loops._loop_states(dfa, q, no_skip) == expected  # pylint: disable=protected-access
    assert _loops._loop_states(without_classes, q, no_skip) == expected  # pylint: disable=protected-access
    assert _loops._loop_states(dfa, q, no_skip, predecessors) == expected  # pylint: disable=protected-access
    if not skip[q]:
      expected = _reference_loop(without_skipped, q)
      assert _loops._loop_states(dfa, q, skip) == expected  # pylint: disable=protected-access
      assert _loops._loop_states(dfa, q, skip, predecessors) == expected  # pylint: disable=protected-access


@pytest.mark.parametrize("seed", range(6))
def test_state_predecessors_match_the_table(seed):
  rng = random.Random(seed)
  dfa = _random_dfa(rng, rng.randint(1, 40), rng.randint(1, 12))
  table = dfa.byte_classes[0]
  predecessors = _loops.state_predecessors(table)
  skip = np.array([rng.random() < 0.3 for _ in range(dfa.num_states)])
  assert len(predecessors) == dfa.num_states
  for r in range(dfa.num_states):
    expected = sorted({p for p in range(dfa.num_states) if r in table[p].tolist()})
    assert predecessors[r].tolist() == expected
    assert predecessors.lists(skip)(r) == [p for p in expected if not skip[p]]
    assert predecessors.lists(np.zeros_like(skip))(r) == expected
  states = rng.sample(range(dfa.num_states), rng.randint(1, dfa.num_states))
  union = predecessors.union(states)
  assert union.tolist() == sorted({p for r in states for p in predecessors[r].tolist()})
  assert union.dtype == np.int64


def test_byte_classes_read_like_the_byte_table():
  dfa = _fsa.compile_byte_dfa(cd.JsonSchema(GPQA).to_ir())
  table, first, size = dfa.byte_classes
  assert size.sum() == 256 and len(first) < 256
  byte_class = np.repeat(np.arange(len(first)), size)
  np.testing.assert_array_equal(table[:, byte_class], dfa.transitions)


def _token_dfa_arrays(token_dfa) -> tuple:
  return (token_dfa.num_states, token_dfa.accepting.tolist(), token_dfa.edge_source.tolist(),
          token_dfa.edge_token.tolist(), token_dfa.edge_target.tolist(),
          token_dfa.state_terminals.tolist(), token_dfa.terminal_bits.tobytes())


@pytest.mark.parametrize("spec", [
    cd.Regex(r'"([^"\\]|\\.)*"'),
    cd.Regex(r"Answer: [^\n]*"),
    cd.Regex(r'"([^a"\\]|a[^b"\\]|ab[^"\\])[^"\\]*"'),
    cd.JsonSchema(GPQA),
    cd.JsonSchema({"type": "object", "properties": {"a": {"type": "string"}},
                   "additionalProperties": False}),
], ids=["quoted", "pre-entry", "entries", "gpqa-default", "object"])
def test_loop_exits_path_equals_sub_trie_walks(spec, gemma_compiler, monkeypatch):
  """Composition reading `LoopExits` gives the same automaton as walking sub-tries: the
  very same arrays, but for the explicit edges of tokens that end inside a loop, which
  the fast path leaves to the `InsideCover` terminals (the sub-trie walks keep them;
  explicit edges take precedence, to the same target)."""
  dfa = _fsa.compile_byte_dfa(spec.to_ir())
  wide = gemma_compiler.wide_states.find(dfa)
  compose = lambda: _compose.compose_token_dfa(  # pylint: disable=unnecessary-lambda-assignment
      dfa, gemma_compiler.trie, wide=wide, num_words=8192,
      token_class_bits=gemma_compiler.wide_states.token_class_bits)
  fast = compose()
  _, loops = _compose._group_parts(wide, fast=True)  # pylint: disable=protected-access
  assert loops, "no part takes the fast path: the test would be vacuous"
  original = _compose._group_parts  # pylint: disable=protected-access
  monkeypatch.setattr(_compose, "_group_parts", lambda wide, fast: original(wide, False))
  plain = compose()
  fast_edges = set(zip(fast.edge_source.tolist(), fast.edge_token.tolist(),
                       fast.edge_target.tolist()))
  plain_edges = set(zip(plain.edge_source.tolist(), plain.edge_token.tolist(),
                        plain.edge_target.tolist()))
  assert fast_edges <= plain_edges
  covered = np.array(sorted(plain_edges - fast_edges), np.int64).reshape(-1, 3)
  if any(edge.inside is not None for edge in wide.values()):
    assert len(covered), "no covered inside token: the test would be vacuous"
  source, token, target = covered.T
  terminals = fast.state_terminals[source, 1:]  # [C, R - 1, 2]: the inside terminals.
  bits = fast.terminal_bits[np.maximum(terminals[..., 0], 0), token[:, None] >> 5]
  hit = (terminals[..., 0] >= 0) & ((bits >> (token[:, None] & 31).astype(np.uint32)) & 1 == 1)
  assert (hit.sum(axis=1) == 1).all()  # Each in one inside terminal ...
  assert (terminals[..., 1][hit] == target).all()  # ... to the same state.
  assert _token_dfa_arrays(fast)[:2] + _token_dfa_arrays(fast)[5:] == (
      _token_dfa_arrays(plain)[:2] + _token_dfa_arrays(plain)[5:])


def test_loop_exits_arrays(gemma_compiler):
  dfa = _fsa.compile_byte_dfa(cd.Regex(r'"([^"\\]|\\.)*"').to_ir())
  wide = gemma_compiler.wide_states.find(dfa)
  trie = gemma_compiler.trie
  tokens = gemma_compiler.vocab.token_bytes
  for edge in wide.values():
    for terminal, _ in edge.parts:
      exits, sub = terminal.exits, terminal.subtrie
      # Each sub-trie node is the full-trie node spelling the same bytes; below an exit
      # the two tries hold the same tokens.
      for node in random.Random(0).sample(range(1, sub.num_nodes), 300):
        full = exits.full_node[node]
        sub_tokens = sub.token_ids[sub.token_start[node]:sub.token_start[node + 1]].tolist()
        full_tokens = trie.token_ids[trie.token_start[full]:trie.token_start[full + 1]]
        assert trie.node_depth[full] == sub.node_depth[node]
        assert set(sub_tokens) <= set(full_tokens.tolist())
        for t in sub_tokens:
          assert len(tokens[t]) == sub.node_depth[node]
      for node in random.Random(1).sample(exits.exit_node.tolist(), 50):
        full, depth = exits.full_node[node], sub.node_depth[node]
        after = np.flatnonzero(trie.node_depth[full + 1:] <= depth)
        full_end = full + 1 + (after[0] if len(after) else trie.num_nodes)
        sub_end = exits.node_end[node]
        assert (sorted(trie.token_ids[trie.token_start[full]:trie.token_start[full_end]])
                == sorted(sub.token_ids[sub.token_start[node]:sub.token_start[sub_end]]))
      # Inside tokens stay in the loop and end off the anchor; exits leave it.
      loop = terminal.loop
      for token, state in zip(exits.inside_token.tolist()[:200],
                              exits.inside_state.tolist()[:200]):
        s = terminal.entry
        for b in tokens[token][1:] if terminal.after_first_byte else tokens[token]:
          s = loop[s, b]
        assert s == state != 0
      for node, source, byte in zip(exits.exit_node.tolist()[:200],
                                    exits.exit_from.tolist()[:200],
                                    exits.exit_byte.tolist()[:200]):
        assert loop[source, byte] == NO_STATE and sub.node_depth[node] >= 1
      # Subtrees are contiguous: node_end bounds each node's descendants.
      assert (exits.node_end >= np.arange(sub.num_nodes) + 1).all()
      assert exits.node_end[0] == sub.num_nodes


def test_restricted_and_entry_bitmaps(gemma_compiler):
  ws = gemma_compiler.wide_states
  dfa = _fsa.compile_byte_dfa(cd.Regex(r'"([^"\\]|\\.)*"').to_ir())
  wide = ws.find(dfa)
  terminal = wide[next(iter(wide))].parts[0][0]
  tokens = gemma_compiler.vocab.token_bytes
  rng = np.random.default_rng(0)
  mask = rng.random(256) < 0.7
  bits = ws.first_byte_bits.restrict(terminal, mask)
  assert bits is ws.first_byte_bits.restrict(terminal, mask.copy())  # Memoized.
  ids = np.nonzero(np.unpackbits(terminal.bits.view(np.uint8), bitorder="little"))[0]
  expected = [t for t in ids.tolist() if tokens[t] and mask[tokens[t][0]]]
  got = np.nonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))[0].tolist()
  assert got == expected
  both, count = ws._entry_bits([(terminal, mask), (terminal, ~mask)])  # pylint: disable=protected-access
  np.testing.assert_array_equal(both, terminal.bits)
  assert count == len(ids)


def test_cache_keeps_sub_tries_only_of_used_terminals(gemma_vocab, tmp_path, monkeypatch):
  """Rejected candidates (narrow loops) are cached as bitmaps alone; the terminals in use
  have sub-tries, limited to the first bytes their states can read."""
  compiler = cd.Compiler(gemma_vocab, cd.CompileOptions(cache_dir=str(tmp_path)))
  ws = compiler.wide_states
  dfa = _fsa.compile_byte_dfa(cd.JsonSchema(GPQA).to_ir())
  wide = ws.find(dfa)
  used = {terminal.key for edge in wide.values() for terminal, _ in edge.parts
          if not terminal.key.startswith("near-")}  # Near-loop fixes: tiny, not cached.
  with_subtrie = set()
  for path in tmp_path.glob(f"wide-v{_wide.WIDE_FORMAT_VERSION}-*.arrays"):
    if "full_node" in _array_file.read(str(path)):
      with_subtrie.add(path.stem.rsplit("-", 1)[1])
  assert used and used <= with_subtrie
  assert len(list(tmp_path.glob("wide-*.arrays"))) > len(with_subtrie)  # Rejected ones.
  trie = compiler.trie
  for edge in wide.values():
    for terminal, _ in edge.parts:
      sub = terminal.subtrie
      assert sub.num_nodes < trie.num_nodes // 4, (terminal.key, sub.num_nodes)
      if terminal.first_bytes is not None:  # Only tokens starting with those bytes.
        roots = sub.child_byte[sub.child_start[0]:sub.child_start[1]]
        assert terminal.first_bytes[roots].all()
  # A new process reads them back: the same edges, no sub-trie rebuilt.
  again = cd.Compiler(gemma_vocab, cd.CompileOptions(cache_dir=str(tmp_path))).wide_states
  built = []
  original = _wide.with_subtrie
  monkeypatch.setattr(_wide, "with_subtrie", lambda *a: built.append(a) or original(*a))
  rewide = again.find(dfa)
  assert not built
  assert sorted(rewide) == sorted(wide)
  for p, edge in wide.items():
    np.testing.assert_array_equal(rewide[p].bits, edge.bits)


def test_prune_cache(tmp_path):
  """Other format versions go at once; then the least recently used, past the limit."""
  current = f"wide-v{_wide.WIDE_FORMAT_VERSION}-"
  (tmp_path / "wide-v1-old.npz").write_bytes(b"x" * 10)
  (tmp_path / f"{current}old-format.npz").write_bytes(b"x" * 10)
  (tmp_path / "trie-v2-keep.arrays").write_bytes(b"x" * 10)
  for i in range(8):
    path = tmp_path / f"{current}{i}.arrays"
    path.write_bytes(b"x" * 100)
    os.utime(path, (1000 + i, 1000 + i))
  _wide.prune_cache(str(tmp_path), max_bytes=1000)  # 800 bytes: under the limit.
  names = sorted(p.name for p in tmp_path.iterdir())
  assert "wide-v1-old.npz" not in names and "trie-v2-keep.arrays" in names
  assert f"{current}old-format.npz" not in names
  assert len(names) == 9
  _wide.prune_cache(str(tmp_path), max_bytes=500)  # Down to 3/4 of 500: 3 files.
  left = sorted(p.name for p in tmp_path.glob(f"{current}*"))
  assert left == [f"{current}{i}.arrays" for i in (5, 6, 7)]
