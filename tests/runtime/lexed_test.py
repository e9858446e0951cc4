"""Device step of grammars with a lexer (`runtime/_lexed.py`, issue 18 increment 3).

Oracles: Lark's own LALR parser with its basic lexer (`lexer="basic"`: one lexer for
every parser state, keywords beating NAME as ours do; Lark's default contextual lexer
would also read a keyword as a NAME where no keyword fits), and the host reference
`LexedReference` (byte walk through the lexer DFA + `_lr.LrParser`, no token table).
Vocabularies: every byte plus random substrings of texts of the grammar (BPE-like),
sizes derived from the fixture.
"""

import random

import jax
import jax.numpy as jnp
import lark
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.constraints import _lexed_grammar
from constrained_decoding.constraints import _lr
from constrained_decoding.runtime import _lexed
from constrained_decoding.testing import random_derivation

SQL = r"""
start: "SELECT" columns "FROM" NAME where? ";"?
columns: "*" | NAME ("," NAME)*
where: "WHERE" cond
cond: cond "OR" conj | conj
conj: conj "AND" cmp | cmp
cmp: expr COMPARE expr | "(" cond ")" | "NOT" cmp
expr: expr ("+" | "-") term | term
term: NAME | NUMBER | STRING
COMPARE: /<>|!=|<=|>=|=|<|>/
NAME: /[A-Za-z_][A-Za-z0-9_]*/
NUMBER: /[0-9]+/
STRING: /'[^']*'/
%import common.WS
%ignore WS
"""

ARITH = r"""
start: expr
?expr: expr ("+" | "-") term | term
?term: term ("*" | "/") factor | factor
?factor: "-" factor | power
?power: atom "^" factor | atom
?atom: NUMBER | NAME | "(" expr ")" | NAME "(" [expr ("," expr)*] ")"
NUMBER: /[0-9]+/
NAME: /[a-z]+/
%ignore " "
"""

# How a random derivation renders a terminal (others: their literal), and the texts
# between lexemes: none sometimes merges two (`aFROM`), a text the oracle then refuses.
_RENDER = {
    "sql": {
        "NAME": ["a", "b", "tab", "x1", "SELECTED", "FROMt", "OR_", "f"],
        "NUMBER": ["1", "42", "007"],
        "STRING": ["'hi'", "''", "'a b'"],
        "COMPARE": ["=", "<>", "<=", ">", "!="],
    },
    "arith": {"NAME": ["a", "b", "tab", "f"], "NUMBER": ["1", "42", "007"]},
}
_SEPARATORS = {"sql": ["", " ", " ", " ", "  ", "\n"], "arith": ["", " ", " ", "  "]}


def _render(name, grammar, terminals, rng) -> bytes:
  literals = {d.name: d.literal for d in grammar.terminal_defs}
  render = _RENDER[name]
  parts = [rng.choice(render[t]) if t in render else literals[t] for t in terminals]
  seps = [rng.choice(_SEPARATORS[name]) for _ in parts]
  return "".join(p + s for p, s in zip(parts, seps)).encode()


def _mutate(text: bytes, rng) -> bytes:
  i = rng.randrange(len(text) + 1)
  kind = rng.randrange(3)
  if kind == 0 and text:
    return text[:i] + text[i + 1:]
  if kind == 1:
    return text[:i] + rng.choice([b"(", b",", b"a", b"1", b" ", b"'", b"OR", b"+"]) + text[i:]
  j = rng.randrange(len(text) + 1)
  i, j = min(i, j), max(i, j)
  return text[:i] + text[j:] + text[i:j]


