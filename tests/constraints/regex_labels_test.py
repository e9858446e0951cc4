"""Terminal labels and syntactic sugar in regexes (Sec. 2.5, `constraints/_labels.py`).

Oracles: `json.loads` (QUOTED_TEXT), PyYAML's scanner (UNQUOTED_TEXT), `str.find`
(TEXT_UNTIL), `in` (SUBSTRING_OF), `re.fullmatch` of the expanded regex
(DELIMITED_LIST), a brute-force enumeration (DELIMITED_SUBSEQUENCE_OF), the token bytes
of the real Gemma 3 vocabulary (token classes), the `regex` module's partial matching
(viability of every token), and the numpy reference walk against the device runtime.
"""

import itertools
import json
import random
import re

import hypothesis
import jax
import numpy as np
import pytest
import regex
import yaml
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding import tables as tables_lib
from constrained_decoding.automata import _compose
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _token_classes
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _labels
from constrained_decoding.constraints import _regex
from constrained_decoding.testing import (TokenIndex, random_accepted_bytes, reference_accepts,
                                          reference_allowed, reference_step, reference_walk)

_SETTINGS = hypothesis.settings(max_examples=300, deadline=None)
_DFAS = {}


def _dfa(pattern):
  if pattern not in _DFAS:
    _DFAS[pattern] = _fsa.compile_byte_dfa(cd.Regex(pattern).to_ir())
  return _DFAS[pattern]


def _accepts(pattern, text: str) -> bool:
  return _dfa(pattern).accepts(text.encode())


# --- Byte-level labels against their oracles ---------------------------------------------

_JSON_CHARS = st.sampled_from(list('"\\/ubfnrtaF09 \x00\x1f\x7fé中😀\n'))


def _json_string(text: str) -> bool:
  try:
    return isinstance(json.loads(text), str) and text == text.strip(" \t\n\r")
  except ValueError:
    return False


@_SETTINGS
@hypothesis.given(st.one_of(
    st.text(_JSON_CHARS, max_size=12),
    st.text(_JSON_CHARS, max_size=10).map(lambda s: '"' + s + '"'),
    st.builds(json.dumps, st.text(), ensure_ascii=st.booleans()),
))
def test_quoted_text_is_exactly_json_loads(text):
  assert _accepts("(?P<QUOTED_TEXT>)", text) == _json_string(text), text


def test_quoted_text_examples():
  for text in ['""', '"a\\"b"', '"\\u00e9\\uD800"', '"é 😀 \\/"']:
    assert _accepts("(?P<QUOTED_TEXT>)", text)
  for text in ['"', '"\\x"', '"a', '"\n"', '"\\u12"', "'a'", '"a" ']:
    assert not _accepts("(?P<QUOTED_TEXT>)", text)


_YAML_TOKENS = ["StreamStartToken", "BlockMappingStartToken", "KeyToken", "ScalarToken",
                "ValueToken", "ScalarToken", "BlockEndToken", "StreamEndToken"]


def _yaml_plain_scalar(text: str) -> bool:
  """Whether PyYAML reads `k: text` as one mapping whose value is the plain scalar text."""
  try:
    tokens = list(yaml.scan("k: " + text))
  except yaml.YAMLError:
    return False
  return ([type(t).__name__ for t in tokens] == _YAML_TOKENS and tokens[5].plain
          and tokens[5].value == text)


_YAML_CHARS = st.sampled_from(list(" :-?#a,[]{}&*!|>'\"%@`Zé😀\u2028\x85\xa0\x7f\n.\\\t\ufeff"))


@_SETTINGS
@hypothesis.given(st.text(_YAML_CHARS, min_size=0, max_size=8))
def test_unquoted_text_is_exactly_a_yaml_plain_scalar(text):
  # PyYAML also reads tabs and byte order marks inside plain scalars; we exclude them.
  expected = _yaml_plain_scalar(text) and "\t" not in text and "\ufeff" not in text
  assert _accepts("(?P<UNQUOTED_TEXT>)", text) == expected, text


def test_unquoted_text_examples():
  for text in ["hello world", "-a", "a:b", "a#b", "true", "12", "::x", "?é 😀"]:
    assert _accepts("(?P<UNQUOTED_TEXT>)", text), text
  for text in ["", "-", "a: b", "a #b", "a:", "a ", " a", "#a", "[a]", "a\nb", "a\tb"]:
    assert not _accepts("(?P<UNQUOTED_TEXT>)", text), text


