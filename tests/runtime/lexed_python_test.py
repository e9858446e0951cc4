"""Python with INDENT/DEDENT on the two-level runtime (issue 18, `python_lexed.lark`).

Oracles: CPython's own parser (`ast.parse`: every text the tables accept, walked or
written, must parse), Lark's LALR parser with its `PythonIndenter` on the same grammar
file (accepts exactly the texts we accept, where both read the text the same way), and
the host reference `LexedReference` (byte walk + `_lr.LrParser` + a list of widths).
Vocabulary: every byte plus substrings of the snippets (multi-byte tokens that cross
lexeme, line and indentation boundaries, as BPE tokens do), sizes derived from it.
One compiled table set and one batch size for the whole module (one jit compile).
"""

import ast
import functools
import glob
import keyword
import os
import random
import re
import warnings

import jax
import jax.numpy as jnp
import lark
import lark.indenter
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding import lexed_tables
from constrained_decoding.constraints import _lexed_grammar
from constrained_decoding.constraints import _lr
from constrained_decoding import testing as cd_testing
from constrained_decoding.runtime import _lexed
from constrained_decoding.runtime import _lexed_lanes

_PATH = _lr.__file__.replace("_lr.py", "grammars/python_lexed.lark")
_BATCH = 16
_INDENT = _lexed_grammar.Indentation(max_depth=6, max_width=24)

SNIPPETS = [
    "def add(a: int, b: int = 0) -> int:\n    return a + b\n",
    "x = 1\ny = x * 2 + 3 ** -4 // 5 % 6\n",
    "def f(xs):\n    total = 0\n    for i, x in enumerate(xs):\n        if x > 0 and not i:\n"
    "            total += x\n        elif x < 0 or x is None:\n            continue\n"
    "        else:\n            break\n    return total\n",
    "while True:\n    n -= 1\n    if n <= 0:\n        break\nelse:\n    pass\n",
    "result = [x * x for x in range(10) if x % 2 == 0]\n"
    "pairs = {k: v for k, v in items.items()}\nunique = {a for a in b}\n",
    "data = {'a': [1, 2.5, 3e-2], \"b\": (None, True, False), 'c': {}}\nempty = ()\n",
    "def g(self, *args, key=None, **kwargs):\n    '''Docstring.\n\n    More text.\n    '''\n"
    "    return self.h(*args, key=key, **kwargs)[0].value\n",
    "try:\n    v = int(s)\nexcept ValueError as e:\n    v = -1\nfinally:\n    done = 1\n",
    "with open(path) as fh, lock:\n    lines = fh.read().splitlines()\n",
    "square = lambda x, y=2: x ** y\nfirst = xs[0] if xs else None\nxs[1:3] = ys[::2]\n",
    "@decorator\n@other.deco(1)\nclass A(Base, metaclass=Meta):\n    x: int = 0\n\n"
    "    def m(self):\n        return self.x\n",
    "# A comment line\ndef f(a,\n      b):  # trailing comment\n    return (a +\n"
    "            b)\n\n\n",
    "import os\nfrom collections import defaultdict as dd, OrderedDict\n",
    "def gen(n):\n    yield n\n    x = yield\n    yield from range(n)\n",
    "assert a == b, 'message'\nraise ValueError('bad') from None\ndel a[0], b.c\n",
    "if (n := len(a)) > 10:\n    print(f\"long {{n}}\", n, sep='')\n",
    "value = 0x1F + 0o17 + 0b1010 + 1_000 + 3.14j + .5\npattern = r'\\d+'\n"
    "raw = b'raw' b\"\\n\"\n",
    "def outer():\n    def inner():\n        nonlocal count\n        global total\n"
    "        count += 1\n    return inner\n",
    "a, b = b, a\n(c, d), [e] = f\nx = y = z = 0\nmatrix[i][j] @= other\n",
    "class Empty:\n    pass\n",
    "def h(s):\n    r\"\"\"Raw \\d docstring \"quoted\".\"\"\"\n    return s\n",
    "def pos(a, b=1, /, c=2, *, d, **kw):\n    return a\ndef only(x, /):\n    pass\n"
    "def mixed(p, /, q, *args):\n    pass\n",
    "a, *rest = xs\n*init, last = xs\nhead, *(b, c), = ys = zs\n"
    "for first, *others in rows:\n    pass\nys = [b for a, *b in rows]\n",
    "@route\nasync def get(self, url):\n    async with self.lock as held:\n"
    "        r = await self.fetch(url) ** 2 + -await g()\n    async for x in r:\n"
    "        (await x).y = await x.y[0]\n    return [await y for y in r]\n",
    "msg = f\"{name!r}: {self.items[0].value:>10} {x=} {{literal}}\" + f'{a[-1]} { b = !s}'\n",
]

