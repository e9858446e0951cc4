"""Regex constraints end to end with the real Gemma 3 vocabulary, against Python's `re`.

Oracles: `re.fullmatch` (accept/reject), `regex.fullmatch(..., partial=True)` (which
tokens keep a prefix viable), hypothesis-generated matching strings under random
non-canonical tokenizations (completeness) and random walks (soundness).
"""

import random
import re

import hypothesis
import numpy as np
import pytest
import regex
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.testing import (TokenIndex, reference_accepts, reference_allowed,
                                          reference_step)

MULTIPLE_CHOICE = r"Red|Orange|Yellow|Green|Blue|Indigo|Violet"
DATE_TIME = r"\d{4}-[01]\d-[0-3]\dT[0-2]\d:[0-5]\d:[0-5]\d([+][0-2]\d:[0-5]\d|Z)"
IPV4 = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"

# (pattern, texts to check); the expected verdict always comes from re.fullmatch.
CASES = [
    (MULTIPLE_CHOICE, ["Red", "Indigo", "Violet", "red", "Re", "RedOrange", ""]),
    (DATE_TIME, ["2024-11-21T23:42:08Z", "1999-01-31T00:00:00+05:30", "2024-13-01T00:00:00Z",
                 "2024-11-21 23:42:08Z", "2024-11-21T23:42:08", "٢٠٢٤-11-21T23:42:08Z"]),
    (IPV4, ["192.168.0.1", "255.255.255.255", "256.1.1.1", "1.2.3", "01.02.03.004", "0.0.0.0"]),
    (r"a", ["a", "", "aa", "b"]),
    (r"", ["", "a"]),
    (r"abc", ["abc", "ab", "abcd"]),
    (r"a|b|c", ["a", "b", "c", "d", "ab"]),
    (r"a*", ["", "a", "aaaa", "ab"]),
    (r"a+", ["", "a", "aaaa"]),
    (r"a?b", ["b", "ab", "aab"]),
    (r"a{3}", ["aa", "aaa", "aaaa"]),
    (r"a{2,}", ["a", "aa", "aaaaa"]),
    (r"a{2,4}", ["a", "aa", "aaaa", "aaaaa"]),
    (r"a{,2}b", ["b", "ab", "aab", "aaab"]),
    (r"a*?b+?c??", ["b", "aabbc", "c"]),
    (r"(ab)+", ["ab", "abab", "aba", ""]),
    (r"(?:ab|cd)*e", ["e", "abcde", "abce"]),
    (r"(a|ab)(c|bcd)(d*)", ["abcd", "abcdd", "acd", "abd"]),
    (r"[abc]+", ["abcabc", "abd"]),
    (r"[a-z0-9_]+", ["hello_42", "Hello"]),
    (r"[^a-z]+", ["ABC123", "ABc", "ÉÀ中", "\n"]),
    (r"[^\n]*", ["anything at all é 😀", "two\nlines"]),
    (r".", ["a", "é", "中", "😀", "\n", "ab", ""]),
    (r".*", ["", "anything é 中 😀", "x\ny"]),
    (r"(?s).*", ["x\ny", "\n\n"]),
    (r"\d+", ["0123456789", "12a", "١٢٣"]),
    (r"\D+", ["abc", "a1"]),
    (r"\w+", ["word_1", "two words", "é"]),
    (r"\W+", [" -+", "a"]),
    (r"\s+", [" \t\n\r\f\v", " x", "\u00a0"]),
    (r"\S+", ["abc", "a b"]),
    (r"[\d\s]+", ["1 2\t3", "1a"]),
    (r"[^\d\s]+", ["abc", "a1"]),
    (r"\.\*\+\?\(\)\[\]\{\}\|\\\^\$", [r".*+?()[]{}|\^$", "x"]),
    (r"\x00\x01\x7f", ["\x00\x01\x7f", "\x00"]),
    (r"[\x00-\x1f]+", ["\x00\x1f\n", " "]),
    (r"\u00e9|\U0001F600", ["é", "😀", "e"]),
    (r"[é-ë]+", ["éêë", "e", "ì"]),
    (r"[α-ω]+", ["αβγ", "αbγ"]),
    (r"中文|日本語|한국어", ["中文", "日本語", "한국어", "中"]),
    (r"[😀-😏]{2}", ["😀😏", "😀", "😐😀"]),
    (r"[^a]", ["b", "a", "é", "😀", "\x00"]),
    (r"café|cafe", ["café", "cafe", "cafë"]),
    (r"^abc$", ["abc", "abc\n"]),
    (r"\Aab\Z", ["ab"]),
    (r"(yes|no)(, (yes|no))*", ["yes", "yes, no, yes", "yes,no"]),
    (r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", ["0", "-12.5e+3", "01", "1.", "3.14"]),
    (r'"([^"\\]|\\.)*"', ['"hello"', '"a \\" b"', '"open', '"é 😀"']),
    (r"[A-Z][a-z]+ [A-Z][a-z]+", ["John Smith", "john Smith"]),
    (r"(0[1-9]|1[0-2])/(0[1-9]|[12]\d|3[01])/\d{4}", ["12/31/1999", "13/01/2000"]),
    (r"#[0-9a-fA-F]{6}", ["#00ffAA", "#00ffA", "#00ffAG"]),
    (r"(\+\d{1,3} )?\(\d{3}\) \d{3}-\d{4}", ["(555) 123-4567", "+1 (555) 123-4567", "555-1234"]),
    (r"[a-z]+@[a-z]+\.(com|org)", ["me@example.com", "me@example.net"]),
    (r"(a|b)*a(a|b){3}", ["abbb", "babab", "aaaa", "bbbb"]),
    (r"[\[\]\-\^]+", ["[]-^", "a"]),
    (r"\t+ +\n*", ["\t \n", "\t\t  \n\n", " "]),
    (r"(?i)abc", ["abc", "ABC", "aBc", "abd"]),
    (r"x{0}y", ["y", "xy"]),
    (r"(?x) a b  c  # comment", ["abc", "a b c"]),
    (r"(ab|a)(bc|c)?", ["abc", "ab", "a", "abbc"]),
    (r"[\u0000-\uffff]", ["\uffff", "\U00010000", "\x00"]),
    (r"\d{2,3}?-\w+?", ["12-ab", "123-a", "1-a"]),
]


@pytest.fixture(scope="module")
def index(gemma_vocab):
  return TokenIndex(gemma_vocab)


def test_at_least_fifty_patterns():
  assert len(CASES) >= 50


@pytest.mark.parametrize("pattern, texts", CASES, ids=[c[0][:40] for c in CASES])
def test_accept_reject_against_re(pattern, texts, gemma_compiler, index):
  try:
    tables = gemma_compiler.compile(cd.Regex(pattern))
  except cd.UnsupportedRegexError:
    pytest.skip(f"{pattern!r} uses a construct outside the supported subset")
  rng = random.Random(pattern)
  for text in texts:
    expected = re.fullmatch(pattern, text, re.ASCII) is not None
    data = text.encode("utf-8")
    assert reference_accepts(tables, index.longest_tokenization(data)) == expected, text
    for _ in range(3):
      assert reference_accepts(tables, index.random_tokenization(data, rng)) == expected, text


def _completions(tail: bytes) -> range:
  """Code points whose UTF-8 encoding starts with the incomplete sequence `tail`."""
  lead = tail[0]
  length = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
  payload = lead & (0x7F >> length)
  for b in tail[1:]:
    payload = (payload << 6) | (b & 0x3F)
  shift = 6 * (length - len(tail))
  lo = max(payload << shift, (0x80, 0x800, 0x10000)[length - 2])
  return range(lo, min(((payload + 1) << shift) - 1, 0x10FFFF) + 1)


def _split_incomplete(data: bytes):
  """(text, tail): `data` = valid UTF-8 + an incomplete final sequence, or None."""
  for cut in range(len(data), max(len(data) - 4, -1), -1):
    try:
      text = data[:cut].decode("utf-8")
    except UnicodeDecodeError:
      continue
    tail = data[cut:]
    if not tail:
      return text, b""
    try:
      tail.decode("utf-8")
    except UnicodeDecodeError as e:
      if e.reason == "unexpected end of data" and e.start == 0:
        return text, tail
    return None
  return None


def _viable(compiled, data: bytes, allowed_by_us: bool, rng) -> bool:
  split = _split_incomplete(data)
  if split is None:
    return False
  text, tail = split
  if not tail:
    return compiled.fullmatch(text, partial=True) is not None
  candidates = _completions(tail)
  if not allowed_by_us and len(candidates) > 3000:  # sampled search for a counterexample
    candidates = [candidates[0], candidates[-1], *rng.sample(candidates, 3000)]
  return any(compiled.fullmatch(text + chr(c), partial=True) is not None
             for c in candidates if not 0xD800 <= c <= 0xDFFF)


@pytest.mark.parametrize("pattern, text", [
    (DATE_TIME, "2024-11-21T23:42:08+05:30"),
    (IPV4, "192.168.100.1"),
    (MULTIPLE_CHOICE, "Indigo"),
    (r"[^a-z]{1,3}é?", "ÀB中é"),
    (r'\{"a": "[^"\\\n]*"\}', '{"a": "wide é 中 😀 state"}'),  # terminal edges
])
def test_viability_oracle(pattern, text, gemma_compiler, gemma_vocab, index):
  """At prefixes of a match, allowed tokens == tokens keeping a partial match possible."""
  tables = gemma_compiler.compile(cd.Regex(pattern))
  compiled = regex.compile(pattern, regex.ASCII)
  rng = random.Random(0)
  eos = set(gemma_vocab.eos_ids)
  chars = list(text)
  for cut in sorted({0, 1, len(chars) // 2, len(chars) - 1}):
    prefix = "".join(chars[:cut]).encode("utf-8")
    state = int(tables.start[0])
    for t in index.longest_tokenization(prefix):
      state = reference_step(tables, state, t)
    allowed = reference_allowed(tables, state)
    for token, data in enumerate(gemma_vocab.token_bytes):
      if token in eos:
        assert allowed[token] == (compiled.fullmatch(prefix.decode()) is not None)
        continue
      if data is None:
        assert not allowed[token]
        continue
      ours = bool(allowed[token])
      if ours or data[0] in b"0123456789.:-+TZ\"" or rng.random() < 0.05:  # subsample misses
        assert _viable(compiled, prefix + data, ours, rng) == ours, (prefix, data)


_COMPLETENESS = [DATE_TIME, IPV4, MULTIPLE_CHOICE, r"[a-zé ]{1,12}", r"(ab|a)(bc|c)?d*",
                 r'"([^"\\]|\\.){0,8}"', r"[^\n]{0,6}", r'"([^"\\]|\\.)*"', r"[^\n]*\n"]


@pytest.mark.parametrize("pattern", _COMPLETENESS)
@hypothesis.settings(max_examples=40, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(data=st.data())
def test_completeness_random_tokenizations(pattern, data, gemma_compiler, index):
  tables = gemma_compiler.compile(cd.Regex(pattern))
  text = data.draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True)
                   .filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)))
  seed = data.draw(st.integers(0, 2**32))
  tokens = index.random_tokenization(text.encode("utf-8"), random.Random(seed))
  assert reference_accepts(tables, tokens)


