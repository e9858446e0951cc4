"""The lexer DFA and the lexer-state x token table (`automata/_lexer.py`, issue 18).

Oracles: a reference longest-match lexer written with the `regex` module (a superset of
`re` with partial matching, which gives "can this lexeme still grow" without the DFA),
Python's `tokenize`, and, for the token table, `lex` on the whole text.
"""

import dataclasses
import io
import keyword
import os
import random
import sys
import tokenize
import unicodedata

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _lexer
from constrained_decoding.constraints import _lr

regex = pytest.importorskip("regex")

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # The terminal sets live in benchmarks/lexer_tables.py.
from benchmarks import lexer_tables  # noqa: E402  # pylint: disable=g-import-not-at-top

_IGNORED = {"sql": ("WS",), "python": ("WS", "COMMENT", "CONTINUATION")}


def _spec(name):
  return getattr(lexer_tables, f"{name}_terminals")()


@pytest.fixture(scope="module", params=["sql", "python"])
def terminal_set(request):
  spec = _spec(request.param)
  terms = [_lexer.Terminal(n, p, literal=(k != lexer_tables.RE))
           for n, p, k in spec["terminals"]]
  lexer = _lexer.build_lexer_dfa(terms, ignored=_IGNORED[request.param],
                                 keyword_beats=spec["beaten_by_keywords"])
  return request.param, spec, lexer


# -- Random texts from random terminal sequences. --------------------------------------


def _sampler(pattern):
  """A random string of `pattern`'s language (random walk on its byte DFA, short)."""
  from constrained_decoding.constraints import _regex  # pylint: disable=g-import-not-at-top
  dfa = _fsa.compile_byte_dfa(_regex.parse_regex(pattern, unicode=True))
  q = dfa.num_states
  ascii_only = pattern.startswith("(?i)")
  dist = np.where(dfa.accepting, 0, 10**9)
  for _ in range(q):
    succ = np.where(dfa.transitions >= 0, dist[np.maximum(dfa.transitions, 0)], 10**9)
    dist = np.minimum(dist, succ.min(axis=1) + 1)

  def sample(rng):
    s, out = dfa.start, bytearray()
    while True:
      row = dfa.transitions[s]
      ok = np.nonzero((row >= 0) & (dist[np.maximum(row, 0)] < 10**9))[0]
      if dfa.accepting[s] and (not len(ok) or rng.random() < 0.35 or len(out) > 10):
        return bytes(out)
      if len(out) > 10:
        ok = ok[dist[row[ok]] < dist[s]]
      ascii_ = ok[(ok >= 32) & (ok < 127)]
      # `(?i)` literals stay ASCII: `regex` and `re` fold some letters differently (İ).
      pool = ascii_ if len(ascii_) and (rng.random() < 0.9 or ascii_only) else ok
      b = int(pool[rng.randrange(len(pool))])
      out.append(b)
      s = int(row[b])

  return sample


def _random_texts(spec, n, seed):
  rng = random.Random(seed)
  samplers = [_sampler(p) for _, p, _ in spec["terminals"]]
  texts = []
  for _ in range(n):
    parts = []
    for _ in range(rng.randrange(1, 25)):
      parts.append(samplers[rng.randrange(len(samplers))](rng))
      if rng.random() < 0.5:
        parts.append(b" ")
    text = b"".join(parts)
    if rng.random() < 0.2 and text:  # a random mutation: often unlexable
      i = rng.randrange(len(text))
      text = text[:i] + bytes([rng.randrange(32, 127)]) + text[i:]
    texts.append(text)
  return texts


# -- The reference lexer. ---------------------------------------------------------------


class _ReferenceLexer:
  """Longest match without backtracking, with `regex` (partial matches for growth)."""

  def __init__(self, spec, ignored):
    terms = spec["terminals"]
    order = sorted(range(len(terms)), key=lambda i: (terms[i][2] == lexer_tables.RE, i))
    self.terms = [(terms[i][0], regex.compile(terms[i][1]), terms[i][2] != lexer_tables.RE)
                  for i in order]
    self.beaten = set(spec["beaten_by_keywords"])
    self.ignored = set(ignored)

  def lex(self, data: bytes):
    try:
      text = data.decode("utf-8")
    except UnicodeDecodeError:
      return None
    out, pos = [], 0
    while pos < len(text):
      alive = self.terms
      end = pos
      while end < len(text):
        grow = [t for t in alive if t[1].fullmatch(text, pos, end + 1, partial=True)]
        if not grow:
          break
        alive, end = grow, end + 1
      if end == pos:
        return None
      full = [t for t in alive if t[1].fullmatch(text, pos, end)]
      if not full:
        return None  # would need backing up more than one character
      if any(lit for _, _, lit in full):
        full = [t for t in full if t[2] or t[0] not in self.beaten]
      if full[0][0] not in self.ignored:
        out.append(full[0][0])
      pos = end
    return out


