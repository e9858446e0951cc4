"""Near-loop states (`automata/_near_loop.py`): exact against plain composition.

Oracle: the same byte DFA composed without any terminal (every token an explicit edge).
A small vocabulary (all 256 bytes plus multi-byte tokens that follow, cross and leave
declared JSON keys) makes plain composition cheap; the terminal-size threshold is
lowered so that its wide states and near-loop states appear at all. With the real
Gemma 3 vocabulary, documents with extra keys close to the declared ones are accepted
under random tokenizations, declared keys are refused as extra keys, and random walks
validate with `jsonschema`.
"""

import json
import random

import jsonschema
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _compose
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _near_loop
from constrained_decoding.automata import _loops
from constrained_decoding.testing import TokenIndex
from constrained_decoding.testing import reference_accepts
from constrained_decoding.testing import reference_allowed
from constrained_decoding.testing import reference_step

GPQA = {"type": "object", "properties": {
    "Final Answer": {"enum": ["A", "B", "C", "D"]}, "Solution": {"type": "string"}},
    "required": ["Final Answer", "Solution"]}
RPG = {"type": "object", "properties": {
    "name": {"type": "string"},
    "class": {"type": "string", "enum": ["Warrior", "Rogue", "Sorceror"]},
    "life": {"type": "integer"},
    "equipment": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "quality": {"enum": ["Normal", "Magic"]}}}}}}
UNICODE_KEYS = {"type": "object", "properties": {"café": {"type": "integer"},
                                                 "é\"\\": {"type": "null"}},
                "required": ["café"]}

_PIECES = ['"', "F", "Fi", "Fin", "Final", "inal", "al", "l A", " A", " An", "Answer",
           "Answer\"", 'r"', '":', '":"', '","', ',"', '{"', '"}', "S", "So", "Sol", "Solution",
           "lution", "ution\"", "x", "xyz", "Finale", "Final Answer", " Answers", "ca", "caf",
           "café", "é", "\u00e9\"", "\\\"", "\\n", "\\u00", "é\\", "ab\"", "\"Fi", '","F',
           "n", "na", "name", "class", "ss", "Warrior", "life", '":[', "[{", "}]", "},{",
           "\u2603", "\u2603\u2603", "e\u2603", "Sorc", "equipment", "Magic\"", "ity"]


@pytest.fixture(scope="module")
def small_vocab():
  pieces = sorted({p.encode() for p in _PIECES if len(p.encode()) > 1})
  rng = random.Random(0)
  alphabet = 'abcFSAl i"{}:,[]\\n0123'
  pieces += [bytes(rng.choice(alphabet.encode()) for _ in range(rng.randint(2, 6)))
             for _ in range(300)]
  tokens = [bytes([b]) for b in range(256)] + pieces + [None]
  return cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])


def _token_map(tdfa: _compose.TokenDfa) -> list[dict[int, int]]:
  """Per state: token -> target, explicit edges first, then terminals in order."""
  maps = [{} for _ in range(tdfa.num_states)]
  for s, t, d in zip(tdfa.edge_source.tolist(), tdfa.edge_token.tolist(),
                     tdfa.edge_target.tolist()):
    assert t not in maps[s], "duplicate explicit edge"
    maps[s][t] = d
  for s in range(tdfa.num_states):
    for terminal, target in tdfa.state_terminals[s].tolist():
      if terminal < 0:
        continue
      bits = np.unpackbits(tdfa.terminal_bits[terminal].view(np.uint8), bitorder="little")
      for t in np.nonzero(bits)[0].tolist():
        maps[s].setdefault(t, target)
  return maps