def _text_until(text: str, stop: str) -> bool:
  return text.endswith(stop) and text.find(stop) == len(text) - len(stop)


@_SETTINGS
@hypothesis.given(st.text("abé\n", min_size=1, max_size=4), st.text("abé\n", max_size=9))
def test_text_until_ends_at_the_first_occurrence(stop, text):
  pattern = f"(?P<TEXT_UNTIL>{re.escape(stop)})"
  assert _accepts(pattern, text) == _text_until(text, stop), (stop, text)
  assert _accepts(pattern, text + stop) == (stop not in text + stop[:-1]), (stop, text)


def test_text_until_automaton_is_linear_in_the_stop_phrase():
  stop = "".join(random.Random(0).choice("abcdefghij") for _ in range(500))
  graph = _labels.text_until(stop)
  assert len(graph.arcs) <= 3 * len(stop) + 1  # <= 2m significant arcs + one default each
  assert _dfa(f"(?P<TEXT_UNTIL>{stop})").accepts(b"xyz" + stop.encode())


@_SETTINGS
@hypothesis.given(st.text("abcé😀", min_size=1, max_size=12), st.text("abcé😀", max_size=6))
def test_substring_of_is_exactly_the_substrings(text, candidate):
  pattern = f"(?P<SUBSTRING_OF>{re.escape(text)})"
  assert _accepts(pattern, candidate) == (candidate != "" and candidate in text)
  if len(text) >= 2:  # Every substring, not only the sampled candidate.
    i, j = sorted(random.Random(text).sample(range(len(text) + 1), 2))
    assert _accepts(pattern, text[i:j])


def test_substring_of_is_linear():
  text = "".join(random.Random(1).choice("abcdefgh ") for _ in range(3000))
  graph = _labels.substring_of(text)
  assert graph.num_states <= 2 * len(text) and len(graph.arcs) <= 3 * len(text)
  dfa = _fsa.compile_byte_dfa(graph)
  assert dfa.num_states <= 2 * len(text)
  assert dfa.accepts(text[1234:2345].encode()) and not dfa.accepts(b"hh hh hh hh")


@pytest.mark.parametrize("item, delimiter", [
    (r"\d+", ", "), (r"[a-z]{1,3}", r",\s?"), (r"(?:yes|no)", "/"), ("x", ""),
])
@pytest.mark.parametrize("text", ["1, 22, 333", "1", "", "1,2", "ab, c", "abcd", "ab,c,d",
                                  "yes/no/yes", "yes/", "xxx", "a,"])
def test_delimited_list_is_the_expanded_regex(item, delimiter, text):
  pattern = f"(?P<DELIMITED_LIST>{item}|{delimiter})"
  expected = re.fullmatch(f"{item}(?:{delimiter}{item})*", text) is not None
  assert _accepts(pattern, text) == expected


_COLORS = ["red", "green", "blue", "red"]


def _subsequences(items, delimiter):
  return {delimiter.join(items[i] for i in chosen) for k in range(1, len(items) + 1)
          for chosen in itertools.combinations(range(len(items)), k)}


@_SETTINGS
@hypothesis.given(st.lists(st.sampled_from(_COLORS + ["", ", ", ","]), max_size=5).map("".join))
def test_delimited_subsequence_is_brute_force(text):
  pattern = "(?P<DELIMITED_SUBSEQUENCE_OF>red|green|blue|red|, )"
  assert _accepts(pattern, text) == (text in _subsequences(_COLORS, ", "))


def test_delimited_subsequence_examples():
  pattern = "(?P<DELIMITED_SUBSEQUENCE_OF>a|b+|c|; )"
  assert _accepts(pattern, "a; bbb; c") and _accepts(pattern, "bb") and _accepts(pattern, "a; c")
  assert not _accepts(pattern, "c; a") and not _accepts(pattern, "") and not _accepts(pattern, "a;")