# Texts with one syntax error each; "@" marks the byte where the tables must refuse the
# text, "$" that only the end of sequence is refused.
BROKEN = [
    "def f(x)@\n    return x\n",               # `def` without a colon
    "if x:\n    y = 1\n  @z = 2\n",             # dedent to a width never used
    "x = (1,\n     2$",                          # unclosed bracket
    "  @x = 1\n",                               # indented first line
    "if x:\n@y = 1\n",                          # block without indentation
    "def f():\n    return 1\n        @x\n",    # unexpected indent
    "f() =@ 1\n",                               # call as a target
    "x + 1 =@ 2\n",                             # operator as a target
    "f(a=1, b@)\n",                             # positional after keyword
    "def f(a=1, b@):\n    pass\n",              # parameter without default after one with
    "x = 1@abc\n",                              # number glued to a name
    "a, b +@= 1\n",                             # tuple in an augmented assignment
    "x = [1, 2\n@y = 3\n",                      # unclosed list: the newline is dropped
    "return 1 @2\n",
    "x = 'abc@\n",                              # string across a line break
    "if x:\n\t@y\n",                            # tabs: valid, but not in the subset
    "def f(@/, a):\n    pass\n",               # `/` before any parameter
    "def f(a, /, @/):\n    pass\n",           # a second `/`
    "def f(a=1, /, b@):\n    pass\n",         # no default after one, across `/`
    "def f(*, a, @/):\n    pass\n",           # `/` after `*`
    "del @*a, b\n",                             # deleting a starred target
    "(@*a) = b\n",                              # a starred target in parentheses
    "await @= 1\n",                             # `await` is a keyword
    "async @x = 1\n",                           # `async` before no def/for/with
    "await x =@ 1\n",                           # an await expression as a target
    "await await@ x\n",
    "x = f\"{if@}\"\n",                           # f-string fields: no keyword
    "x = f\"{@}\"\n",                             # no empty field
    "x = f\"{x!@z}\"\n",                          # no other conversion
    "x = f\"{x.None@}\"\n",
    "x = f\"\"@\"a\"\n",                        # triple-quoted f-strings: not `f""` `"a"`
    "x = f''@'a'\n",
]


def _parses(text: str) -> bool:
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      ast.parse(text)
      return True
    except (SyntaxError, ValueError):
      return False


