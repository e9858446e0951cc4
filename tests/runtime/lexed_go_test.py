"""Go with automatic semicolons on the two-level runtime (issue 18, `grammars/go.lark`).

Oracle: `gofmt -e` (go/parser). It ran when the data were written: every file of
`tests/data/go/` is accepted by it, every text of `BROKEN` refused, and
`tests/data/go/mutations.json` holds its verdict on 240 mutated functions. The random
walks' finished texts are checked by it here when `gofmt` is on PATH (that test is
skipped otherwise). Vocabulary: every byte plus substrings of the data files (tokens
that cross lexeme, line and comment boundaries, as BPE tokens do). One compiled table
set and one batch size for the whole module (one jit compile).
"""

import glob
import json
import os
import random
import re
import shutil
import subprocess

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.constraints import _lexed_grammar
from constrained_decoding.constraints import _lr
from constrained_decoding import testing as cd_testing
from constrained_decoding.runtime import _lexed

_PATH = _lr.__file__.replace("_lr.py", "grammars/go.lark")
_DATA = os.path.join(os.path.dirname(__file__), "..", "data", "go")
_BATCH = 16
_FILES = sorted(glob.glob(os.path.join(_DATA, "*.go")))

# Texts gofmt refuses (checked with `gofmt -e` when written); "@" marks the byte where
# the tables must refuse the text, "$" that only the end of sequence is refused.
BROKEN = [
    "func f() { if x == T{1} @{} }\n",          # composite literal of a type name in a header
    "func f() { if v := T@{1}; v.a {} }\n",
    "func f() { a.b @:= 1 }\n",                 # := takes identifiers
    "func f() { x := 1 +\n@}\n",
    "func f() { go x @}\n",                     # go / defer take a call
    "func f() { defer (f()) @}\n",
    "func f(a int, b@) {}\n",                   # mixed named and unnamed parameters
    "func f() (a int, string@) {}\n",
    "func f() { a[1:2:@] }\n",                  # 3-index slices need both bounds
    "func f[@]() {}\n",
    "func f() { x := 'a@b' }\n",                # one character in a rune
    "func f() { x := \"\\@'\" }\n",             # escapes: \' only in runes, \" only in strings
    "func f() { x := '\\@\"' }\n",
    "func f() { x := \"\\uD@800\" }\n",         # a surrogate
    "func f() { x := 1_@_0 }\n",
    "func f() { x := 0x@ }\n",
    "func f() { x := 1e@ }\n",
    "func f() {\n\tif x {\n\t}\n\telse@ {\n\t}\n}\n",     # the newline before else is a ;
    "func f() {\n\tg(a@\n\t)\n}\n",             # ... and before ) after an operand
    "func f() { x := []int{\n\t1,\n\t2@\n} }\n",
    "func f() { return 1 @2 }\n",
    "func f() { var x int = @}\n",
    "func f() { for i := 0; i < 3; i++@; {} }\n",
    "func f() { x := interface{}@{} }\n",
    "func f() { x++ @++ }\n",
    "func f() { import@ \"fmt\" }\n",
    "var x = 1;@;\n",
    "func f() { case@ 1: }\n",
    "func f() { x := struct{a int}{1 }\n$",    # unclosed
    "const a@\n",                               # a constant needs a value
    "func f() { x := \"abc@\n\" }\n",           # a line break in a string
    "type T struct{ a, b @}\n",
    "func f() { for x := range y@, z {} }\n",
    "func f() { for a, b, c := range@ xs {} }\n",   # a range clause takes at most two
    "func f() { for a, b.c, d = range@ xs {} }\n",
    "func f() {\n\tswitch x {\n\tcase 1:\n\t\tn++ @default:\n\t}\n}\n",
]


def _functions() -> list[str]:
  """The data files' functions, each as a file of its own."""
  out = []
  for path in _FILES:
    src = open(path, encoding="utf-8").read()
    out += ["package p\n\n" + m.group(0)
            for m in re.finditer(r"^func .*?^}\n|^func .*\}\n", src, re.M | re.S)]
  return out