@pytest.mark.parametrize("pattern, expanded", [
    (r"(?P<QUOTED_TEXT>): (?P<QUOTED_TEXT>)", r'(?:{s}): (?:{s})'),
    (r"(?P<QUOTED_TEXT>){2,3}", r"(?:{s}){{2,3}}"),
    (r"\[(?P<DELIMITED_LIST>(?P<QUOTED_TEXT>)|, )?\]", r"\[(?:{s}(?:, {s})*)?\]"),
    (r"(?x) (?P<QUOTED_TEXT>) \s* (?P<SUBSTRING_OF>ab c)", r"(?:{s})\s*(?:a|b|c|ab|bc|abc)"),
    (r"(?i:x)(?P<QUOTED_TEXT>)+", r"[xX](?:{s})+"),
])
@pytest.mark.parametrize("text", ['"a": "b"', '"a""b"', '"a""b""c"', '[]', '["a", "b"]',
                                  '["a",]', '"x" bc', '"x"abc', 'x"a"', 'X"a""b"', '"a"'])
def test_labels_compose_like_groups(pattern, expanded, text):
  string = r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"'
  oracle = expanded.format(s=string)
  assert _accepts(pattern, text) == (re.fullmatch(oracle, text) is not None), (pattern, text)


def test_labels_need_opting_in():
  assert isinstance(_regex.parse_regex("(?P<TEXT_TOKEN>)", labels=True), ir.Terminal)
  with pytest.raises(errors.UnsupportedRegexError, match="named group 'TEXT_TOKEN' at position 0"):
    _regex.parse_regex("(?P<TEXT_TOKEN>)")


# --- Every error path, with its message ---------------------------------------------------

_ERRORS = [
    ("ab(?P<IMAGE>)", r"IMAGE at position 2, which is not supported for text models\."
                      r" Expected a text label"),
    ("(?P<FOO>a)", r"named group 'FOO' at position 0, which is not a terminal label\."
                   r" Expected one of QUOTED_TEXT"),
    ("(?P<foo>a)(?P<foo>b)", r"named group 'foo' twice \(again at position 10\)"),
    ("x(?P<QUOTED_TEXT>y)", r"QUOTED_TEXT at position 17, which takes no argument"),
    ("(?P<TEXT_TOKEN>a)", r"TEXT_TOKEN at position 15, which takes no argument"),
    ("(?P<TEXT_UNTIL>)", r"TEXT_UNTIL at position 15, without a stop phrase"),
    ("(?P<SUBSTRING_OF>)", r"SUBSTRING_OF at position 17, without the text"),
    ("(?P<SUBSTRING_OF>a.b)", r"SUBSTRING_OF at position 17, with an argument that is not"
                              r" literal text\. Expected plain characters and escapes"),
    ("(?P<TEXT_UNTIL>a|b)", r"TEXT_UNTIL at position 15, with an argument that is not literal"),
    (r"(?P<SUBSTRING_OF>\ud800)", r"SUBSTRING_OF at position 17, with the surrogate U\+D800"),
    ("(?i)(?P<TEXT_UNTIL>End)", r"TEXT_UNTIL at position 19, under \(\?i\)"),
    ("(?P<DELIMITED_LIST>a)", r"DELIMITED_LIST at position 0, with 1 argument\(s\)\. Expected"
                              r" \(\?P<DELIMITED_LIST>ITEM\|DELIMITER\)"),
    ("(?P<DELIMITED_LIST>a|b|,)", r"DELIMITED_LIST at position 0, with 3 argument\(s\)"),
    ("(?P<DELIMITED_SUBSEQUENCE_OF>,)", r"DELIMITED_SUBSEQUENCE_OF at position 0, without items"),
    ("(?P<DELIMITED_SUBSEQUENCE_OF>a||,)",
     r"DELIMITED_SUBSEQUENCE_OF at position 31, with an empty item"),
    ("(?P<DELIMITED_LIST>(?=a)b|,)", r"lookahead at position 19, which is not supported"),
    ("(?P<DELIMITED_LIST>^a|,)", r"anchor at position 19, which is not supported"),
    ("^(?P<QUOTED_TEXT>)^", r"anchor at position 18, which is not supported"),
    ("(?P<DELIMITED_LIST>(?P<IMAGE>)|,)", r"IMAGE at position 19, which is not supported"),
]


@pytest.mark.parametrize("pattern, message", _ERRORS, ids=[p for p, _ in _ERRORS])
def test_error_messages(pattern, message):
  with pytest.raises(errors.UnsupportedRegexError, match=message):
    cd.Regex(pattern).to_ir()


def test_syntax_errors_keep_their_position():
  with pytest.raises(errors.RegexSyntaxError, match="missing \\), unterminated subpattern at"
                                                     " position 35"):
    cd.Regex("(?P<QUOTED_TEXT>)(?P<QUOTED_TEXT>)x(").to_ir()


