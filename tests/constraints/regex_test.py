"""Tests for the regex front end (`constraints/_regex.py`), with `re.fullmatch` as oracle.

The language is checked at the `ByteDfa` level: `compile_byte_dfa(parse_regex(p))`
must accept `text.encode()` exactly when `re.fullmatch(p, text, re.ASCII)` matches
(`re.fullmatch(p, text)` with `unicode=True`).
"""

import functools
import re

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from constrained_decoding import errors
from constrained_decoding.automata import _fsa
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _regex
from constrained_decoding.constraints import _regex_classes

MULTIPLE_CHOICE = r"Red|Orange|Yellow|Green|Blue|Indigo|Violet"
DATE_TIME = r"\d{4}-[01]\d-[0-3]\dT[0-2]\d:[0-5]\d:[0-5]\d([+][0-2]\d:[0-5]\d|Z)"
IPV4 = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"


@functools.cache
def _dfa(pattern: str, unicode: bool = False):
  return _fsa.compile_byte_dfa(_regex.parse_regex(pattern, unicode=unicode))


def _oracle(pattern: str, text: str, unicode: bool = False) -> bool:
  return re.fullmatch(pattern, text, 0 if unicode else re.ASCII) is not None


# (pattern, text, accepted): the verdict is also checked against re.fullmatch.
CASES = [
    # The paper's regexes.
    (MULTIPLE_CHOICE, "Red", True),
    (MULTIPLE_CHOICE, "Violet", True),
    (MULTIPLE_CHOICE, "red", False),
    (MULTIPLE_CHOICE, "Re", False),
    (MULTIPLE_CHOICE, "RedOrange", False),
    (MULTIPLE_CHOICE, "", False),
    (DATE_TIME, "2024-01-31T12:00:59Z", True),
    (DATE_TIME, "1999-12-01T23:59:00+05:30", True),
    (DATE_TIME, "2024-01-31T12:00:59", False),
    (DATE_TIME, "2024-21-31T12:00:59Z", False),
    (DATE_TIME, "2024-01-41T12:00:59Z", False),
    (DATE_TIME, "2024-01-31T12:60:59Z", False),
    (DATE_TIME, "2024-01-31T12:00:59-01:00", False),
    (DATE_TIME, "\uff12\uff10\uff12\uff14-01-31T12:00:59Z", False),  # Fullwidth digits.
    (IPV4, "192.168.0.1", True),
    (IPV4, "255.255.255.255", True),
    (IPV4, "0.0.0.0", True),
    (IPV4, "01.02.003.4", True),
    (IPV4, "256.1.1.1", False),
    (IPV4, "1.2.3", False),
    (IPV4, "1.2.3.4.", False),
    (IPV4, "1.2.3.4\n", False),
    # The empty string and empty patterns.
    ("", "", True),
    ("", "a", False),
    ("(?:)", "", True),
    ("a*", "", True),
    ("a+", "", False),
    ("a|b|", "", True),
    # {m,n} edge cases.
    ("a{2,3}", "a", False),
    ("a{2,3}", "aa", True),
    ("a{2,3}", "aaa", True),
    ("a{2,3}", "aaaa", False),
    ("a{0}", "", True),
    ("a{0}", "a", False),
    ("a{0,0}b", "b", True),
    ("a{,2}", "aa", True),
    ("a{,2}", "aaa", False),
    ("a{,}", "aaaa", True),
    ("a{2,}", "a", False),
    ("a{2,}", "aaaaa", True),
    ("a{1,1}", "a", True),
    ("(ab){2}", "abab", True),
    ("(?:a|bc){2,3}", "abca", True),
    ("(?:a|bc){2,3}", "a", False),
    ("x{2,3}?", "xx", True),
    ("a{", "a{", True),
    ("a{}", "a{}", True),
    ("a{x}", "a{x}", True),
    ("(?:a?){3}", "", True),
    ("(?:a*)*b", "aab", True),
    # Nested groups.
    ("((a|b)(c|d))+", "acbd", True),
    ("((a|b)(c|d))+", "ab", False),
    ("(a(b(c)?)?)?", "ab", True),
    ("(a(b(c)?)?)?", "ac", False),
    ("(?:(?:a|b)+c)*", "abcbc", True),
    ("(?:(?:a|b)+c)*", "abcb", False),
    # Lazy quantifiers are the same language.
    ("a+?", "aaa", True),
    ("a*?b", "aab", True),
    ("a??", "", True),
    # Unicode texts: accents, CJK, emoji, astral characters.
    ("café", "café", True),
    ("café", "cafe", False),
    ("日本語", "日本語", True),
    (".", "é", True),
    (".", "中", True),
    (".", "😀", True),
    (".", "\U00010400", True),
    ("..", "😀", False),
    (".{2}", "é中", True),
    ("[é-ü]+", "éü", True),
    ("[é-ü]+", "e", False),
    ("[😀-😂]", "😁", True),
    ("[😀-😂]", "😃", False),
    ("\\U0001F600\\u00e9\\x41", "😀éA", True),
    # `.` and newlines.
    (".", "\n", False),
    ("(?s).", "\n", True),
    ("(?s:.)a", "\na", True),
    (".*", "x\ny", False),
    ("[^\\n]*", "anything é 中 😀", True),
    # Negated classes with non-ASCII members.
    ("[^a]", "é", True),
    ("[^é]", "é", False),
    ("[^é]", "e", True),
    ("[^é😀]+", "abc中", True),
    ("[^é😀]+", "ab😀", False),
    ("[^\\u4e00-\\u9fff]+", "abc😀é", True),
    ("[^\\u4e00-\\u9fff]+", "ab中", False),
    ("[^\\x00-\\x7f]+", "éü中😀", True),
    ("[^\\x00-\\x7f]+", "éa", False),
    # ASCII classes (the default mode) against non-ASCII text.
    ("\\d", "\u0663", False),  # ARABIC-INDIC DIGIT THREE
    ("\\D", "\u0663", True),
    ("\\w+", "héllo", False),
    ("\\W", "é", True),
    ("\\s", "\u00a0", False),
    ("\\S", "\u00a0", True),
    ("\\s+", " \t\n\r\f\v", True),
    ("[\\w.-]+@[\\w-]+\\.\\w+", "a.b-c@d-e.fg", True),
    # Escapes.
    ("\\.", ".", True),
    ("\\.", "a", False),
    ("[\\]]", "]", True),
    ("[]a]", "]", True),
    ("\\t\\0\\101", "\t\x00A", True),
    ("\\N{EM DASH}", "\u2014", True),
    ("\\(\\?=\\)", "(?=)", True),
    ("[(?=)]+", "(?=)", True),
    ("[\\b]", "\b", True),
    # Anchors at the very start and end are no-ops.
    ("^abc$", "abc", True),
    ("\\Aabc\\Z", "abc", True),
    ("abc$", "abc\n", False),
    ("^a|^b", "b", True),
    ("(?:^a|b$)", "b", True),
    ("(?m)^a$", "a", True),
    ("^$", "", True),
    ("$|$", "", True),
    # Inline flags.
    ("(?i)hello", "HeLLo", True),
    ("(?i)[a-z]+", "ABCxyz", True),
    ("(?i:a)b", "Ab", True),
    ("(?i:a)b", "AB", False),
    ("(?i)k", "\u212a", False),  # KELVIN SIGN: only with Unicode semantics.
    ("(?i)[^k]", "K", False),
    ("(?x) a b  # a comment\n c", "abc", True),
    ("(?x) a [ ] b", "a b", True),
    ("(?x) a\\ b", "a b", True),
    ("(?u)\\w+", "héllo", None),  # None: only checked against re (Unicode: (?u)).
    ("(?u:\\d)", "\u0663", True),
    # A literal surrogate cannot occur in UTF-8 text.
    ("a|\\ud800", "a", True),
]