def test_lexer_sizes_match_the_measured_prototype(terminal_set):
  name, spec, lexer = terminal_set
  # docs/lexer_runtime.md: 137 (SQL) and 642 (Python) states, one class per terminal.
  # Python's names take Unicode letters, so its count follows the interpreter's Unicode
  # database (measured: 642 with Unicode 14.0, Python 3.11; 653 with 15.1, Python 3.13).
  measured = {"14.0.0": 642, "15.1.0": 653}.get(unicodedata.unidata_version)
  if name == "sql":
    assert lexer.num_states == 137
  elif measured is not None:
    assert lexer.num_states == measured
  else:  # A Unicode version not measured: close to the measured sizes.
    assert 620 <= lexer.num_states <= 700, lexer.num_states
  assert len(lexer.classes) == len(spec["terminals"])
  assert lexer.state_class[lexer.start] == -1


def test_lex_matches_reference_longest_match(terminal_set):
  name, spec, lexer = terminal_set
  ref = _ReferenceLexer(spec, _IGNORED[name])
  texts = _random_texts(spec, 120, seed=len(name))
  none = 0
  for text in texts:
    got = _lexer.lex(lexer, text)
    assert got == ref.lex(text), text
    none += got is None
  assert 0 < none < len(texts) // 2


def test_lex_examples():
  spec = _spec("sql")
  terms = [_lexer.Terminal(n, p, literal=(k != lexer_tables.RE)) for n, p, k in spec["terminals"]]
  lexer = _lexer.build_lexer_dfa(terms, ignored=("WS",))
  assert _lexer.lex(lexer, b"SELECT a FROM t") == ["SELECT", "NAME", "FROM", "NAME"]
  assert _lexer.lex(lexer, b"SELECTa ORDER or") == ["NAME", "ORDER", "OR"]
  assert _lexer.lex(lexer, b"select *") == ["SELECT", "STAR"]
  star = _lexer.lex(lexer, b"*", classes=True)
  assert lexer.classes[star[0]] == ("STAR", "OPERATOR")  # resolved by the parser
  assert _lexer.lex(lexer, b"a  b", keep_ignored=True) == ["NAME", "WS", "NAME"]
  assert _lexer.lex(lexer, b"1e") is None  # NUMBER needs its exponent digits
  assert _lexer.lex(lexer, b"1e5") == ["NUMBER"]
  assert _lexer.lex(lexer, b"'open") is None
  assert _lexer.lex(lexer, b"") == []


def test_lexer_from_lark_grammar():
  grammar = _lr.read_lark_rules(r"""
      start: (NAME | "if" | "(" | ")" | NUMBER)*
      NAME: /[a-z_]\w*/
      NUMBER: /[0-9]+/
      COMMENT: /#[^\n]*/
      %import common.WS
      %ignore WS
      %ignore COMMENT
  """)
  terms, ignored = _lexer.terminals_from_grammar(grammar)
  lexer = _lexer.build_lexer_dfa(terms, ignored=ignored)
  assert _lexer.lex(lexer, b"if (iffy) 12 # done") == ["IF", "LPAR", "NAME", "RPAR", "NUMBER"]
  assert _lexer.lex(lexer, b"if(x)", keep_ignored=True) == ["IF", "LPAR", "NAME", "RPAR"]
  assert _lexer.lex(lexer, b"if # c", keep_ignored=True) == ["IF", "WS", "COMMENT"]