def test_back_end_rejects_unknown_token_classes(byte_compiler):
  with pytest.raises(errors.UnsupportedFeatureError, match="Terminal 'IMAGE' .* is not a token"
                                                           " class. Expected one of"):
    _fsa.compile_byte_dfa(ir.Terminal("IMAGE"))
  with pytest.raises(ValueError, match="Token class 'X' is unknown"):
    _token_classes.class_bits(byte_compiler.trie, "X", 9)


def test_compose_needs_the_bitmap_width(byte_compiler):
  dfa = _fsa.compile_byte_dfa(ir.Terminal("TEXT_TOKEN"))
  with pytest.raises(ValueError, match="num_words=0 for an automaton with token-class arcs"):
    _compose.compose_token_dfa(dfa, byte_compiler.trie)


def test_empty_token_class_is_an_empty_constraint(tmp_path):
  vocab = cd.Vocabulary.from_token_bytes([b"\n", b"\n\n", None], eos_ids=[2])
  compiler = cd.Compiler(vocab, cd.CompileOptions(cache_dir=str(tmp_path)))
  assert compiler.compile(cd.Regex("(?P<TEXT_TOKEN>)"))  # "\n" is text.
  with pytest.raises(errors.EmptyConstraintError, match="no sequence of tokens"):
    compiler.compile(cd.Regex("(?P<PARAGRAPH_TOKEN>)"))
  # An alternative through an empty class is dropped, the rest stays.
  tables = compiler.compile(cd.Regex("(?P<PARAGRAPH_TOKEN>)|\n"))
  assert reference_accepts(tables, [0]) and (tables.state_terminals[..., 0] < 0).all()


# --- The back end: token-class arcs ---------------------------------------------------------


@pytest.mark.parametrize("pattern", [
    "(?P<PARAGRAPH_TOKEN>){2}", "a(?P<TEXT_TOKEN>)*b|(?P<PARAGRAPH_TOKEN>)c",
    "(?P<TEXT_UNTIL>ab)(?P<TEXT_TOKEN>)?", "(?P<SUBSTRING_OF>abcab)(?P<PARAGRAPH_TOKEN>)+",
])
def test_fast_back_end_equals_openfst_pipeline(pattern):
  node = cd.Regex(pattern).to_ir()
  fast, slow = _fsa.compile_byte_dfa(node), _fsa.fst_to_byte_dfa(_fsa.ir_to_fst(node))
  assert len(fast.token_arcs) > 0 and _equivalent(fast, slow)


def _symbols(dfa, q) -> np.ndarray:
  """int [256 + token classes]: the targets of state q on every byte and token class."""
  row = np.concatenate([dfa.transitions[q], np.full(len(ir.TOKEN_CLASSES), -1)])
  for s, k, t in dfa.token_arcs.tolist():
    if s == q:
      row[256 + k] = t
  return row


def _equivalent(a, b) -> bool:
  """Whether two DFAs over bytes and token classes accept the same language (BFS)."""
  seen, frontier = {(a.start, b.start)}, [(a.start, b.start)]
  while frontier:
    p, q = frontier.pop()
    row_a, row_b = _symbols(a, p), _symbols(b, q)
    if a.accepting[p] != b.accepting[q] or not np.array_equal(row_a >= 0, row_b >= 0):
      return False
    for pair in zip(row_a[row_a >= 0].tolist(), row_b[row_b >= 0].tolist()):
      if pair not in seen:
        seen.add(pair)
        frontier.append(pair)
  return True


def test_token_classes_against_the_vocabulary(gemma_compiler, gemma_vocab):
  def bits_of(ids):
    return tables_lib.bitmask(np.array(ids), gemma_vocab.vocab_size)

  text, paragraph = [], []
  for i, data in enumerate(gemma_vocab.token_bytes):
    try:
      ok = data is not None and data != b"" and data.decode("utf-8") is not None
    except UnicodeDecodeError:
      ok = False
    if ok:
      text.append(i)
      if b"\n" not in data:
        paragraph.append(i)
  for name, ids in (("TEXT_TOKEN", text), ("PARAGRAPH_TOKEN", paragraph)):
    assert np.array_equal(gemma_compiler.wide_states.token_class_bits(name), bits_of(ids))
  assert 250_000 < len(paragraph) < len(text) < gemma_vocab.vocab_size
  eos = set(gemma_vocab.eos_ids)
  assert not eos & set(text)