@pytest.mark.parametrize("pattern, text, accepted", CASES)
def test_accept_reject_table(pattern, text, accepted):
  unicode = "(?u)" in pattern
  expected = _oracle(pattern, text, unicode=unicode)
  if accepted is not None:
    assert expected == accepted, "the table disagrees with re.fullmatch"
  assert _dfa(pattern, unicode).accepts(text.encode()) == expected


UNICODE_CASES = [
    ("\\w+", "héllo_中文", True),
    ("\\w", "😀", False),
    ("\\d+", "\u0663\u0664", True),
    ("\\d", "\u00b2", False),  # SUPERSCRIPT TWO is a digit but not decimal.
    ("\\s", "\u2003", True),
    ("\\S", "\u2003", False),
    ("\\W", "é", False),
    ("[^\\w\\s]+", "!?😀", True),
    ("(?a)\\w", "é", False),
    ("(?a:\\w)", "é", False),
    ("(?i)k", "\u212a", True),
    ("(?i)ß", "ẞ", True),
    ("(?i)σ+", "Σσς", True),
    (DATE_TIME, "\uff12\uff10\uff12\uff14-01-31T12:00:59Z", True),
]


@pytest.mark.parametrize("pattern, text, accepted", UNICODE_CASES)
def test_accept_reject_table_unicode(pattern, text, accepted):
  assert _oracle(pattern, text, unicode=True) == accepted
  assert _dfa(pattern, unicode=True).accepts(text.encode()) == accepted