class _Setup:
  """The vocabulary, tables, jitted step functions and reference, built once."""

  def __init__(self):
    rng = random.Random(0)
    self.sources = [open(p, "rb").read() for p in _FILES]
    toks = {bytes([b]) for b in range(256)}
    while len(toks) < 1200:
      t = rng.choice(self.sources)
      i = rng.randrange(len(t) - 1)
      toks.add(t[i:i + rng.randrange(2, 12)])
    token_bytes = sorted(toks) + [None]
    self.eos = len(token_bytes) - 1
    self.vocab = cd.Vocabulary.from_token_bytes(token_bytes, eos_ids=[self.eos])
    self.by_bytes = {b: i for i, b in enumerate(token_bytes) if b is not None}
    self.arrays = _lexed_grammar.compile_lexed_grammar(
        open(_PATH, encoding="utf-8").read(), self.vocab, start="source_file",
        stack_depth=96, semicolons=_lexed_grammar.Semicolons())
    self.tables = _lexed.tables_from_arrays(self.arrays)
    self.allowed = jax.jit(_lexed.allowed_tokens)
    self.advance = jax.jit(_lexed.advance)
    self.reference = _lexed_grammar.LexedReference(self.arrays)

  def tokenize(self, text: bytes, rng) -> list[int]:
    out, pos = [], 0
    while pos < len(text):
      n = rng.choice([n for n in range(1, 12) if text[pos:pos + n] in self.by_bytes])
      out.append(self.by_bytes[text[pos:pos + n]])
      pos += n
    return out

  def ref_accepts(self, text: bytes, cuts=()) -> bool:
    row, pos = self.reference.start(), 0
    for cut in sorted(cuts) + [len(text)]:
      if row is None:
        return False
      if cut > pos:
        row = self.reference.step(row, text[pos:cut])
        pos = cut
    return row is not None and self.reference.end_ok(row)

  def run(self, rows: list[list[int]], check_mask: bool = False):
    """(accepted [R], index of the first refused token or -1 [R]) of token rows, then end
    of sequence, _BATCH at a time; with `check_mask`, also checks that `advance` refuses a
    token exactly when the mask does not offer it."""
    return cd_testing.run_lexed_rows(self.tables, rows, self.eos, _BATCH, self.advance,
                                     self.allowed if check_mask else None)


@pytest.fixture(scope="module")
def setup():
  return _Setup()


def test_data_files_are_accepted_under_random_tokenizations(setup):
  rng = random.Random(1)
  assert len(_FILES) >= 5 and len(_functions()) >= 40
  # The whole files on the device, two tokenizations each.
  rows = [setup.tokenize(src, rng) for src in setup.sources for _ in range(2)]
  accepted, first_bad = setup.run(rows)
  assert all(accepted), [(p, b) for p, ok, b in zip(_FILES * 2, accepted, first_bad) if not ok]
  # Every function alone on the host reference, cut at random bytes.
  for text in _functions():
    data = text.encode()
    assert setup.ref_accepts(data, rng.sample(range(len(data)), min(30, len(data)))), text


def test_syntax_errors_are_refused_at_the_right_byte(setup):
  rows, where = [], []
  for marked in BROKEN:
    text = ("package p\n" + marked).replace("@", "").replace("$", "")
    rows.append([setup.by_bytes[bytes([b])] for b in text.encode()])  # a byte a token
    marked = "package p\n" + marked
    where.append(marked.index("@") if "@" in marked else len(text))
  accepted, first_bad = setup.run(rows, check_mask=True)
  wrong = [(marked, bad, want) for marked, ok, bad, want
           in zip(BROKEN, accepted, first_bad, where) if ok or bad != want]
  assert not wrong


def test_mutated_functions_get_gofmts_verdict(setup):
  data = json.load(open(os.path.join(_DATA, "mutations.json"), encoding="utf-8"))
  cases = data["cases"]
  assert 40 <= sum(c["gofmt"] for c in cases) <= len(cases) - 40  # both kinds
  wrong = [c["text"] for c in cases if setup.ref_accepts(c["text"].encode()) != c["gofmt"]]
  assert not wrong
  # A sample on the device, under random tokenizations.
  rng = random.Random(2)
  sample = rng.sample(cases, _BATCH)
  accepted, _ = setup.run([setup.tokenize(c["text"].encode(), rng) for c in sample])
  assert accepted == [c["gofmt"] for c in sample]


def _walk(setup, steps, seed, check_reference=0):
  """Random walks over allowed tokens from a function header, favouring the data
  files' tokens, then tokens that close lines, brackets and blocks: the finished texts."""
  rng = np.random.default_rng(seed)
  prefix = b"package p\n\nfunc f(x int, s []string) int {\n\t"
  closers = np.array([setup.by_bytes[b] for b in (b")", b"]", b"}", b"\n", b"0", b"x",
                                                  b" ", b"\"", b"'", b"`", b"*/", b";")
                      if b in setup.by_bytes])
  state = _lexed.init_state(setup.tables, _BATCH)
  for b in prefix:
    state = setup.advance(setup.tables, state,
                          jnp.full(_BATCH, setup.by_bytes[bytes([b])], jnp.int32))
  rows = [setup.reference.step(setup.reference.start(), prefix)
          for _ in range(check_reference)]
  texts = [prefix] * _BATCH
  finished = []
  for step in range(steps):
    allowed = np.asarray(setup.allowed(setup.tables, state))
    done = np.asarray(state.done)
    for r in range(check_reference):
      if not done[r]:
        np.testing.assert_array_equal(allowed[r], setup.reference.allowed(rows[r]),
                                      err_msg=repr(texts[r]))
    tokens = np.full(_BATCH, setup.eos, np.int32)
    for r in range(_BATCH):
      if done[r]:
        continue
      ids = np.nonzero(allowed[r])[0]
      assert len(ids), f"dead end after {texts[r]!r}"
      late = step > steps // 2
      if allowed[r, setup.eos] and rng.random() < (0.7 if late else 0.05):
        finished.append(texts[r])
        continue
      good = closers[allowed[r, closers]]
      pool = good if late and len(good) and rng.random() < 0.85 else ids[ids != setup.eos]
      if len(pool):
        tokens[r] = rng.choice(pool)
        texts[r] += setup.vocab.token_bytes[tokens[r]]
      if r < check_reference:
        rows[r] = setup.reference.advance(rows[r], int(tokens[r]))
        assert rows[r] is not None, texts[r]
    state = setup.advance(setup.tables, state, jnp.asarray(tokens))
    assert not np.asarray(state.error).any()
  return finished