# --- Token-level labels with the Gemma 3 vocabulary, host reference and device -----------


@pytest.fixture(scope="module")
def index(gemma_vocab):
  return TokenIndex(gemma_vocab)


def _device_walk(tables, tokens):
  """(state, done, error) after feeding `tokens` (one row) with the jitted runtime."""
  advance = jax.jit(cd.advance)
  state = cd.init_state(tables, batch_size=1)
  for t in tokens:
    state = advance(tables, state, np.array([t], np.int32))
  return int(state.state[0]), bool(state.done[0]), bool(state.error[0])


def _token_set(bits, vocab_size):
  return np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)


def test_two_paragraph_tokens_then_end(gemma_compiler, gemma_vocab, index):
  tables = gemma_compiler.compile(cd.Regex("(?P<PARAGRAPH_TOKEN>){2}"))
  v = gemma_vocab.vocab_size
  paragraph = _token_set(gemma_compiler.wide_states.token_class_bits("PARAGRAPH_TOKEN"), v)
  eos = np.zeros(v, bool)
  eos[list(gemma_vocab.eos_ids)] = True
  start = int(tables.start[0])
  assert np.array_equal(reference_allowed(tables, start), paragraph)
  rng = random.Random(0)
  chosen = rng.sample(np.nonzero(paragraph)[0].tolist(), 2)
  states, ok = reference_walk(tables, chosen)
  assert ok and np.array_equal(reference_allowed(tables, states[0]), paragraph)
  assert np.array_equal(reference_allowed(tables, states[1]), eos)
  # The device runtime agrees, and stops on end of sequence after exactly two tokens.
  assert _device_walk(tables, chosen + [gemma_vocab.eos_ids[0]]) == (states[1], True, False)
  assert _device_walk(tables, chosen[:1] + [gemma_vocab.eos_ids[0]])[2]  # Too early: error.
  newline = index.longest_tokenization(b"\n")
  assert reference_walk(tables, newline)[1] is False
  assert _device_walk(tables, newline)[2]
  assert reference_walk(tables, index.longest_tokenization(b"\n\n"))[1] is False
  # Two tokens, not two characters: a long paragraph token counts as one.
  long_token = index.longest_tokenization(b" international")
  assert len(long_token) == 1
  assert reference_accepts(tables, long_token * 2)
  assert not reference_accepts(tables, index.longest_tokenization(b"a") * 3)


def test_bullets_of_paragraph_tokens(gemma_compiler, gemma_vocab, index):
  """The paper's example (Sec. 2.5.1): a heading, then bullets of newline-free tokens."""
  tables = gemma_compiler.compile(cd.Regex("Summary:\n(?:- (?P<PARAGRAPH_TOKEN>)+\n){2,3}"))
  rng = random.Random(1)
  for _ in range(30):
    bullets = ["".join(rng.choice(["ab", " cd", "é", "中文", "😀", "-", " - "])
                       for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 4))]
    text = "Summary:\n" + "".join(f"- {b}\n" for b in bullets)
    # The bullet bodies as whole tokens (each a paragraph token if it is whole
    # characters); the fixed text in any tokenization.
    tokens, whole = index.random_tokenization(b"Summary:\n", rng), True
    for b in bullets:
      body = index.longest_tokenization(b.encode())
      whole &= all(_is_utf8(gemma_vocab.token_bytes[t]) for t in body)
      tokens += index.random_tokenization(b"- ", rng) + body
      tokens += index.random_tokenization(b"\n", rng)
    expected = whole and re.fullmatch(r"Summary:\n(?:- [^\n]+\n){2,3}", text) is not None
    assert reference_accepts(tables, tokens) == expected, text
  # A bullet body holding a newline token is cut short by it.
  bad = index.longest_tokenization(b"Summary:\n- a\n\n- b\n")
  assert not reference_accepts(tables, bad)


def _is_utf8(data: bytes) -> bool:
  try:
    data.decode("utf-8")
    return True
  except UnicodeDecodeError:
    return False