def test_inline_ascii_flag_beats_unicode_argument():
  assert not _dfa("(?a)\\w", unicode=True).accepts("é".encode())
  assert _dfa("\\w", unicode=True).accepts("é".encode())


def test_ir_is_small():
  assert _regex.parse_regex("abc") == ir.Bytes(b"abc")
  assert _regex.parse_regex("[a-c]") == ir.CharClass(((0x61, 0x63),))
  assert _regex.parse_regex("ab(cd)e") == ir.Bytes(b"abcde")
  assert _regex.parse_regex("a(b|c)d") == ir.Concat((ir.Bytes(b"a"),
                                                     ir.CharClass(((0x62, 0x63),)),
                                                     ir.Bytes(b"d")))
  assert _regex.parse_regex("a|b|c") == ir.CharClass(((0x61, 0x63),))
  assert _regex.parse_regex("ab|cd") == ir.Union((ir.Bytes(b"ab"), ir.Bytes(b"cd")))
  assert _regex.parse_regex("(?:ab)*") == ir.Repeat(ir.Bytes(b"ab"), 0, None)
  assert _regex.parse_regex("^$") == ir.EPSILON


# --- Property tests --------------------------------------------------------------------

_PROPERTY_PATTERNS = [
    MULTIPLE_CHOICE,
    DATE_TIME,
    IPV4,
    r"[^\"\\]*",
    r"(?:[a-zé]|\d)+",
    r".{1,3}",
    r"\w+(?:\s\w+)*",
    r"[^a-z\u00e0-\u00ff]+",
    r"(?i)[a-zß]+",
    r"\S+é?\W",
    r"(?s)[😀-🙏]*.?",
]
_ALPHABET = st.sampled_from(
    list("aZz09_ .-:+T\n\t\"\\") + ["é", "ß", "ẞ", "中", "\u00a0", "\u0663", "😀", "🙏",
                                    "\U00010400", "\U0010FFFF", "\x00", "\x7f"]
)


@pytest.mark.parametrize("pattern", _PROPERTY_PATTERNS)
@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(text=st.text(_ALPHABET, max_size=12) | st.text(max_size=12))
def test_random_strings_agree_with_re(pattern, text):
  assert _dfa(pattern).accepts(text.encode()) == _oracle(pattern, text)


@pytest.mark.parametrize("pattern", _PROPERTY_PATTERNS)
@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(data=st.data())
def test_generated_matches_are_accepted(pattern, data):
  text = data.draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True))
  hypothesis.assume(_oracle(pattern, text))
  assert _dfa(pattern).accepts(text.encode())


@pytest.mark.parametrize("pattern", [r"\w+", r"\d\s\S", r"(?i)[a-z]k"])
@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(data=st.data())
def test_generated_matches_are_accepted_unicode(pattern, data):
  text = data.draw(st.from_regex(re.compile(pattern), fullmatch=True))
  hypothesis.assume(_oracle(pattern, text, unicode=True))
  assert _dfa(pattern, unicode=True).accepts(text.encode())