class _Setup:
  """The vocabulary, tables, jitted step functions and oracles, built once."""

  def __init__(self):
    rng = random.Random(0)
    source = open(_PATH, encoding="utf-8").read()
    toks = {bytes([b]) for b in range(256)}
    texts = [s.encode() for s in SNIPPETS]
    while len(toks) < 900:
      t = rng.choice(texts)
      i = rng.randrange(len(t) - 1)
      toks.add(t[i:i + rng.randrange(2, 12)])
    token_bytes = sorted(toks) + [None]
    self.eos = len(token_bytes) - 1
    self.vocab = cd.Vocabulary.from_token_bytes(token_bytes, eos_ids=[self.eos])
    self.by_bytes = {b: i for i, b in enumerate(token_bytes) if b is not None}
    self.arrays = _lexed_grammar.compile_lexed_grammar(
        source, self.vocab, start="file_input", stack_depth=96, indentation=_INDENT)
    self.tables = _lexed.tables_from_arrays(self.arrays)
    self.allowed = jax.jit(_lexed.allowed_tokens)
    self.advance = jax.jit(_lexed.advance)
    self.reference = _lexed_grammar.LexedReference(self.arrays)
    # Lark's basic lexer takes the first terminal that matches, not the longest: rank
    # triple-quoted strings first and the bad-number catch-all last (Lark then reads
    # `1if` as `1 if`, which CPython also does, with a warning; texts with a digit
    # glued to a letter are not compared).
    ranked = source
    for name, rank in (("LONG_STRING", 2), ("BAD_NUMBER", -1), ("HEX_NUMBER", 3),
                       ("OCT_NUMBER", 3), ("BIN_NUMBER", 3), ("IMAG_NUMBER", 3),
                       ("FLOAT_NUMBER", 2)):
      ranked = ranked.replace(f"\n{name}:", f"\n{name}.{rank}:")
    self.lark = lark.Lark(ranked, parser="lalr", lexer="basic", start="file_input",
                          postlex=lark.indenter.PythonIndenter())

  def lark_accepts(self, text: str) -> bool:
    try:
      self.lark.parse(text)
      return True
    except lark.exceptions.LarkError:
      return False

  def tokenize(self, text: bytes, rng) -> list[int]:
    out, pos = [], 0
    while pos < len(text):
      n = rng.choice([n for n in range(1, 12) if text[pos:pos + n] in self.by_bytes])
      out.append(self.by_bytes[text[pos:pos + n]])
      pos += n
    return out

  def run(self, rows: list[list[int]], check_mask: bool = False):
    """(accepted [R], index of the first refused token or -1 [R]) of token rows, then end
    of sequence, _BATCH at a time; with `check_mask`, also checks that `advance` refuses a
    token exactly when the mask does not offer it."""
    return cd_testing.run_lexed_rows(self.tables, rows, self.eos, _BATCH, self.advance,
                                     self.allowed if check_mask else None)


@functools.lru_cache(maxsize=1)
def shared_setup() -> _Setup:
  """One `_Setup` a process, for this module and `lexed_cpu_paths_test` (the grammar's
  compile and the default forms' jit traces were most of each module's set-up time).
  The default (platform-switched) forms are traced here, before any test patches the
  settings: a later patch cannot leak into `allowed` / `advance` whatever runs first."""
  s = _Setup()
  state = _lexed.init_state(s.tables, _BATCH)
  s.allowed(s.tables, state)
  s.advance(s.tables, state, jnp.full((_BATCH,), s.eos, jnp.int32))
  return s


@pytest.fixture(scope="module")
def setup():
  return shared_setup()