class _Setup:
  """Compiled tables, jitted step functions and the oracles of one grammar."""

  def __init__(self, name: str, seed: int, vocab_size: int = 400):
    rng = random.Random(seed)
    source = {"sql": SQL, "arith": ARITH}[name]
    self.source = source
    self.grammar = _lr.read_lark_rules(source)
    self.texts = [_render(name, self.grammar, random_derivation(self.grammar, rng, depth=5), rng)
                  for _ in range(60)]
    toks = {bytes([b]) for b in range(256)}
    while len(toks) < vocab_size - 1:
      t = rng.choice(self.texts)
      if len(t) > 2:
        i = rng.randrange(len(t) - 1)
        toks.add(t[i:i + rng.randrange(2, 8)])
    token_bytes = sorted(toks) + [None]  # the last id is end of sequence
    self.eos = len(token_bytes) - 1
    self.vocab = cd.Vocabulary.from_token_bytes(token_bytes, eos_ids=[self.eos])
    self.by_bytes = {b: i for i, b in enumerate(token_bytes) if b is not None}
    self.arrays = _lexed_grammar.compile_lexed_grammar(source, self.vocab, stack_depth=48)
    self.tables = _lexed.tables_from_arrays(self.arrays)
    self.allowed = jax.jit(_lexed.allowed_tokens)
    self.advance = jax.jit(_lexed.advance)
    self.oracle = lark.Lark(source, parser="lalr", lexer="basic")
    self.reference = _lexed_grammar.LexedReference(self.arrays)

  def lark_accepts(self, text: bytes) -> bool:
    try:
      self.oracle.parse(text.decode("utf-8"))
      return True
    except (lark.exceptions.LarkError, UnicodeDecodeError):
      return False

  def tokenize(self, text: bytes, rng) -> list[int]:
    out, pos = [], 0
    while pos < len(text):
      n = rng.choice([n for n in range(1, 9) if text[pos:pos + n] in self.by_bytes])
      out.append(self.by_bytes[text[pos:pos + n]])
      pos += n
    return out


_SETUPS = {}
_BATCH = 8  # One batch size for the tests that share jitted functions: one compile.


def _get(name: str) -> _Setup:
  if name not in _SETUPS:
    _SETUPS[name] = _Setup(name, seed=len(name))
  return _SETUPS[name]


@pytest.fixture
def setup():
  # (The arithmetic grammar's walks, reference and Lark checks repeated the SQL ones;
  # lexemes without separators are covered by `lexed_python_test.py`. ARITH stays in
  # the stacking test.)
  return _get("sql")


def _walk(setup, batch, steps, seed, check_reference=0):
  """Random walks over allowed tokens, `batch` rows in lockstep: finished texts."""
  rng = np.random.default_rng(seed)
  state = _lexed.init_state(setup.tables, batch)
  rows = [setup.reference.start() for _ in range(check_reference)]
  texts = [b""] * batch
  finished = []
  for step in range(steps):
    allowed = np.asarray(setup.allowed(setup.tables, state))
    done = np.asarray(state.done)
    assert not np.asarray(state.error).any()
    for r in range(min(check_reference, batch)):
      if not done[r]:
        want = setup.reference.allowed(rows[r])
        np.testing.assert_array_equal(allowed[r], want, err_msg=repr(texts[r]))
    tokens = np.zeros(batch, np.int32)
    for r in range(batch):
      if done[r]:
        tokens[r] = setup.eos
        continue
      ids = np.nonzero(allowed[r])[0]
      assert len(ids), f"dead end after {texts[r]!r}"
      if allowed[r, setup.eos] and (rng.random() < 0.4 or step == steps - 1):
        tokens[r] = setup.eos
        finished.append(texts[r])
      else:
        tokens[r] = rng.choice(ids[ids != setup.eos]) if (ids != setup.eos).any() else setup.eos
        if tokens[r] != setup.eos:
          texts[r] += setup.vocab.token_bytes[tokens[r]]
        else:
          finished.append(texts[r])
      if r < check_reference:
        rows[r] = setup.reference.advance(rows[r], int(tokens[r]))
        assert rows[r] is not None
        if rows[r] == "done":
          rows[r] = setup.reference.start()  # no longer compared (row is done)
    state = setup.advance(setup.tables, state, jnp.asarray(tokens))
  assert not np.asarray(state.error).any()
  return finished


def test_random_walks_never_fail_and_finished_texts_parse(setup):
  finished = _walk(setup, batch=_BATCH, steps=30, seed=1)
  assert len(finished) >= _BATCH // 2
  for text in finished:
    assert setup.lark_accepts(text), text