# --- Single characters, exhaustively over all code points -------------------------------


@functools.cache
def _scalar_mask() -> np.ndarray:
  mask = np.ones(ir.MAX_CODE_POINT + 1, bool)
  mask[ir.SURROGATES[0] : ir.SURROGATES[1] + 1] = False
  return mask


def _re_single_char_set(pattern: str, flags: int) -> np.ndarray:
  """The scalar values matched by a one-character pattern, according to `re`."""
  everything = _regex_classes._all_code_points()
  # Deleting the matches leaves exactly the characters the pattern does not match.
  rest = re.sub(pattern, "", everything, flags=flags)
  unmatched = np.frombuffer(rest.encode("utf-32-le", "surrogatepass"), "<u4")
  mask = _scalar_mask().copy()
  mask[unmatched] = False
  return mask


def _ir_single_char_set(node) -> np.ndarray:
  mask = np.zeros(ir.MAX_CODE_POINT + 1, bool)
  if isinstance(node, ir.Bytes):
    mask[ord(node.data.decode())] = True
  elif isinstance(node, ir.CharClass):
    for lo, hi in node.ranges:
      mask[lo : hi + 1] = True
  else:
    assert node == ir.NOTHING
  return mask


_SINGLE_CHAR_PATTERNS = [
    # Literals whose case folding is irregular in Unicode.
    "a", "k", "s", "i", "I", "K", "\u00b5", "\u00df", "\u01c5", "\u03c3", "\u0130",
    "\u0131", "\u212a", "\ufb05", "\U00010400", "\U00010428", "1",
    # Classes, negated classes and categories.
    ".", "(?s).", "[a-z]", "[^a-z]", "[kK]", "[^kK]", "[\u017f]", "[\u017fx]",
    "[\u03a3-\u03ab]", "[\u01c5-\u01c8]", "[\\w]", "[a\\W]", "[^\\d]", "[\\s\\d]",
    "[^\"\\\\]", "[\\u0100-\\uffff]", "[^\\x00-\\x1f]", "\\w", "\\W", "\\d", "\\D",
    "\\s", "\\S",
    # Ranges beyond the BMP, where re's case-insensitive matching has quirks.
    "[\\u0100-\\U00010000]", "[\\U00010400-\\U00010427]", "[a\\U00010400]",
    "[\U0001F600-\U0001F602]", "[^\\x00-\\U0010ffff]",
]


@pytest.mark.parametrize("unicode", [False, True], ids=["ascii", "unicode"])
@pytest.mark.parametrize("pattern", _SINGLE_CHAR_PATTERNS)
def test_single_characters_match_re_on_all_code_points(pattern, unicode):
  flags = 0 if unicode else re.ASCII
  for case in ("", "(?i)"):
    ours = _ir_single_char_set(_regex.parse_regex(case + pattern, unicode=unicode))
    theirs = _re_single_char_set(case + pattern, flags)
    differ = np.flatnonzero(ours != theirs)
    assert not differ.size, f"{case + pattern!r} differs on {[hex(c) for c in differ[:8]]}"


def test_unicode_categories_match_re_on_all_code_points():
  for category, name in [("\\d", "DIGIT"), ("\\w", "WORD"), ("\\s", "SPACE")]:
    table = _regex_classes._unicode_categories()[getattr(_regex_classes.sre, f"CATEGORY_{name}")]
    ours = _ir_single_char_set(ir.CharClass(table))
    np.testing.assert_array_equal(ours, _re_single_char_set(category, 0), err_msg=category)


def test_lowercasing_never_crosses_the_bmp_boundary():
  # `_CaseFold.char_class` relies on it to mirror re's charmap/IndexError split.
  lower_of, _ = _regex_classes._unicode_case_tables()
  assert all((c > 0xFFFF) == (lo > 0xFFFF) for c, lo in lower_of.items())


# --- Errors ---------------------------------------------------------------------------------