def test_priorities():
  hexa = _lexer.Terminal("HEX", r"[0-9a-f]+")
  dec = _lexer.Terminal("DEC", r"[0-9]+")
  word = _lexer.Terminal("WORD", r"[a-z]+")
  lexer = _lexer.build_lexer_dfa([hexa, dec, word], keyword_beats=())
  assert lexer.classes[_lexer.lex(lexer, b"12", classes=True)[0]] == ("HEX", "DEC")
  assert _lexer.lex(lexer, b"abc") == ["HEX"]
  lexer = _lexer.build_lexer_dfa([hexa, dec, dataclasses.replace(word, priority=1)])
  assert _lexer.lex(lexer, b"abc") == ["WORD"]  # explicit priority first
  assert _lexer.lex(lexer, b"abg") == ["WORD"]
  with pytest.raises(ValueError, match="empty string"):
    _lexer.build_lexer_dfa([_lexer.Terminal("E", r"a*")])


_PY_NUMBERS = {"DEC_NUMBER", "HEX_NUMBER", "OCT_NUMBER", "BIN_NUMBER", "FLOAT_NUMBER",
               "IMAG_NUMBER"}


def test_python_lines_match_tokenize():
  spec = _spec("python")
  terms = [_lexer.Terminal(n, p, literal=(k != lexer_tables.RE)) for n, p, k in spec["terminals"]]
  lexer = _lexer.build_lexer_dfa(terms, ignored=_IGNORED["python"])
  rng = random.Random(7)
  pool = (["x", "foo_1", "_y", "λx", "if", "else", "lambda", "None", "is", "not", "in", "match",
           "0", "42", "1_000", "0x1F", "0o17", "0b101", "3.14", "1e10", "2.5e-3", ".5", "7j",
           "1.5J", "'a'", '"b c"', "'it\\'s'", "r'\\d'", "b'x'", '"""doc"""', "'''x'''"]
          + ["(x)", "[1, 2]", "{a: b}", "f(y)[0]"]  # tokenize wants balanced brackets
          + [op for op in lexer_tables.PY_OPERATORS if op not in "()[]{}"])
  for _ in range(300):
    line = " ".join(rng.choice(pool) for _ in range(rng.randrange(1, 12)))
    expected = []
    for tok in tokenize.generate_tokens(io.StringIO(line).readline):
      if tok.type == tokenize.NAME:
        expected.append(tok.string.upper() if keyword.iskeyword(tok.string) else "NAME")
      elif tok.type == tokenize.NUMBER:
        expected.append("NUMBER")
      elif tok.type == tokenize.STRING:
        expected.append("STRING")
      elif tok.type == tokenize.OP:
        expected.append("OP" + tok.string)
    got = _lexer.lex(lexer, line.encode())
    got = ["NUMBER" if g in _PY_NUMBERS else "STRING" if g == "LONG_STRING" else g
           for g in got]
    assert got == expected, line


# -- The token table. --------------------------------------------------------------------


def _toy_vocab(texts, rng, size=400):
  """Every byte, plus random substrings of the texts (a BPE-like vocabulary)."""
  toks = {bytes([b]) for b in range(256)}
  while len(toks) < size:
    t = rng.choice(texts)
    if len(t) < 2:
      continue
    i = rng.randrange(len(t) - 1)
    toks.add(t[i:i + rng.randrange(2, 9)])
  token_bytes = sorted(toks) + [None]  # the last id is EOS
  return cd.Vocabulary.from_token_bytes(token_bytes, eos_ids=[len(token_bytes) - 1])


def _random_tokenization(text, by_bytes, rng):
  out, pos = [], 0
  while pos < len(text):
    options = [(n, i) for n in range(1, 9) if text[pos:pos + n] in by_bytes
               for i in [by_bytes[text[pos:pos + n]]]]
    n, i = rng.choice(options)
    out.append(i)
    pos += n
  return out


def test_token_table_agrees_with_lex(terminal_set):
  name, spec, lexer = terminal_set
  rng = random.Random(11)
  texts = _random_texts(spec, 150, seed=5)
  vocab = _toy_vocab(texts, rng)
  trie = _detokenizer.build_trie(vocab)
  table = _lexer.build_token_table(lexer, trie, vocab.vocab_size)
  dense = table.dense()
  by_bytes = {b: i for i, b in enumerate(vocab.token_bytes) if b is not None}
  assert (dense[:, vocab.vocab_size - 1] == -1).all()  # EOS has no bytes
  for text in texts:
    expected = _lexer.lex(lexer, text, classes=True)
    for _ in range(3):
      tokens = _random_tokenization(text, by_bytes, rng)
      items = _walk_table(lexer, table, lambda state, t: dense[state, t], tokens)
      assert items == expected, (text, items)