def _gofmt_accepts(text: bytes) -> bool:
  return subprocess.run(["gofmt", "-e"], input=text, capture_output=True,
                        timeout=60).returncode == 0


@pytest.mark.skipif(shutil.which("gofmt") is None, reason="gofmt is not on PATH")
def test_random_walks_never_dead_end_and_gofmt_accepts_finished_texts(setup):
  finished = []
  for seed in range(2):
    finished += _walk(setup, steps=90, seed=seed)
  assert len(finished) >= 8
  refused = [t for t in finished if not _gofmt_accepts(t)]
  assert not refused


_SAMPLE_LEXEMES = {"NAME": ("a", "x", "T", "fmt", "_"), "INT": ("1", "0x1F", "0o7", "1_000"),
                   "FLOAT": ("1.5", ".5", "1e3", "0x1p-2"), "IMAG": ("2i",), "RUNE": ("'a'",),
                   "STRING": ('"s"',), "RAW_STRING": ("`r`",), "IMPORT_PATH": ('"fmt"',)}


def _parser_walk(lr, defs, rng, max_len=400):
  """A random walk of the LR tables over terminals (closers favoured after 60), each
  rendered as a sample lexeme, joined by spaces (`;` written out): the text, or None
  if it did not end within `max_len` terminals."""
  parser = _lr.LrParser(lr, (0,))
  closers = {"RPAR", "RSQB", "RBRACE", "SEMICOLON", "NAME", "INT"}
  out = []
  for step in range(max_len):
    if parser.accepts_end() and (step > 40 or rng.random() < 0.1):
      return " ".join(out)
    # Canonical LR(1): a terminal can come next iff the top state has an action for it.
    ok = [int(t) for t in np.nonzero(lr.action[parser.stack[-1], 1:])[0] + 1]
    pool = ok
    if step > 60 and rng.random() < 0.9:
      pool = [t for t in ok if lr.terminals[t] in closers] or ok
    t = rng.choice(pool)
    assert parser.feed(t)
    name = lr.terminals[t]
    out.append(defs[name].literal if defs[name].literal is not None
               else rng.choice(_SAMPLE_LEXEMES[name]))
  return None


@pytest.mark.skipif(shutil.which("gofmt") is None, reason="gofmt is not on PATH")
def test_parser_walks_are_go(setup, tmp_path):
  # The grammar's soundness beyond the lexer: random derivations, deep and odd (types
  # in array lengths in interfaces in map keys...), must all be Go. (This found that
  # go/parser reads `m[k, x]`'s later entries as types.)
  lr, rng = setup.arrays.lr, random.Random(3)
  defs = {d.name: d for d in setup.arrays.grammar.terminal_defs}
  texts = [t for t in (_parser_walk(lr, defs, rng) for _ in range(150)) if t]
  assert len(texts) >= 140
  for i, text in enumerate(texts):
    (tmp_path / f"w{i}.go").write_text(text)
  r = subprocess.run(["gofmt", "-l", "-e", str(tmp_path)], capture_output=True, text=True,
                     timeout=300)
  # gofmt 1.19 panics formatting an import group written on one line, after parsing
  # it: that is no syntax error.
  errors = [line for line in r.stderr.splitlines()
            if line.startswith(str(tmp_path)) and "invalid line number" not in line]
  assert not errors, [(e, texts[int(re.search(r"/w(\d+)\.go", e).group(1))]) for e in errors[:3]]


def test_device_agrees_with_host_reference(setup):
  _walk(setup, steps=20, seed=7, check_reference=2)


@hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
@hypothesis.given(st.data())
def test_acceptance_does_not_depend_on_where_the_text_is_cut(setup, data):
  funcs = _functions()
  text = data.draw(st.sampled_from(funcs)).encode()
  cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=40))
  assert setup.ref_accepts(text, cuts)
  # Dropping one byte of a function gives a text refused exactly when the uncut
  # text is refused (whatever the verdict, it cannot depend on the cuts).
  i = data.draw(st.integers(0, len(text) - 1))
  mutated = text[:i] + text[i + 1:]
  assert setup.ref_accepts(mutated, cuts) == setup.ref_accepts(mutated)


def test_semicolons_option_is_needed():
  # Without Semicolons the newline is ignored everywhere: Go's line-separated
  # statements no longer parse.
  vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                         eos_ids=[256])
  arrays = _lexed_grammar.compile_lexed_grammar(
      open(_PATH, encoding="utf-8").read(), vocab, start="source_file")
  ref = _lexed_grammar.LexedReference(arrays)
  row = ref.step(ref.start(), b"package p\nfunc f() {\n\tx := 1\n\ty := 2\n}\n")
  assert row is None or not ref.end_ok(row)