_UNSUPPORTED = [
    ("a(?=b)", "a lookahead at position 1"),
    ("a(?!b)", "a negative lookahead at position 1"),
    ("(?<=a)b", "a lookbehind at position 0"),
    ("(?<!a)b", "a negative lookbehind at position 0"),
    ("(a)\\1", r"a backreference '\\1' at position 3"),
    ("(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)\\10", r"a backreference '\\10' at position 30"),
    ("(a)?(?(1)b|c)", "a conditional group at position 4"),
    ("x(?>a|ab)c", "an atomic group at position 1"),
    ("a*+", "a possessive quantifier at position 1"),
    ("a{2}+b", "a possessive quantifier at position 1"),
    ("a?+", "a possessive quantifier at position 1"),
    ("\\bfoo", r"a word boundary '\\b' at position 0"),
    ("a\\Bb", r"a word boundary '\\B' at position 1"),
    ("a^b", "an anchor at position 1"),
    ("a$b", "an anchor at position 1"),
    ("a\\Zb", "an anchor at position 1"),
    ("a\\A", "an anchor at position 1"),
    ("(a$)*", "an anchor at position 2"),
    ("(?:^a)+", "an anchor at position 3"),
    ("$^", "an anchor at position 0"),
    ("(?m)a$\\n^b", "an anchor at position 5"),
    ("[(?=]a(?=b)", "a lookahead at position 6"),
    ("(?x) a  # (?=\n (?=b)", "a lookahead at position 15"),
    ("(?#(?=)a(?!b)", "a negative lookahead at position 8"),
]


@pytest.mark.parametrize("pattern, message", _UNSUPPORTED)
def test_unsupported_constructs_name_construct_and_position(pattern, message):
  with pytest.raises(errors.UnsupportedRegexError,
                     match=f"Regex '{re.escape(pattern)}' uses {message}, which is not"
                     " supported"):
    _regex.parse_regex(pattern)


def test_unsupported_messages_say_how_to_fix():
  with pytest.raises(errors.UnsupportedRegexError, match="Rewrite the pattern without"):
    _regex.parse_regex("(?=a)")
  with pytest.raises(errors.UnsupportedRegexError, match="use the greedy form"):
    _regex.parse_regex("a++")
  with pytest.raises(errors.UnsupportedRegexError, match="only at the very start"):
    _regex.parse_regex("a^")


def test_escaped_parenthesis_is_not_a_group():
  assert _dfa(r"\(?=a\)").accepts(b"(=a)")


def test_named_groups_are_reserved_for_terminals():
  with pytest.raises(
      errors.UnsupportedRegexError,
      match=r"named group 'x' at position 2, which is not supported\. Named groups are"
      r" reserved for terminal labels such as QUOTED_TEXT; use \(\?:\.\.\.\) to group",
  ):
    _regex.parse_regex("ab(?P<x>c)")
  with pytest.raises(errors.UnsupportedRegexError, match="named group 'x' at position 0"):
    _regex.parse_regex("(?P<x>a)(?P=x)")


@pytest.mark.parametrize(
    "pattern, message",
    [
        ("a(", r"missing \), unterminated subpattern at position 1"),
        ("[a", "unterminated character set at position 0"),
        ("*a", "nothing to repeat at position 0"),
        ("a{3,2}", "min repeat greater than max repeat at position 2"),
        ("(?au)a", "bad inline flags"),
        ("\\p{L}", r"bad escape \\p at position 0"),
        ("(?<name>a)", "unknown extension"),
        ("a(?i)", "global flags not at the start"),
        ("(?a)(?u)x", "ASCII and UNICODE flags are incompatible"),
    ],
)
def test_syntax_errors(pattern, message):
  with pytest.raises(errors.RegexSyntaxError,
                     match=f"Regex '{re.escape(pattern)}' is not a valid regular"
                     f" expression: .*{message}"):
    _regex.parse_regex(pattern)


def test_bytes_pattern_is_rejected():
  # Under the tests' beartype import hook the annotation `pattern: str` already rejects
  # bytes; check the function's own message too.
  parse = getattr(_regex.parse_regex, "__wrapped__", _regex.parse_regex)
  with pytest.raises(TypeError, match=r"Expected the regex pattern as a str, got bytes"):
    parse(b"abc")