def test_explicit_edges_take_precedence(gemma_compiler, index):
  tables = gemma_compiler.compile(cd.Regex("(?P<TEXT_TOKEN>)|abc"))
  [abc] = index.longest_tokenization(b"abc")
  assert reference_accepts(tables, [abc])  # Explicit "abc", or TEXT_TOKEN: both accept.
  [ab] = index.longest_tokenization(b"ab")
  states, ok = reference_walk(tables, [ab])  # Explicit: still needs "c".
  assert ok and not reference_accepts(tables, [ab])
  assert reference_accepts(tables, [ab] + index.longest_tokenization(b"c"))
  hello = index.longest_tokenization(b"hello")
  assert len(hello) == 1 and reference_accepts(tables, hello)


def test_terminal_precedence_order(gemma_compiler, gemma_vocab, index):
  """PARAGRAPH_TOKEN before TEXT_TOKEN when a token is in both (documented order)."""
  tables = gemma_compiler.compile(cd.Regex("(?P<TEXT_TOKEN>)|(?P<PARAGRAPH_TOKEN>)x"))
  start = int(tables.start[0])
  assert tables.state_terminals.shape[1] == 2
  first, second = tables.state_terminals[start]
  text_bits = gemma_compiler.wide_states.token_class_bits("TEXT_TOKEN")
  paragraph_bits = gemma_compiler.wide_states.token_class_bits("PARAGRAPH_TOKEN")
  assert np.array_equal(tables.terminal_bits[first[0]], paragraph_bits)
  assert np.array_equal(tables.terminal_bits[second[0]], text_bits)
  [hello] = index.longest_tokenization(b"hello")
  [newline] = index.longest_tokenization(b"\n")
  [x] = index.longest_tokenization(b"x")
  assert not reference_accepts(tables, [hello])  # Read as PARAGRAPH_TOKEN: needs "x".
  assert reference_accepts(tables, [hello, x])
  assert reference_accepts(tables, [newline])  # Only a TEXT_TOKEN.
  for tokens in ([hello], [hello, x], [newline]):
    states, _ = reference_walk(tables, tokens)
    assert _device_walk(tables, tokens) == (states[-1], False, False)


@pytest.mark.parametrize("pattern", [
    "(?P<PARAGRAPH_TOKEN>){2}", "(?P<TEXT_TOKEN>)|(?P<PARAGRAPH_TOKEN>)x",
    'Answer: (?P<TEXT_UNTIL>END)', '\\{"a": (?P<QUOTED_TEXT>)\\}',
])
def test_device_agrees_with_reference_on_random_walks(pattern, gemma_compiler):
  tables = gemma_compiler.compile(cd.Regex(pattern))
  rng = np.random.default_rng(0)
  allowed = jax.jit(cd.allowed_tokens)
  advance = jax.jit(cd.advance)
  state = cd.init_state(tables, batch_size=4)
  ref = [int(tables.start[0])] * 4
  for _ in range(8):
    mask = np.asarray(allowed(tables, state))
    done = np.asarray(state.done)
    tokens = []
    for row in range(4):
      if not done[row]:
        assert np.array_equal(mask[row], reference_allowed(tables, ref[row]))
      tokens.append(int(rng.choice(np.nonzero(mask[row])[0])))
    state = advance(tables, state, np.array(tokens, np.int32))
    for row in range(4):
      if not bool(state.done[row]):
        ref[row] = reference_step(tables, ref[row], tokens[row])
        assert int(state.state[row]) == ref[row]
    assert not np.asarray(state.error).any()


# --- Byte-level labels with the Gemma 3 vocabulary: wide states -------------------------------


@pytest.mark.parametrize("pattern, max_edges", [
    ("(?P<QUOTED_TEXT>)", 5_000), ("(?P<UNQUOTED_TEXT>)", 5_000),
    ("(?P<TEXT_UNTIL>\n\n)", 5_000), ("(?P<TEXT_UNTIL>END)", 5_000),
    ("(?P<DELIMITED_LIST>(?P<QUOTED_TEXT>)|, )", 5_000),
    ("Answer: (?P<TEXT_UNTIL>END)", 5_000), ("key: (?P<UNQUOTED_TEXT>)\n", 5_000),
])
def test_free_text_labels_become_terminal_edges(pattern, max_edges, gemma_compiler):
  _, info = gemma_compiler.compile_with_info(cd.Regex(pattern))
  assert info.num_terminals >= 1
  assert info.token_edges < max_edges  # Against ~255k per free-text state without them.
  assert info.nbytes["total"] < 2 << 20