def test_device_agrees_with_host_reference(setup):
  _walk(setup, batch=_BATCH, steps=20, seed=2, check_reference=3)


def test_texts_accepted_exactly_when_lark_parses_them(setup):
  rng = random.Random(3)
  texts = list(setup.texts[:40])
  texts += [_mutate(t, rng) for t in setup.texts[:40]]
  verdicts = [setup.lark_accepts(t) for t in texts]
  assert 12 <= sum(verdicts) <= len(texts) - 12  # both kinds, many of each
  tokenized = [setup.tokenize(t, rng) + [setup.eos] for t in texts]
  width = max(map(len, tokenized))
  tokens = np.array([t + [setup.eos] * (width - len(t)) for t in tokenized], np.int32)
  state = _lexed.init_state(setup.tables, len(texts))
  offered = np.ones(len(texts), bool)
  for j in range(width):
    allowed = np.asarray(setup.allowed(setup.tables, state))
    live = ~np.asarray(state.done | state.error)
    offered &= ~live | allowed[np.arange(len(texts)), tokens[:, j]]
    state = setup.advance(setup.tables, state, jnp.asarray(tokens[:, j]))
    # `advance` takes a token exactly when the mask offers it.
    np.testing.assert_array_equal(np.asarray(state.error), ~offered)
  accepted = np.asarray(state.done & ~state.error)
  for text, want, got in zip(texts, verdicts, accepted):
    assert got == want, text