def _walk_table(lexer, table, entry, tokens):
  """The lexeme classes a token sequence completes through the token table (`entry(state,
  token)` is its class or -1), the last lexeme finished at the end; None if it dies."""
  state, items = lexer.start, []
  for t in tokens:
    k = entry(state, t)
    if k < 0:
      return None
    items.extend(table.sequence(int(k)))
    state = int(table.class_final[k])
  ok, last = lexer.finish(state)
  if not ok:
    return None
  return items + [last] if last >= 0 else items


def _step(lexer, state, data):
  """Reference walk of `data` from `state`: (classes emitted, final state) or None."""
  items = []
  for b in data:
    nxt = lexer.transitions[state, b]
    if nxt < 0:
      if lexer.state_class[state] < 0:
        return None
      if lexer.emitted[state] >= 0:
        items.append(int(lexer.emitted[state]))
      nxt = lexer.transitions[lexer.start, b]
      if nxt < 0:
        return None
    state = int(nxt)
  return tuple(items), state


def test_token_table_exhaustive_small():
  spec = _spec("sql")
  terms = [_lexer.Terminal(n, p, literal=(k != lexer_tables.RE)) for n, p, k in spec["terminals"]]
  lexer = _lexer.build_lexer_dfa(terms, ignored=("WS",))
  rng = random.Random(3)
  vocab = _toy_vocab(_random_texts(spec, 60, seed=9), rng, size=600)
  table = _lexer.build_token_table(lexer, _detokenizer.build_trie(vocab), vocab.vocab_size)
  dense = table.dense()
  for s in range(lexer.num_states):
    for t, data in enumerate(vocab.token_bytes):
      want = _step(lexer, s, data) if data is not None else None
      k = dense[s, t]
      got = None if k < 0 else (table.sequence(int(k)), int(table.class_final[k]))
      assert got == want, (s, data)
  # Classes of a state are distinct outcomes; token sets are deduplicated.
  for s in range(lexer.num_states):
    lo, hi = table.class_start[s], table.class_start[s + 1]
    keys = {(table.sequence(k), int(table.class_final[k])) for k in range(lo, hi)}
    assert len(keys) == hi - lo
  assert table.nbytes > 0


def test_token_table_cache(tmp_path):
  spec = _spec("sql")
  terms = [_lexer.Terminal(n, p, literal=(k != lexer_tables.RE)) for n, p, k in spec["terminals"]]
  lexer = _lexer.build_lexer_dfa(terms, ignored=("WS",))
  vocab = _toy_vocab([b"SELECT a FROM t WHERE b = 'x'"], random.Random(1), size=300)
  trie = _detokenizer.build_trie(vocab)
  a = _lexer.load_or_build_token_table(lexer, trie, str(tmp_path), vocab.vocab_size)
  assert len(os.listdir(tmp_path)) == 1
  b = _lexer.load_or_build_token_table(lexer, trie, str(tmp_path), vocab.vocab_size)
  for f in _lexer.TokenTable._FIELDS:
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
  assert b.vocab_size == a.vocab_size


def test_token_table_gemma_sql(gemma_vocab):
  """SQL terminals x Gemma 3 (262k tokens): random texts under random tokenizations."""
  spec = _spec("sql")
  terms = [_lexer.Terminal(n, p, literal=(k != lexer_tables.RE)) for n, p, k in spec["terminals"]]
  lexer = _lexer.build_lexer_dfa(terms, ignored=("WS",))
  trie = _detokenizer.build_trie(gemma_vocab)
  table = _lexer.build_token_table(lexer, trie, gemma_vocab.vocab_size)
  assert table.nbytes < 8 * 2**20  # docs/lexer_runtime.md: 2.4 MiB hybrid for SQL
  by_bytes = {b: i for i, b in enumerate(gemma_vocab.token_bytes) if b}
  rows = {}
  rng = random.Random(2)
  for text in _random_texts(spec, 40, seed=4):
    expected = _lexer.lex(lexer, text, classes=True)
    def entry(state, t):
      if state not in rows:
        rows[state] = table.row(state)
      return rows[state][t]

    items = _walk_table(lexer, table, entry, _random_tokenization(text, by_bytes, rng))
    assert items == expected, text