_EXPANDED = {  # The same languages in `regex` syntax, for the partial-match oracle.
    "(?P<QUOTED_TEXT>)": r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"',
    "(?P<TEXT_UNTIL>\n\n)": r"(?s)(?:(?!\n\n).)*\n\n",
    "Say (?P<TEXT_UNTIL>END)!": r"(?s)Say (?:(?!END).)*END!",
}


@pytest.mark.parametrize("pattern, text", [
    ("(?P<QUOTED_TEXT>)", '"wide é 中 \\" 😀 state"'),
    ("(?P<TEXT_UNTIL>\n\n)", "one line\nnext\n\n"),
    ("Say (?P<TEXT_UNTIL>END)!", "Say it: EN, NED, ENEND!"),
])
def test_viability_oracle(pattern, text, gemma_compiler, gemma_vocab, index):
  """At prefixes of a match, allowed tokens == tokens that keep a match possible."""
  tables = gemma_compiler.compile(cd.Regex(pattern))
  compiled = regex.compile(_EXPANDED[pattern])
  rng = random.Random(0)
  eos = set(gemma_vocab.eos_ids)
  for cut in sorted({0, 1, len(text) // 2, len(text) - 1}):
    prefix = text[:cut]
    states, ok = reference_walk(tables, index.longest_tokenization(prefix.encode()))
    assert ok
    allowed = reference_allowed(tables, states[-1] if states else int(tables.start[0]))
    for token, data in enumerate(gemma_vocab.token_bytes):
      if token in eos or data is None:
        assert allowed[token] == (token in eos and compiled.fullmatch(prefix) is not None)
        continue
      try:
        suffix = data.decode("utf-8")
      except UnicodeDecodeError:
        continue  # Partial characters: checked by the regex tests' own oracle.
      ours = bool(allowed[token])
      if ours and rng.random() > 0.03:
        continue  # Subsample the (many) allowed tokens; check every forbidden one.
      assert (compiled.fullmatch(prefix + suffix, partial=True) is not None) == ours, (
          prefix, data)


@pytest.mark.parametrize("pattern, oracle", [
    ("(?P<QUOTED_TEXT>)", _json_string),
    ("(?P<UNQUOTED_TEXT>)", lambda s: _yaml_plain_scalar(s) and "\t" not in s),
    ("(?P<TEXT_UNTIL>\n\n)", lambda s: _text_until(s, "\n\n")),
    ("(?P<SUBSTRING_OF>The quick brown fox)", lambda s: s != "" and s in "The quick brown fox"),
])
def test_soundness_and_completeness_with_gemma(pattern, oracle, gemma_compiler, index):
  tables = gemma_compiler.compile(cd.Regex(pattern))
  dfa = _dfa(pattern)
  rng = random.Random(pattern)
  for _ in range(30):
    data = random_accepted_bytes(dfa, rng, soft_limit=30)
    text = data.decode("utf-8")
    assert oracle(text), text  # The byte language is right...
    tokens = index.random_tokenization(data, rng)
    assert reference_accepts(tables, tokens), text  # ...and every tokenization is kept.


def test_stacked_tables_keep_each_terminal_order(gemma_compiler, index):
  """Tables with two terminals per state stack with tables that have one."""
  two = gemma_compiler.compile(cd.Regex("(?P<TEXT_TOKEN>)|(?P<PARAGRAPH_TOKEN>)x"))
  one = gemma_compiler.compile(cd.Regex("(?P<QUOTED_TEXT>)"))
  stacked = cd.stack_tables([one, two])
  assert stacked.state_terminals.shape[1] == 2
  [hello] = index.longest_tokenization(b"hello")
  [x] = index.longest_tokenization(b"x")
  quoted = index.longest_tokenization(b'"hi there"')
  for constraint, tokens, accepted in [(1, [hello], False), (1, [hello, x], True),
                                       (0, quoted, True), (0, [hello], False)]:
    start = int(stacked.start[constraint])
    assert reference_accepts(stacked, tokens, start) == accepted
    ids = jax.numpy.array([constraint], jax.numpy.int32)
    state = cd.init_state(stacked, constraint_ids=ids)
    for t in tokens:
      state = jax.jit(cd.advance)(stacked, state, np.array([t], np.int32))
    assert bool(state.error[0]) == (constraint == 0 and not accepted)
    states, ok = reference_walk(stacked, tokens, start)
    if ok:
      assert int(state.state[0]) == states[-1]