def test_snippets_are_python_and_accepted_under_random_tokenizations(setup):
  rng = random.Random(1)
  for text in SNIPPETS:
    assert _parses(text), text
    assert setup.lark_accepts(text), text
  rows = [setup.tokenize(t.encode(), rng) for t in SNIPPETS for _ in range(2)]
  accepted, first_bad = setup.run(rows)
  for k, ok in enumerate(accepted):
    text = SNIPPETS[k // 2]
    assert ok, (text, first_bad[k], [setup.vocab.token_bytes[t] for t in rows[k]])


def test_syntax_errors_are_refused_at_the_right_byte(setup):
  rows, where = [], []
  for marked in BROKEN:
    text = marked.replace("@", "").replace("$", "")
    assert not _parses(text) or "\t" in text, text
    rows.append([setup.by_bytes[bytes([b])] for b in text.encode()])  # a byte a token
    where.append(marked.index("@") if "@" in marked else len(text))
  accepted, first_bad = setup.run(rows, check_mask=True)
  wrong = [(marked, bad, want) for marked, ok, bad, want
           in zip(BROKEN, accepted, first_bad, where) if ok or bad != want]
  assert not wrong


def _walk(setup, steps, seed, check_reference=0, compare_with=None):
  """Random walks over allowed tokens, winding down in the last half (tokens that close
  brackets, lines and blocks favoured): the texts that ended. `compare_with`: a pair
  (allowed, advance) of other step functions that must agree at every step."""
  rng = np.random.default_rng(seed)
  closers = np.array([setup.by_bytes[b] for b in (b")", b"]", b"}", b"\n", b"0", b"x",
                                                  b" ", b"'", b":", b"pass", b"\n ")
                      if b in setup.by_bytes])
  state = _lexed.init_state(setup.tables, _BATCH)
  rows = [setup.reference.start() for _ in range(check_reference)]
  texts = [b""] * _BATCH
  finished = []
  for step in range(steps):
    allowed = np.asarray(setup.allowed(setup.tables, state))
    done = np.asarray(state.done)
    for r in range(check_reference):
      if not done[r]:
        want = setup.reference.allowed(rows[r])
        np.testing.assert_array_equal(allowed[r], want, err_msg=repr(texts[r]))
    tokens = np.full(_BATCH, setup.eos, np.int32)
    for r in range(_BATCH):
      if done[r]:
        continue
      ids = np.nonzero(allowed[r])[0]
      assert len(ids), f"dead end after {texts[r]!r}"
      late = step > steps // 2
      if allowed[r, setup.eos] and (rng.random() < (0.5 if late else 0.05)):
        finished.append(texts[r])
        continue
      good = closers[allowed[r, closers]]
      pool = good if late and len(good) and rng.random() < 0.8 else ids[ids != setup.eos]
      if len(pool):
        tokens[r] = rng.choice(pool)
        texts[r] += setup.vocab.token_bytes[tokens[r]]
      else:
        finished.append(texts[r])
      if r < check_reference:
        rows[r] = setup.reference.advance(rows[r], int(tokens[r]))
        assert rows[r] is not None, texts[r]
    if compare_with is not None:
      other_allowed, other_advance = compare_with
      np.testing.assert_array_equal(np.asarray(other_allowed(setup.tables, state)), allowed)
      other = other_advance(setup.tables, state, jnp.asarray(tokens))
    state = setup.advance(setup.tables, state, jnp.asarray(tokens))
    if compare_with is not None:
      for a, b in zip(jax.tree_util.tree_leaves(other), jax.tree_util.tree_leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.asarray(state.error).any()
  return finished


def test_random_walks_never_dead_end_and_finished_texts_parse(setup):
  finished = []
  for seed in range(3):
    finished += _walk(setup, steps=70, seed=seed)
  assert len(finished) >= _BATCH
  for text in finished:
    assert _parses(text.decode("utf-8")), text


def test_device_agrees_with_host_reference(setup):
  _walk(setup, steps=25, seed=7, check_reference=2)


def test_accelerator_lane_settings_agree_with_cpu_ones(setup, monkeypatch):
  # What a GPU or TPU traces (several micro-steps per loop iteration, stack writes by
  # select, an unrolled token search), forced on CPU: the same masks and states.
  monkeypatch.setattr(_lexed_lanes, "LANE_UNROLL", {"cpu": 2})
  monkeypatch.setattr(_lexed_lanes, "LANE_SELECT_WRITES", {"cpu": True})
  monkeypatch.setattr(_lexed, "SEARCH_METHOD", {"cpu": "scan_unrolled"})
  monkeypatch.setattr(_lexed_lanes, "LANE_POOL", {"cpu": 0})  # every lane in one loop
  other = (jax.jit(lambda t, s: _lexed.allowed_tokens(t, s)),
           jax.jit(lambda t, s, k: _lexed.advance(t, s, k)))
  _walk(setup, steps=20, seed=11, compare_with=other)


def test_lane_queue_with_one_slot_per_row_agrees(setup, monkeypatch):
  # The lanes as a work queue of one slot per row (a slot takes the next lane at every
  # lane's end: the most refills) against the default pool: same masks and states,
  # the fused step included.
  monkeypatch.setattr(_lexed_lanes, "LANE_POOL", {"cpu": 1})
  other = (jax.jit(lambda t, s: _lexed.allowed_tokens(t, s)),
           jax.jit(lambda t, s, k: _lexed.allowed_bits_and_advance(t, s)[1](k)))
  _walk(setup, steps=20, seed=13, compare_with=other)


def test_lanes_after_shared_prefixes_agree(setup, monkeypatch):
  # In the queue (lanes outnumber its 4 slots here), each row runs each distinct prefix
  # (first two lexemes) of its lexer state's lanes once and its lanes start after it
  # (`_after_prefix`). With one copied stack column, prefixes that push more are
  # common, and their lanes start from the row instead: both against every lane run
  # whole in one loop (the fixture's functions at _BATCH rows), mask and fused step.
  assert setup.tables.state_prefix_items is not None
  assert 16 * (setup.tables.state_seq_lanes.shape[1] + 1) >= _lexed_lanes._SHARE_FROM * 4
  monkeypatch.setattr(_lexed_lanes, "LANE_POOL", {"cpu": 1})
  monkeypatch.setattr(_lexed_lanes, "_PREFIX_COLUMNS", 1)
  other = (jax.jit(lambda t, s: _lexed.allowed_tokens(t, s)),
           jax.jit(lambda t, s, k: _lexed.allowed_bits_and_advance(t, s)[1](k)))
  _walk(setup, steps=20, seed=17, compare_with=other)


def test_lane_prefix_tables_list_each_lanes_first_two_lexemes():
  lanes = np.array([[1, 2, 3, 4], [0, -1, -1, -1], [3, 3, 1, -1]])
  seq_items = np.array([[-1, -1, -1], [5, 1, 7], [3, 2, -1], [5, -1, -1], [5, 1, 8]])
  prefixes, lane_prefix = lexed_tables.lane_prefix_tables(lanes, seq_items)
  # Lanes 0 and 3 of state 0 share their prefix (5, 1); a one-lexeme lane is its own.
  np.testing.assert_array_equal(prefixes, [[[3, 2], [5, -1], [5, 1]],
                                           [[-1, -1], [-1, -1], [-1, -1]],
                                           [[5, -1], [5, 1], [-1, -1]]])
  np.testing.assert_array_equal(lane_prefix, [[2, 0, 1, 2], [-1, -1, -1, -1],
                                              [0, 0, 1, -1]])
  one, lane_one = lexed_tables.lane_prefix_tables(lanes, seq_items, length=1)
  np.testing.assert_array_equal(one[:, :, 0], [[3, 5], [-1, -1], [5, -1]])
  np.testing.assert_array_equal(lane_one, [[1, 0, 1, 1], [-1, -1, -1, -1],
                                           [0, 0, 0, -1]])


def test_advance_from_the_mask_lanes_agrees_with_advance(setup):
  # The decode loop's step: `advance` from the lanes `allowed_bits` ran (the token's
  # sequence lane and the end lane), not a run of its own. Same states on random walks
  # (indentation included), and on refused, end-of-sequence and out-of-range tokens.
  fused = jax.jit(lambda t, s, k: _lexed.allowed_bits_and_advance(t, s)[1](k))
  _walk(setup, steps=16, seed=12, compare_with=(setup.allowed, fused))
  state = _lexed.init_state(setup.tables, _BATCH)
  refused = int(np.flatnonzero(~np.asarray(setup.allowed(setup.tables, state))[0])[0])
  tokens = jnp.array(([refused, setup.eos, setup.vocab.vocab_size + 5, -1] * _BATCH)[:_BATCH])
  for a, b in zip(jax.tree_util.tree_leaves(fused(setup.tables, state, tokens)),
                  jax.tree_util.tree_leaves(setup.advance(setup.tables, state, tokens))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_decode_step_above_the_fused_limit_agrees(setup, monkeypatch):
  # Where every lane's pushes would be too many to keep (`FUSED_LANES_MAX`, 0 here), the
  # decode step is the mask from the per-slot queue, then `advance`: the same masks and
  # states as `allowed_tokens` and `advance` at every step.
  monkeypatch.setattr(_lexed, "FUSED_LANES_MAX", {"cpu": 0, "default": 0})

  def mask(t, s):
    bits = _lexed.allowed_bits_and_advance(t, s)[0]
    unpacked = (bits[:, :, None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
    return unpacked.astype(bool).reshape(bits.shape[0], -1)[:, :t.vocab_size]

  other = (jax.jit(mask), jax.jit(lambda t, s, k: _lexed.allowed_bits_and_advance(t, s)[1](k)))
  _walk(setup, steps=16, seed=29, compare_with=other)


def _fields_in_subset(node: ast.JoinedStr) -> bool:
  """Whether an f-string's fields are names with attributes and name or integer
  subscripts, without nested fields in the format spec (`_FSTRING`)."""
  def ref(e):
    while isinstance(e, (ast.Attribute, ast.Subscript)):
      if isinstance(e, ast.Subscript) and not (
          isinstance(e.slice, ast.Name) or (isinstance(e.slice, ast.Constant) and
                                             type(e.slice.value) is int)):
        return False
      e = e.value
    return isinstance(e, ast.Name)
  return all(not isinstance(v, ast.FormattedValue) or (
      ref(v.value) and (v.format_spec is None or all(
          isinstance(w, ast.Constant) for w in v.format_spec.values)))
      for v in node.values)


def _in_subset(src: str) -> bool:
  """Whether a function uses only what `python_lexed.lark` covers (by its AST, and by
  Python's own warnings: string escapes it does not define, such as `"\\d"`, are
  outside the subset)."""
  if "\\\n" in src or "\t" in src or not src.isascii():
    return False
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tree = ast.parse(src)
  if any("escape sequence" in str(w.message) for w in caught):
    return False
  for node in ast.walk(tree):
    if isinstance(node, (ast.Match, ast.TryStar)):
      return False
    if isinstance(node, ast.comprehension) and node.is_async:
      return False
    if isinstance(node, ast.JoinedStr) and not _fields_in_subset(node):
      return False
    if isinstance(node, ast.Lambda) and node.args.posonlyargs:
      return False
    if isinstance(node, ast.Lambda) and (node.args.vararg or node.args.kwarg or node.args.kwonlyargs):
      return False
    if isinstance(node, ast.ImportFrom) and node.level:
      return False
  # Starred outside calls / list / set displays.
  for node in ast.walk(tree):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, ast.Starred) and not isinstance(node, (ast.Call, ast.List, ast.Set)):
        return False
      if isinstance(child, ast.Starred) and isinstance(node, ast.List) and isinstance(node.ctx, ast.Store):
        return False
  return True


def test_subset_filter_refuses_invalid_string_escapes():
  # Python warns on escapes it does not define (`\d`, `\q`); raw strings have none.
  assert _in_subset('def f():\n    return "\\n", r"\\d"\n')
  for literal in ('"\\d"', "b'\\q'", '"""a\\."""', "f'{x}\\w'"):
    assert not _in_subset(f"def f():\n    return {literal}\n"), literal


def _stdlib_functions(limit_lines=60):
  """Top-level functions of this Python's `Lib/*.py` (no dedent needed): (file, name,
  source)."""
  lib = os.path.dirname(os.__file__)
  out = []
  for path in sorted(glob.glob(lib + "/*.py")):
    try:
      src = open(path, encoding="utf-8").read(); tree = ast.parse(src)
    except Exception:
      continue
    lines = src.splitlines(keepends=True)
    for node in tree.body:  # top-level functions only: no dedent needed
      if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno < limit_lines:
        start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        body = "".join(lines[start - 1:node.end_lineno])
        out.append((os.path.basename(path), node.name, body))
  return out


def test_stdlib_functions_in_the_subset_are_accepted_under_random_tokenizations(setup):
  # Issue 18's acceptance: real functions, filtered to the subset by their AST (no
  # f-string fields other than names, `/` in lambdas, star targets, ...), not by our
  # tables, and
  # to _INDENT's 6 levels of at most 24 columns.
  funcs = [body for _, _, body in _stdlib_functions() if _in_subset(body)
           and max(len(x) - len(x.lstrip(" ")) for x in body.splitlines()) <= 20]
  assert len(funcs) >= 300
  rng = random.Random(4)
  refused = []
  # The host reference (equal to the device: tested above) under random splits.
  for body in rng.sample(funcs, 300):
    data, row, pos = body.encode(), setup.reference.start(), 0
    while row is not None and pos < len(data):
      n = rng.randrange(1, 64)
      row = setup.reference.step(row, data[pos:pos + n])
      pos += n
    if row is None or not setup.reference.end_ok(row):
      refused.append(body)
  assert not refused
  # The 16 shortest on the device, under random tokenizations of its vocabulary.
  short = sorted(funcs, key=len)[:_BATCH]
  accepted, _ = setup.run([setup.tokenize(b.encode(), rng) for b in short])
  assert all(accepted)


def _mutate(text: str, rng) -> str:
  i = rng.randrange(len(text) + 1)
  kind = rng.randrange(3)
  if kind == 0 and text:
    return text[:i] + text[i + 1:]
  if kind == 1:
    return text[:i] + rng.choice(["(", ")", ",", ":", "\n", "    ", " ", "x", "=", "if ",
                                  "'", "[", "1"]) + text[i:]
  j = rng.randrange(len(text) + 1)
  i, j = min(i, j), max(i, j)
  return text[:i] + text[j:] + text[i:j]


def test_texts_accepted_exactly_when_lark_parses_them(setup):
  rng = random.Random(3)
  texts = [_mutate(t, rng) for t in SNIPPETS for _ in range(3)]
  # Where Lark's PythonIndenter and CPython part ways, we follow CPython: a text is
  # compared only when it ends with one newline (Lark needs it) and has no trailing
  # blank text (Lark would indent it).
  texts = [t.rstrip() + "\n" for t in texts if not re.search(r"[0-9][A-Za-z_]", t)]
  verdicts = [setup.lark_accepts(t) for t in texts]
  assert 8 <= sum(verdicts) <= len(texts) - 8  # both kinds, many of each
  accepted, _ = setup.run([setup.tokenize(t.encode(), rng) for t in texts])
  for text, want, got in zip(texts, verdicts, accepted):
    assert got == want, text
    assert not got or _parses(text), text


def test_indentation_overflow_is_masked_without_dead_ends(setup):
  # _INDENT holds 6 levels (widths 0, 1, ..., 5): a 6th block opener may only take a
  # simple suite on its own line; a 25-column line (past max_width) is refused.
  deep = "".join(" " * k + f"if a{k}:\n" for k in range(5))
  ids = lambda s: [setup.by_bytes[bytes([b])] for b in s.encode()]
  state = _lexed.init_state(setup.tables, _BATCH)
  for t in ids(deep + " " * 5 + "if b:"):
    state = setup.advance(setup.tables, state, jnp.full(_BATCH, t, jnp.int32))
  allowed = np.asarray(setup.allowed(setup.tables, state))[0]
  assert not np.asarray(state.error).any()
  assert not allowed[setup.by_bytes[b"\n"]]  # would need a 7th level
  assert allowed[setup.by_bytes[b" "]] and allowed[setup.by_bytes[b"p"]]
  accepted, first_bad = setup.run([ids(deep + " " * 5 + "if b: pass\n"),
                                   ids(deep + " " * 5 + "if b:\n      pass\n"),
                                   ids("if a:\n" + " " * 25 + "x\n")])
  assert accepted == [True, False, False]
  assert first_bad[1:] == [len(deep) + 10, 6 + 25]
  assert _parses(deep + " " * 5 + "if b: pass\n")
  # A state without the indentation registers (e.g. the flat runtime's) is refused.
  with pytest.raises(errors.DecodingArgumentError, match=r"and 8 registers \(bracket"):
    _lexed.allowed_bits(setup.tables, state.replace(registers=None))


def test_fstring_field_names_are_names_minus_keywords():
  # `_FNAME` of the grammar is written out; the oracle is Python's own keyword list.
  source = open(_PATH, encoding="utf-8").read()
  fname = re.compile(re.search(r"^_FNAME: /(.*)/$", source, re.M).group(1))
  rng = random.Random(5)
  words = list(keyword.kwlist) + ["x", "_", "a1", "None_", "Tru", "iff", "i", "asyncio"]
  words += [k[:n] + c for k in keyword.kwlist for n in range(len(k) + 1) for c in "ae_1"]
  words += ["".join(rng.choice("abdefilnorstyNTF_1") for _ in range(rng.randrange(1, 7)))
            for _ in range(3000)]
  for w in words:
    want = w.isidentifier() and w.isascii() and not keyword.iskeyword(w)
    assert bool(fname.fullmatch(w)) == want, w


def test_pattern_fragments_are_not_lexemes():
  # `_FIELD` is only a piece of STR (as `_FFIELD_D` of STRING): `{ab}` in code is three
  # lexemes, not one `_FIELD` that no rule takes. BAD (no underscore) stays a lexeme.
  grammar = ('start: "{" NAME "}" | STR\nSTR: /\'/ _FIELD /\'/\n_FIELD: "{" /[a-z]+/ "}"\n'
             'NAME: /[a-z]+/\nBAD: /[0-9]+[a-z]+/\n')
  vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                         eos_ids=[256])
  ref = _lexed_grammar.LexedReference(_lexed_grammar.compile_lexed_grammar(grammar, vocab))
  accepted = lambda text: (lambda row: row is not None and ref.end_ok(row))(
      ref.step(ref.start(), text))
  assert accepted(b"{ab}") and accepted(b"'{ab}'")
  assert not accepted(b"'ab'") and not accepted(b"{1ab}")


def test_indentation_errors():
  source = open(_PATH, encoding="utf-8").read()
  vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                         eos_ids=[256])
  with pytest.raises(errors.ConstraintError, match="Indentation.max_depth 1 is not an int"):
    _lexed_grammar.compile_lexed_grammar(source, vocab, start="file_input",
                                         indentation=_lexed_grammar.Indentation(max_depth=1))
  with pytest.raises(errors.UnsupportedGrammarFeatureError,
                     match=r"does not use the indentation terminals \['_TAB'\]"):
    _lexed_grammar.compile_lexed_grammar(
        source, vocab, start="file_input",
        indentation=_lexed_grammar.Indentation(indent="_TAB"))
  # INDENT after a newline that a reduction decides: the mask could not see it.
  bad = ('start: (item _NEWLINE)* \nitem: "a" | head _NEWLINE _INDENT "b" _DEDENT\n'
         'head: "h"\n_NEWLINE: /\\n[ ]*/\n%declare _INDENT _DEDENT\n')
  with pytest.raises(errors.UnsupportedGrammarFeatureError, match="opens a block"):
    _lexed_grammar.compile_lexed_grammar(bad, vocab, indentation=_INDENT)
  # The text starts at a line start: a start rule that cannot take the newline first
  # would allow no token at all.
  blocks = ('stmt: NAME ":" _NEWLINE _INDENT stmt+ _DEDENT | NAME _NEWLINE\n'
            '_NEWLINE: /(\\r?\\n[\\t ]*)+/\nNAME: /[a-z]+/\n%declare _INDENT _DEDENT\n')
  with pytest.raises(errors.UnsupportedGrammarFeatureError, match="take.* _NEWLINE first"):
    _lexed_grammar.compile_lexed_grammar("start: stmt+\n" + blocks, vocab,
                                         indentation=_INDENT)
  _lexed_grammar.compile_lexed_grammar("start: (_NEWLINE | stmt)*\n" + blocks, vocab,
                                       indentation=_INDENT)