@pytest.mark.parametrize("pattern", _COMPLETENESS + [r".{0,5}", r"[^a-z]{2,3}"])
def test_soundness_random_walks(pattern, gemma_compiler, gemma_vocab):
  tables = gemma_compiler.compile(cd.Regex(pattern))
  compiled = regex.compile(pattern, regex.ASCII)
  rng = np.random.default_rng(0)
  eos = list(gemma_vocab.eos_ids)
  for _ in range(25):
    state, out = int(tables.start[0]), []
    for _ in range(24):
      if tables.accepting[state] and rng.random() < 0.3:
        break
      allowed = reference_allowed(tables, state)
      allowed[eos] = False
      choices = np.flatnonzero(allowed)
      if not len(choices):
        assert tables.accepting[state]
        break
      token = int(rng.choice(choices))
      out.append(token)
      state = reference_step(tables, state, token)
    data = gemma_vocab.decode(out)
    if tables.accepting[state]:
      text = data.decode("utf-8")  # never a broken character
      assert re.fullmatch(pattern, text, re.ASCII), (pattern, text)
    else:  # stopped early: still a viable prefix
      assert _viable(compiled, data, True, random.Random(0)), (pattern, data)


def test_empty_constraint_errors(gemma_compiler, byte_compiler):
  with pytest.raises(cd.EmptyConstraintError, match=r"matches no string at all"):
    gemma_compiler.compile(cd.Regex(r"[^\x00-\U0010ffff]"))
  small = cd.Compiler(cd.Vocabulary.from_token_bytes([b"a", b"b", None], eos_ids=[2]),
                      cd.CompileOptions(cache_dir=None))
  with pytest.raises(cd.EmptyConstraintError, match=r"no sequence of tokens of Vocabulary"):
    small.compile(cd.Regex("c"))