def test_stopped_rows_and_bad_tokens(setup):
  state = _lexed.init_state(setup.tables, _BATCH)
  allowed = np.asarray(setup.allowed(setup.tables, state))
  refused = int(np.nonzero(~allowed[0])[0][0])
  assert not allowed[0, setup.eos]  # the empty text is no sentence of these grammars
  bad = [refused, setup.eos, setup.vocab.vocab_size + 5, -1]
  state = setup.advance(setup.tables, state, jnp.array(bad * (_BATCH // 4)))
  assert np.asarray(state.error).all()
  allowed = np.asarray(setup.allowed(setup.tables, state))
  assert allowed.sum() == _BATCH and allowed[:, setup.eos].all()  # end of sequence only
  again = setup.advance(setup.tables, state, jnp.array([0] * _BATCH))
  np.testing.assert_array_equal(np.asarray(again.state), np.asarray(state.state))


def test_eager_and_jitted_agree():
  # `advance` only: eagerly, every primitive of `allowed_tokens` compiles on its own
  # (~10 s here); `advance` runs the same lanes.
  setup = _get("sql")
  byte = lambda c: setup.by_bytes[c.encode()]
  state = _lexed.init_state(setup.tables, _BATCH)
  for c in "SELECT":
    state = setup.advance(setup.tables, state, jnp.full(_BATCH, byte(c), jnp.int32))
  # Row 0 reads " " (ends SELECT, shifted) then "a"; row 1 ends (refused); the others
  # read "," (refused).
  for tokens in ([byte(" "), setup.eos] + [byte(",")] * (_BATCH - 2),
                 [byte("a")] * _BATCH):
    with jax.disable_jit():
      eager = _lexed.advance(setup.tables, state, jnp.asarray(tokens))
    state = setup.advance(setup.tables, state, jnp.asarray(tokens))
    for field in ("state", "stack", "depth", "done", "error", "registers"):
      np.testing.assert_array_equal(np.asarray(getattr(eager, field)),
                                    np.asarray(getattr(state, field)))
  assert np.asarray(state.error).tolist() == [False] + [True] * (_BATCH - 1)
  assert int(state.depth[0]) == 2  # SELECT shifted; "a" pending
  assert np.asarray(state.state)[0] != setup.arrays.lex_start[0]


def test_keywords_beat_names_only_as_whole_lexemes():
  s = _get("sql")
  cases = [(b"SELECT SELECTED FROM FROMt", True), (b"SELECT a FROMt", False),
           (b"SELECT FROM FROM t", False), (b"SELECTa FROM t", False),
           (b"SELECT a,b FROM t WHERE NOT(a=1)OR b<>2", True)]
  rng = random.Random(1)
  tokens = [s.tokenize(text, rng) for text, _ in cases]
  width = max(map(len, tokens)) + 1
  tokens = np.array([t + [s.eos] * (width - len(t)) for t in tokens]
                    + [[s.eos] * width] * (_BATCH - len(cases)), np.int32)
  state = _lexed.init_state(s.tables, _BATCH)
  for j in range(width):
    state = s.advance(s.tables, state, jnp.asarray(tokens[:, j]))
  for r, (text, ok) in enumerate(cases):
    assert bool(state.done[r] & ~state.error[r]) == ok == s.lark_accepts(text), text


def _byte_vocab():
  return cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                        eos_ids=[256])


def test_compile_errors():
  vocab = _byte_vocab()
  with pytest.raises(errors.UnsupportedGrammarFeatureError, match=r"\['INDENT'\].*%declare"):
    _lexed_grammar.compile_lexed_grammar(
        'start: "a" INDENT\n%declare INDENT\n', vocab)
  with pytest.raises(errors.NondeterministicGrammarError, match="not LR"):
    _lexed_grammar.compile_lexed_grammar(
        'start: s\ns: "i" s | "i" s "e" s | "x"\n', vocab)
  with pytest.raises(errors.NondeterministicGrammarError, match=r"\['A', 'B'\].*state"):
    _lexed_grammar.compile_lexed_grammar(
        'start: A | B\nA: /[a-c]/\nB: /[b-d]/\n', vocab)
  with pytest.raises(errors.ConstraintError, match="stack_depth 1 is not an int >= 2"):
    _lexed_grammar.compile_lexed_grammar('start: "a"\n', vocab, stack_depth=1)


def test_argument_errors():
  setup = _get("sql")
  with pytest.raises(errors.DecodingArgumentError, match="batch_size 0 is not a positive"):
    _lexed.init_state(setup.tables, 0)
  state = _lexed.init_state(setup.tables, 2)
  with pytest.raises(errors.DecodingArgumentError, match=r"tokens\[1\] = 9999 is out of"):
    _lexed.advance(setup.tables, state, np.array([0, 9999]))
  with pytest.raises(errors.DecodingArgumentError, match="Expected shape"):
    _lexed.advance(setup.tables, state, np.array([0]))
  with pytest.raises(errors.DecodingArgumentError, match="Expected an integer dtype"):
    _lexed.advance(setup.tables, state, np.array([0.0, 1.0]))
  narrow = state.replace(stack=state.stack[:, :4])
  with pytest.raises(errors.DecodingArgumentError, match="stack of 48"):
    _lexed.allowed_bits(setup.tables, narrow)


def test_one_trace_for_every_state():
  # Every state goes through the same two compiled step functions (one batch size).
  setup = _get("sql")
  state = _lexed.init_state(setup.tables, _BATCH)
  setup.advance(setup.tables, state, jnp.full(_BATCH, setup.eos, jnp.int32))
  setup.allowed(setup.tables, state)
  compiled = setup.allowed._cache_size(), setup.advance._cache_size()
  for text in (b"SELECT a", b"SELECT *"):
    for t in text:
      setup.allowed(setup.tables, state)
      state = setup.advance(setup.tables, state, jnp.full(_BATCH, t, jnp.int32))
  assert (setup.allowed._cache_size(), setup.advance._cache_size()) == compiled


# -- SQL with the Gemma 3 vocabulary. ---------------------------------------------------

_SQL_QUERIES = [
    b"SELECT name, count(*) AS n FROM users AS u LEFT JOIN orders AS o ON u.id = o.uid"
    b" WHERE u.age >= 18 AND NOT (o.total IS NULL) GROUP BY name ORDER BY n DESC LIMIT 10;",
    b"select distinct a.b, 'it''s', 1.5e3 * price from t where x <> 'y' or z is not null",
    b"SELECT * FROM items AS i INNER JOIN tags AS g ON i.id = g.item_id ORDER BY i.id ASC",
    b"SELECT selected FROM fromage WHERE notable = 1",
]
_SQL_REFUSED = [b"SELECT a FROM", b"SELECT a b FROM t", b"SELECT a FROM t WHERE",
                b"SELECT a FROM t ORDER a", b"SELECT a FROM t LIMIT 1.5", b"SELECT a FROM t;;"]
# (Not `SELECTa FROM t`: Lark's contextual lexer, knowing only SELECT at the start,
# splits it; ours reads one NAME, as Lark's basic lexer does: `_Setup("sql")` checks it.)


def _gemma_tokenize(text: bytes, by_bytes, rng) -> list[int]:
  out, pos = [], 0
  while pos < len(text):
    n = rng.choice([n for n in range(1, 17) if text[pos:pos + n] in by_bytes])
    out.append(by_bytes[text[pos:pos + n]])
    pos += n
  return out


def test_sql_with_gemma_vocabulary(gemma_vocab):
  path = _lr.__file__.replace("_lr.py", "grammars/sql_select_lexed.lark")
  source = open(path, encoding="utf-8").read()
  arrays = _lexed_grammar.compile_lexed_grammar(source, gemma_vocab)
  # 25.6 MiB measured: 5.7 before the reserved SQLite words became keywords (each one
  # splits the lexer states of NAME; see the grammar).
  assert arrays.nbytes["total"] < 32 * 2**20
  tables = _lexed.tables_from_arrays(arrays)
  allowed_fn, advance_fn = jax.jit(_lexed.allowed_tokens), jax.jit(_lexed.advance)
  oracle = lark.Lark(source, parser="lalr")  # contextual lexer: accepts a superset
  eos = gemma_vocab.eos_ids[0]
  by_bytes = {b: i for i, b in enumerate(gemma_vocab.token_bytes) if b}
  rng = random.Random(5)

  # Queries under random tokenizations: accepted exactly when they parse (those here
  # lex the same under Lark's contextual lexer and ours).
  texts = _SQL_QUERIES + _SQL_REFUSED
  for text in texts:
    try:
      oracle.parse(text.decode())
      assert text in _SQL_QUERIES, text
    except lark.exceptions.LarkError:
      assert text in _SQL_REFUSED, text
  rows = [_gemma_tokenize(t, by_bytes, rng) + [eos] for t in texts]
  rows += [[eos]] * (-len(rows) % _BATCH)
  width = max(map(len, rows))
  tokens = np.array([r + [eos] * (width - len(r)) for r in rows], np.int32)
  accepted = []
  for part in np.split(tokens, len(rows) // _BATCH):  # _BATCH rows: the walks' one trace
    state = _lexed.init_state(tables, _BATCH)
    for j in range(width):
      state = advance_fn(tables, state, jnp.asarray(part[:, j]))
    accepted += np.asarray(state.done & ~state.error).tolist()
  assert accepted[:len(texts)] == [t in _SQL_QUERIES for t in texts]

  # Random walks, half of the picks among the queries' tokens (so that some finish):
  # no error, no dead end, finished texts parse; the mask agrees with the reference
  # on a sample of tokens.
  reference = _lexed_grammar.LexedReference(arrays)
  favoured = np.array(sorted({t for q in _SQL_QUERIES for t in _gemma_tokenize(
      q, by_bytes, rng)}), np.int32)
  np_rng = np.random.default_rng(0)
  state = _lexed.init_state(tables, _BATCH)
  ref_row, walked, finished = reference.start(), [b""] * _BATCH, []
  for step in range(40):
    allowed = np.asarray(allowed_fn(tables, state))
    done = np.asarray(state.done)
    if step % 10 == 3 and not done[0]:
      sample = np.concatenate([np_rng.choice(gemma_vocab.vocab_size, 1500, replace=False),
                               np_rng.choice(np.nonzero(allowed[0])[0], 300), [eos]])
      for t in sample.tolist():
        want = reference.advance(ref_row, t) is not None
        assert allowed[0, t] == want, (walked[0], gemma_vocab.token_bytes[t])
    picks = np.full(_BATCH, eos, np.int32)
    for r in range(_BATCH):
      if done[r]:
        continue
      ids = np.nonzero(allowed[r])[0]
      assert len(ids), walked[r]
      if allowed[r, eos] and np_rng.random() < 0.5:
        finished.append(walked[r])
        continue
      good = favoured[allowed[r, favoured]]
      pool = good if len(good) and np_rng.random() < 0.85 else ids[ids != eos]
      picks[r] = np_rng.choice(pool)
      walked[r] += gemma_vocab.token_bytes[picks[r]]
    if not done[0]:
      ref_row = reference.advance(ref_row, int(picks[0]))
    state = advance_fn(tables, state, jnp.asarray(picks))
    assert not np.asarray(state.error).any()
  assert len(finished) >= 3
  for text in finished:
    oracle.parse(text.decode("utf-8"))


def test_long_chains_of_empty_rules_are_exact():
  # Before "z" the parser reduces 20 empty rules in a row, each a push of the lane's
  # own (lanes keep up to D of them: a fixed short suffix would overflow here).
  letters = "abcdefghijklmnopqrst"
  source = ("start: " + " ".join(f"e{k}" for k in range(20)) + ' "z"\n'
            + "".join(f'e{k}: "{c}"?\n' for k, c in enumerate(letters)) + '%ignore " "\n')
  vocab = _byte_vocab()
  arrays = _lexed_grammar.compile_lexed_grammar(source, vocab, stack_depth=32)
  assert arrays.seq_items.shape[1] == 1
  tables = _lexed.tables_from_arrays(arrays)
  reference = _lexed_grammar.LexedReference(arrays)
  allowed_fn, advance_fn = jax.jit(_lexed.allowed_tokens), jax.jit(_lexed.advance)
  texts = [b"z", b"acz", b"t z", b"abcdefghijklmnopqrstz", b"baz", b"zz", b"a"]
  state = _lexed.init_state(tables, len(texts) + 1)
  rows = [reference.start() for _ in texts]
  for j in range(max(map(len, texts)) + 1):
    allowed = np.asarray(allowed_fn(tables, state))
    tokens = []
    for r, text in enumerate(texts):
      if rows[r] not in (None, "done"):
        np.testing.assert_array_equal(allowed[r], reference.allowed(rows[r]))
      tokens.append(text[j] if j < len(text) else 256)
      if rows[r] not in (None, "done"):
        rows[r] = reference.advance(rows[r], tokens[-1])
    state = advance_fn(tables, state, jnp.asarray(tokens + [256], jnp.int32))
  accepted = np.asarray(state.done & ~state.error)[:len(texts)].tolist()
  assert accepted == [True, True, True, True, False, False, False]


def test_stacked_grammars_equal_the_individual_ones():
  sql = _get("sql")
  arith = _lexed_grammar.compile_lexed_grammar(ARITH, sql.vocab, stack_depth=32)
  parts = [sql.arrays, arith]
  stacked = _lexed.tables_from_arrays(_lexed_grammar.stack_lexed_arrays(parts))
  single = [sql.tables, _lexed.tables_from_arrays(arith)]
  ids = np.array([0, 1] * (_BATCH // 2), np.int32)
  state = _lexed.init_state(stacked, constraint_ids=ids)
  alone = [_lexed.init_state(t, _BATCH) for t in single]
  rng = np.random.default_rng(4)
  for _ in range(25):
    allowed = np.asarray(sql.allowed(stacked, state))
    expected = [np.asarray(sql.allowed(t, s)) for t, s in zip(single, alone)]
    for r, g in enumerate(ids):
      np.testing.assert_array_equal(allowed[r], expected[g][r])
    tokens = np.array([rng.choice(np.nonzero(row)[0]) for row in allowed], np.int32)
    state = sql.advance(stacked, state, jnp.asarray(tokens))
    alone = [sql.advance(t, s, jnp.asarray(tokens)) for t, s in zip(single, alone)]
    assert not np.asarray(state.error).any()
  with pytest.raises(errors.VocabularyMismatchError, match="tables 1 were compiled for another vocabulary"):
    _lexed_grammar.stack_lexed_arrays([sql.arrays, _get("arith").arrays])
