"""Token-level composition against OpenFst: determinize(project(T_V ∘ A)) (Alg. 2)."""

import numpy as np
import pynini
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _compose
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _openfst_io
from constrained_decoding.automata import _trie_walk

_PATTERNS = [
    r"Red|Orange|Yellow|Green|Blue|Indigo|Violet",
    r"\d{4}-[01]\d-[0-3]\dT[0-2]\d:[0-5]\d:[0-5]\d([+][0-2]\d:[0-5]\d|Z)",
    r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)",
    r"(foo)+d",
    r"[a-c]{2,5}x?",
    r"é|naïve|中文",
    r'"[^"\n]{0,3}"',
    r"\s*(true|false)\s*",
    r"a\x00b",
    r"(ab|abab)*",
    r'"[^"\\]*"',  # wide: a terminal edge plus explicit exits such as `",`
    r'"([^"\\]|\\.)*"',  # the state after a backslash gets a terminal back too
    r".*x",
    r'\{"a": "[^"\n]*", "b": [0-9]\}',
    r'"([^a"\\]|a[^b"\\]|ab[^"\\])[^"\\]*"',  # entry terminals: a key other than "ab"
    r"Answer: [^\n]*",  # pre-entry: the state before " " gets a terminal too
    r"key: [a-z][a-z ]*\n",  # pre-entry through an entry state
]


def _openfst_token_dfa(trie, node) -> pynini.Fst:
  """The paper's construction with OpenFst operations only."""
  t_v = _detokenizer.detokenizing_fst(trie)
  a = _fsa.ir_to_fst(node)
  composed = pynini.compose(t_v, a.arcsort("ilabel")).project("input")
  return pynini.determinize(composed.rmepsilon()).minimize()


def _ours_as_fst(token_dfa) -> pynini.Fst:
  """Explicit edges plus every token of each terminal edge, as one acceptor."""
  src, tok, dst = [token_dfa.edge_source], [token_dfa.edge_token], [token_dfa.edge_target]
  for q, r in zip(*np.nonzero(token_dfa.state_terminals[:, :, 0] >= 0)):
    terminal, target = token_dfa.state_terminals[q, r]
    bits = token_dfa.terminal_bits[terminal]
    ids = np.nonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))[0]
    assert not np.isin(ids, token_dfa.edge_token[token_dfa.edge_source == q]).any()
    src.append(np.full(len(ids), q))
    tok.append(ids)
    dst.append(np.full(len(ids), target))
  src, tok, dst = (np.concatenate(x).astype(np.int64) for x in (src, tok, dst))
  return _openfst_io.fst_from_arrays(
      num_states=token_dfa.num_states, start=0, final=token_dfa.accepting,
      arc_source=src, arc_ilabel=tok + 1, arc_olabel=tok + 1, arc_target=dst)


def _compose_pattern(pattern, compiler):
  node = cd.Regex(pattern).to_ir()
  dfa = _fsa.compile_byte_dfa(node)
  return node, _compose.compose_token_dfa(
      dfa, compiler.trie, wide=compiler.wide_states.find(dfa), num_words=8192)


@pytest.mark.parametrize("pattern", _PATTERNS)
def test_equals_openfst_composition_gemma(pattern, gemma_compiler):
  node, ours = _compose_pattern(pattern, gemma_compiler)
  reference = _openfst_token_dfa(gemma_compiler.trie, node)
  assert pynini.equivalent(_ours_as_fst(ours), reference)


def test_result_is_trimmed_and_deterministic(gemma_compiler):
  _, ours = _compose_pattern(r"ab(c|d)e|abx", gemma_compiler)
  pairs = ours.edge_source.astype(np.int64) * (1 << 32) + ours.edge_token
  assert len(np.unique(pairs)) == len(pairs)  # deterministic
  # Every state reaches acceptance and is reached from the start.
  fst = _ours_as_fst(ours)
  assert fst.num_states() == pynini.connect(fst.copy()).num_states()


def test_vocabulary_without_needed_bytes_gives_empty():
  vocab = cd.Vocabulary.from_token_bytes([b"a", b"b", None], eos_ids=[2])
  trie = _detokenizer.build_trie(vocab)
  dfa = _fsa.compile_byte_dfa(cd.Regex("ac|b").to_ir())
  token_dfa = _compose.compose_token_dfa(dfa, trie)
  assert token_dfa.num_states == 2  # only "b" survives
  dfa = _fsa.compile_byte_dfa(cd.Regex("ac").to_ir())
  assert _compose.compose_token_dfa(dfa, trie).num_states == 0