@pytest.mark.parametrize("schema, policy", [
    (GPQA, "compact"), (GPQA, "flexible"), (RPG, "single"), (UNICODE_KEYS, "compact"),
    ({"type": "object", "additionalProperties": {"type": "string"},
      "properties": {"ab": {"const": 1}, "abc": {"const": 2}}}, "compact"),
])
@pytest.mark.parametrize("min_inside", [2, None])
def test_near_loop_states_are_exact(schema, policy, min_inside, small_vocab, monkeypatch,
                                    spy):
  monkeypatch.setattr(_loops, "MIN_TERMINAL_TOKENS", 8)
  if min_inside is not None:  # Tokens ending inside a loop get terminals too.
    monkeypatch.setattr(_loops, "MIN_INSIDE_TOKENS", min_inside)
  compiler = cd.Compiler(small_vocab, cd.CompileOptions(cache_dir=None))
  dfa = _fsa.compile_byte_dfa(cd.JsonSchema(schema, policy).to_ir())
  calls = spy(_near_loop, "near_loop_edges")
  wide = compiler.wide_states.find(dfa)
  assert calls and calls[0], "no near-loop state: the test would be vacuous"
  assert all(wide[p] is edge for p, edge in calls[0].items())
  if min_inside is not None:
    covers = [edge.inside for edge in calls[0].values() if edge.inside is not None]
    assert covers, "no inside cover: the test would be vacuous"
    if schema is GPQA:  # Some near-loop state reads a covered token differently.
      assert any("/" in cover.key for cover in covers)
  num_words = -(-small_vocab.vocab_size // 32)
  with_terminals = _compose.compose_token_dfa(dfa, compiler.trie, wide=wide,
                                              num_words=num_words)
  plain = _compose.compose_token_dfa(dfa, compiler.trie, num_words=num_words)
  assert with_terminals.num_states == plain.num_states == dfa.num_states
  assert _token_map(with_terminals) == _token_map(plain)
  near = list(calls[0])
  assert with_terminals.edge_source.size < plain.edge_source.size
  assert all((with_terminals.state_terminals[p, 0, 0] >= 0) for p in near)


def test_keys_must_differ_and_walk_stays_in_prefixes(monkeypatch, small_vocab):
  """The disagreement walk follows only the declared keys' prefixes."""
  monkeypatch.setattr(_loops, "MIN_TERMINAL_TOKENS", 8)
  visited = []
  original = _near_loop._disagreement_walk  # pylint: disable=protected-access

  def spy(*args):
    visited.append(original(*args))
    return visited[-1]

  monkeypatch.setattr(_near_loop, "_disagreement_walk", spy)
  compiler = cd.Compiler(small_vocab, cd.CompileOptions(cache_dir=None))
  compiler.wide_states.find(_fsa.compile_byte_dfa(cd.JsonSchema(GPQA).to_ir()))
  trie = compiler.trie
  texts = {small_vocab.token_bytes[t].decode() for _, nodes, states in visited
           for n in nodes[states == 0].tolist()
           for t in trie.token_ids[trie.token_start[n]:trie.token_start[n + 1]].tolist()}
  keys = ("Final Answer", "Solution")
  # Every token it found back at the loop's anchor spells part of a declared key (the
  # chain it follows); the others end inside the loop (a key's closing quote, say).
  assert texts and all(any(t in k for k in keys) for t in texts), texts



def _spelled(trie, node=0, prefix=b""):
  """(bytes, token id) of every token below `node`, read by walking the trie's layout;
  checks the layout's invariants on the way."""
  assert trie.node_depth[node] == len(prefix)
  out = [(prefix, t) for t in trie.token_ids[trie.token_start[node]:
                                              trie.token_start[node + 1]].tolist()]
  children = range(trie.child_start[node], trie.child_start[node + 1])
  assert list(trie.child_byte[children]) == sorted(set(trie.child_byte[children]))
  for slot in children:
    child = int(trie.child_node[slot])
    assert child > node  # Depth-first numbering.
    out += _spelled(trie, child, prefix + bytes([trie.child_byte[slot]]))
  return out


@pytest.mark.parametrize("seed", range(6))
def test_fix_trie_spells_exactly_the_tokens_of_its_nodes(seed, small_vocab):
  trie = cd.Compiler(small_vocab, cd.CompileOptions(cache_dir=None)).trie
  rng = random.Random(seed)
  nodes = np.unique(np.array(rng.sample(range(1, trie.num_nodes), 12), np.int64))
  nodes = nodes[trie.token_start[nodes + 1] > trie.token_start[nodes]]
  fixes = _near_loop._fix_trie(trie, nodes, "fp")  # pylint: disable=protected-access
  expected = sorted((small_vocab.token_bytes[t], t)
                    for n in nodes.tolist()
                    for t in trie.token_ids[trie.token_start[n]:trie.token_start[n + 1]].tolist())
  assert expected and sorted(_spelled(fixes)) == expected
  # Only the nodes on the way to them (no dead branches).
  assert fixes.num_nodes == len({b[:k] for b, _ in expected for k in range(len(b) + 1)})
  # The memoized fix terminal: its bitmap holds exactly those tokens, its trie spells
  # them, and it is shared while the trie and width are the same.
  num_words = -(-small_vocab.vocab_size // 32) + seed
  fix = _near_loop._fix_terminal(trie, nodes, num_words)  # pylint: disable=protected-access
  bits = np.unpackbits(fix.bits.view(np.uint8), bitorder="little")
  assert np.flatnonzero(bits).tolist() == sorted(t for _, t in expected)
  assert fix.num_tokens == len(expected) and sorted(_spelled(fix.subtrie)) == expected
  assert _near_loop._fix_terminal(trie, nodes, num_words) is fix  # pylint: disable=protected-access
  assert _near_loop._fix_terminal(trie, nodes, num_words + 1) is not fix  # pylint: disable=protected-access

# ---- The real vocabulary. ----

_EXTRA_KEYS = ["Final", "Fin", "F", "Final Answer ", "Final answer", "Solution2", "S", "",
               "Solutio", "Sol ution", "\u00e9", "Final Answe\"r", "x\\ny"]


@pytest.fixture(scope="module")
def gpqa_default(gemma_compiler):
  # Schema order: the walks below stop at accepting states, and with the declared keys
  # in any order a walk that opens an additional key first may wander in its string
  # for ever; these tests are about extra keys next to declared ones, after them.
  return gemma_compiler.compile(cd.JsonSchema(GPQA, property_order="schema"))


def test_gemma_extra_keys_near_declared_ones(gpqa_default, gemma_vocab):
  index = TokenIndex(gemma_vocab)
  rng = random.Random(7)
  base = {"Final Answer": "C", "Solution": "Because."}
  for key in _EXTRA_KEYS:
    doc = json.dumps({**base, key: [1, {"k": None}]}, ensure_ascii=False,
                     separators=(",", ":"))
    data = doc.encode()
    assert reference_accepts(gpqa_default, index.longest_tokenization(data)), doc
    for _ in range(4):
      assert reference_accepts(gpqa_default, index.random_tokenization(data, rng)), doc
  for key in ("Final Answer", "Solution"):  # A declared key cannot come back as an extra.
    data = (json.dumps(base, separators=(",", ":"))[:-1] + f',"{key}":1}}').encode()
    for _ in range(4):
      assert not reference_accepts(gpqa_default, index.random_tokenization(data, rng)), data


def test_gemma_random_walks_validate(gpqa_default, gemma_vocab):
  rng = random.Random(3)
  not_eos = np.ones(gemma_vocab.vocab_size, bool)
  not_eos[list(gemma_vocab.eos_ids)] = False
  # Biased towards short tokens, so walks get past the declared keys into extras.
  short = np.array([b is not None and len(b) <= 2 for b in gemma_vocab.token_bytes])
  extras = 0
  for _ in range(6):
    state, data = int(np.asarray(gpqa_default.start)[0]), b""
    while True:
      allowed = reference_allowed(gpqa_default, state) & not_eos
      if gpqa_default.accepting[state] and (rng.random() < 0.2 or len(data) > 160
                                            or not allowed.any()):
        break
      pool = np.nonzero(allowed & short)[0] if rng.random() < 0.7 else []
      pool = pool if len(pool) else np.nonzero(allowed)[0]
      token = int(pool[rng.randrange(len(pool))])
      data += gemma_vocab.token_bytes[token]
      state = reference_step(gpqa_default, state, token)
    value = json.loads(data.decode())
    jsonschema.validate(value, GPQA)
    extras += len(value) > 2
  assert extras  # Some walks went through the extra properties.


# ---- Random regexes: every terminal kind against plain composition. ----

_ATOMS = ["a", "b", "F", '"', r"\\", r'[^"\\]', r"\\.", "[a-c]", r'(?:[^"\\]|\\.)', "[^a]", "."]


def _regexes():
  import hypothesis.strategies as st  # pylint: disable=g-import-not-at-top
  return st.recursive(
      st.sampled_from(_ATOMS),
      lambda inner: st.one_of(
          st.tuples(inner, inner).map("".join),
          st.tuples(inner, inner).map(lambda p: f"(?:{p[0]}|{p[1]})"),
          inner.map(lambda r: f"(?:{r})*"),
          inner.map(lambda r: f"(?:{r})?")),
      max_leaves=8)


def test_random_regexes_compose_exactly_with_every_terminal(small_vocab, monkeypatch):
  """Loop terminals, entry and pre-entry terminals, near-loop states and inside covers
  (thresholds lowered so a small vocabulary has them all) give the token automaton of
  plain composition, on random regexes over string-body-like pieces."""
  import hypothesis  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(_loops, "MIN_TERMINAL_TOKENS", 4)
  monkeypatch.setattr(_loops, "MIN_INSIDE_TOKENS", 2)
  compiler = cd.Compiler(small_vocab, cd.CompileOptions(cache_dir=None))
  num_words = -(-small_vocab.vocab_size // 32)
  seen = {"wide": 0, "inside": 0}

  @hypothesis.settings(max_examples=120, deadline=None, derandomize=True)
  @hypothesis.given(_regexes())
  def check(pattern):
    dfa = _fsa.compile_byte_dfa(cd.Regex(pattern).to_ir())
    if dfa.num_states == 0:
      return
    wide = compiler.wide_states.find(dfa)
    seen["wide"] += bool(wide)
    seen["inside"] += any(edge.inside is not None for edge in wide.values())
    fast = _compose.compose_token_dfa(dfa, compiler.trie, wide=wide, num_words=num_words)
    plain = _compose.compose_token_dfa(dfa, compiler.trie, num_words=num_words)
    assert fast.num_states == plain.num_states, pattern
    assert _token_map(fast) == _token_map(plain), pattern

  check()  # pylint: disable=no-value-for-parameter
  assert seen["wide"] >= 20 and seen["inside"] >= 5, seen  # Not vacuous.