def test_compile_budget_errors(gemma_vocab, gemma_compiler):
  tight = cd.Compiler(gemma_vocab, cd.CompileOptions(max_states=50))
  with pytest.raises(cd.CompileBudgetError, match=r"needs \d+ byte-automaton states.*max_states=50"):
    tight.compile(cd.Regex(r"(a|b)*a(a|b){8}"))
  slow = cd.Compiler(gemma_vocab, cd.CompileOptions(max_seconds=0.0))
  with pytest.raises(cd.CompileBudgetError, match=r"exceeded its compile time budget"):
    slow.compile(cd.Regex(r".{0,4}"))


def test_compile_is_memoized(gemma_compiler):
  assert gemma_compiler.compile(cd.Regex("memo")) is gemma_compiler.compile(cd.Regex("memo"))
  assert cd.Regex("a") == cd.Regex("a") and hash(cd.Regex("a")) == hash(cd.Regex("a"))


def test_table_bytes_budget_and_compiler_type_errors(gemma_vocab):
  small = cd.Compiler(gemma_vocab, cd.CompileOptions(max_table_bytes=1000))
  with pytest.raises(cd.CompileBudgetError,
                     match=r"would need 0.3 MiB of tables .*max_table_bytes=1000"):
    small.compile(cd.Regex(r"\d{4}"))
  # Outside the tests' type-checking import hook, which would intercept it first.
  import subprocess, sys  # pylint: disable=g-import-not-at-top,multiple-imports
  out = subprocess.run([sys.executable, "-c", "import constrained_decoding as cd; "
                        "cd.Compiler('gemma')"], capture_output=True, text=True)
  assert "TypeError: Compiler got str. Expected a cd.Vocabulary." in out.stderr