def test_edge_budget(gemma_compiler):
  dfa = _fsa.compile_byte_dfa(cd.Regex(r".{0,3}").to_ir())
  with pytest.raises(cd.CompileBudgetError, match=r"more than 1000 token edges"):
    _compose.compose_token_dfa(dfa, gemma_compiler.trie, max_edges=1000)


@pytest.mark.parametrize("pattern", [r"(ab|c)*d?", r"a[bc]{1,3}", r"(abc|ab)+", r"c*d"])
def test_equals_openfst_composition_partial_vocabulary(pattern):
  # Not byte complete: "d" only appears inside "cd", so pruning is needed here.
  vocab = cd.Vocabulary.from_token_bytes([b"a", b"ab", b"b", b"abc", b"cd", b"c", None],
                                         eos_ids=[6])
  trie = _detokenizer.build_trie(vocab)
  assert not trie.is_byte_complete
  node = cd.Regex(pattern).to_ir()
  ours = _compose.compose_token_dfa(_fsa.compile_byte_dfa(node), trie)
  reference = _openfst_token_dfa(trie, node)
  assert pynini.equivalent(_ours_as_fst(ours), reference)
  assert _ours_as_fst(ours).num_states() == pynini.connect(_ours_as_fst(ours)).num_states()


def test_wide_states_become_terminals(gemma_compiler):
  _, ours = _compose_pattern(r'"[^"\\]*"', gemma_compiler)
  assert ours.terminal_bits.shape[0] == 1
  assert (ours.state_terminals[:, :, 0] >= 0).sum() == 1
  # ~255k tokens in one bitmap; only a few hundred explicit edges remain.
  bits = np.unpackbits(ours.terminal_bits[0].view(np.uint8)).sum()
  assert bits > 200_000 and len(ours.edge_token) < 5_000


@pytest.mark.parametrize("emit_at_once", [1, 10**9])
@pytest.mark.parametrize("pattern", [r'\{"a": "[^"\n]*", "b": [0-9]\}', r"key: [a-z][a-z ]*\n"])
def test_frontiers_emitted_at_once_or_at_the_end_agree_with_openfst(
    emit_at_once, pattern, gemma_compiler, monkeypatch):
  """Walks emit a large frontier's tokens at once and small ones together at the end
  (`_trie_walk._EMIT_AT_ONCE`): either way every edge is found."""
  monkeypatch.setattr(_trie_walk, "_EMIT_AT_ONCE", emit_at_once)
  node, ours = _compose_pattern(pattern, gemma_compiler)
  assert pynini.equivalent(_ours_as_fst(ours), _openfst_token_dfa(gemma_compiler.trie, node))


@pytest.mark.parametrize("copies", [1, 3, 40])
def test_repeated_frontier_pairs_walk_each_origin(copies, gemma_compiler):
  """A frontier repeating (node, state) pairs under other origins (a string body's loop
  states share their exits) gives each origin the edges its pair gives alone, and the
  edge budget counts every copy."""
  dfa = _fsa.compile_byte_dfa(cd.Regex(r'"[a-z ]{0,6}"(, "[0-9]+")?').to_ir())
  trie = gemma_compiler.trie
  rng = np.random.default_rng(copies)
  origins = np.arange(dfa.num_states, dtype=np.int64)
  node, state, _ = _compose._root_frontier(dfa, trie, origins)  # pylint: disable=protected-access
  pick = rng.integers(0, len(node), size=copies * len(node))
  origin = rng.integers(0, 50, size=len(pick)).astype(np.int32)
  budget = dict(max_edges=10**8, deadline=float("inf"), what="test")

  def as_rows(parts):
    src, tok, dst = _compose._concatenate_columns(parts)  # pylint: disable=protected-access
    return sorted(zip(src.tolist(), tok.tolist(), dst.tolist()))

  # Oracle: each distinct pair walked alone (its own origin k), its edges relabelled.
  alone = as_rows(_compose._walk_frontier(  # pylint: disable=protected-access
      dfa.transitions, trie, node, state, np.arange(len(node), dtype=np.int32), **budget))
  by_pair: dict[int, list] = {}
  for k, tok, dst in alone:
    by_pair.setdefault(k, []).append((tok, dst))
  expected = sorted((o, tok, dst) for p, o in zip(pick.tolist(), origin.tolist())
                    for tok, dst in by_pair.get(p, ()))
  walked = as_rows(_compose._walk_frontier(dfa.transitions, trie, node[pick], state[pick],  # pylint: disable=protected-access
                                           origin, **budget))
  assert expected and walked == expected
  with pytest.raises(cd.CompileBudgetError, match="token edges"):
    _compose._walk_frontier(dfa.transitions, trie, node[pick], state[pick], origin,  # pylint: disable=protected-access
                            **dict(budget, max_edges=len(expected) - 1))
