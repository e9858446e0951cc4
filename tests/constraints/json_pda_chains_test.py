"""Counted chains in push-down tables (`automata/_pda_chains.py`), Gemma 3 vocabulary.

A schema whose extra properties are free-form values compiles, with
`free_form_depth=None`, to push-down tables; its bounded strings (`maxLength`, `minLength`
alone, a hex `pattern`) are counted chains there. Oracles: `jsonschema` on texts of n and
n + 1 characters under random tokenizations (reference walk and the device at batch 8),
the same tables without counted chains (`counted_chains=False`: every token an explicit
edge) along random token walks, and `jsonschema` on random walks of the tables.
"""

import json
import random

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.testing import TokenIndex, reference_accepts, reference_allowed
from constrained_decoding.testing import reference_end_allowed, reference_step_stack
from constrained_decoding.testing._reference import zero_registers

SCHEMA = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "maxLength": 12},
        "pin": {"type": "string", "minLength": 5},
        "tag": {"type": "string", "pattern": "^[0-9a-f]{0,9}$"},
    },
    "required": ["code"],
}  # Extra properties: free-form values, calls of one JSON rule.
# Characters that stress the count: multi-byte UTF-8, escapes, digits, spaces.
_ALPHABET = ["a", "Z", "7", " ", "é", "中", "\n", '"', "\\", "😀", "-"]


@pytest.fixture(scope="module", name="tables")
def fixture_tables(gemma_compiler):
  return gemma_compiler.compile(cd.JsonSchema(SCHEMA, free_form_depth=None))


@pytest.fixture(scope="module", name="plain")
def fixture_plain(gemma_vocab):
  options = cd.CompileOptions(counted_chains=False, memoize=False)
  return cd.Compiler(gemma_vocab, options).compile(cd.JsonSchema(SCHEMA, free_form_depth=None))


@pytest.fixture(scope="module", name="index")
def fixture_index(gemma_vocab):
  return TokenIndex(gemma_vocab)


def _text(value, rng: random.Random) -> bytes:
  return json.dumps(value, separators=(",", ":"), ensure_ascii=rng.random() < 0.3).encode()


def _documents(rng: random.Random) -> list:
  """Documents with strings of n and n + 1 characters around every bound."""
  docs = []
  for n in (0, 1, 11, 12, 13, 30):
    code = "".join(rng.choice(_ALPHABET) for _ in range(n))
    docs.append({"code": code})
    docs.append({"code": "x", "more": [1, {"k": code}], "code2": code})
  for n in (4, 5, 6, 40):
    docs.append({"code": "", "pin": "".join(rng.choice(_ALPHABET) for _ in range(n))})
  for n in (4, 5, 6, 8, 9):  # Whole words: long tokens cross the bound in one step.
    docs.append({"code": "interrogation"[:n + 7], "pin": "passwords"[:n]})
  for n in (8, 9, 10):
    docs.append({"code": "", "tag": "".join(rng.choice("0123456789abcdef") for _ in range(n))})
  return docs


def _valid(doc) -> bool:
  return jsonschema.Draft202012Validator(SCHEMA).is_valid(doc)


def test_bounded_strings_are_counted_chains(tables, plain):
  assert tables.is_pushdown and plain.is_pushdown
  counting = np.asarray(tables.terminal_counts)[:, 0] >= 0
  assert counting.any() and tables.token_counts.shape[0] >= 1
  assert not (np.asarray(plain.terminal_counts)[:, 0] >= 0).any()
  # Far fewer explicit edges than the same tables walked token by token.
  assert int(tables.edge_start[-1]) * 4 < int(plain.edge_start[-1])


def test_lengths_n_and_n_plus_one_agree_with_jsonschema(tables, index, gemma_vocab):
  rng = random.Random("lengths")
  docs = _documents(rng)
  valid = [_valid(d) for d in docs]
  assert sum(valid) >= 5 and len(docs) - sum(valid) >= 4  # n + 1 past each bound
  rows, expected = [], []
  for doc, ok in zip(docs, valid):
    data = _text(doc, rng)
    for tokens in (index.random_tokenization(data, rng), index.longest_tokenization(data)):
      assert reference_accepts(tables, tokens) == ok, data
      rows.append(tokens)
      expected.append(ok)
  assert _device_accepts(tables, rows, gemma_vocab.eos_ids[0]) == expected


def _word(vocab, length: int) -> int:
  """A token of `length` lowercase ASCII letters."""
  return next(t for t, data in enumerate(vocab.token_bytes)
              if data and len(data) == length and data.isalpha() and data.islower())


@pytest.mark.parametrize("key, lengths", [("code", (1, 11, 12, 13)), ("pin", (3, 4, 5, 8))])
def test_one_token_across_a_bound(key, lengths, tables, index, gemma_vocab):
  """A single token of n characters right after the opening quote, then the closing quote
  alone: the counting terminal's target decides (its bound, its bias, the saturating
  entry of `minLength`)."""
  rng = random.Random(key)
  rows, expected = [], []
  for n in lengths:
    for before in ("", "ab"):
      word = _word(gemma_vocab, n)
      doc = {"code": "x", key: before + gemma_vocab.token_bytes[word].decode()}
      head = '{"code":"' if key == "code" else f'{{"code":"x","{key}":"'
      tokens = (index.random_tokenization(f"{head}{before}".encode(), rng)
                + [word] + index.random_tokenization(b'"}', rng))
      assert reference_accepts(tables, tokens) == _valid(doc), doc
      rows.append(tokens)
      expected.append(_valid(doc))
  assert True in expected and False in expected
  assert _device_accepts(tables, rows, gemma_vocab.eos_ids[0]) == expected


def _device_accepts(tables, rows: list[list[int]], eos: int) -> list[bool]:
  """Feeds each row's tokens then end of sequence on the device, 8 rows at a time."""
  advance = jax.jit(cd.advance)
  out = []
  for lo in range(0, len(rows), 8):
    batch = rows[lo:lo + 8]
    batch += [[eos]] * (8 - len(batch))
    width = max(map(len, batch)) + 1
    state = cd.init_state(tables, 8)
    for step in range(width):
      tokens = [r[step] if step < len(r) else eos for r in batch]
      state = advance(tables, state, jnp.asarray(tokens, jnp.int32))
    done = np.asarray(state.done) & ~np.asarray(state.error)
    out += done[:len(rows[lo:lo + 8])].tolist()
  return out


def test_masks_equal_tables_without_counted_chains(tables, plain, index, gemma_vocab):
  """Along walks that start inside the bounded strings (tokenized documents cut at
  random) and go on at random, both tables allow the same tokens, device masks of the
  counted tables (batch 8) included."""
  rng = random.Random("walks")
  nprng = np.random.default_rng(0)
  eos = set(gemma_vocab.eos_ids)
  allowed_fn = jax.jit(cd.allowed_tokens)
  advance_fn = jax.jit(cd.advance)
  docs = [d for d in _documents(rng) if _valid(d)]
  compared = 0
  for _ in range(2):
    device = cd.init_state(tables, 8)
    rows = []
    for _ in range(8):
      tokens = index.random_tokenization(_text(rng.choice(docs), rng), rng)
      rows.append(tokens[:rng.randrange(2, len(tokens))])
    walks = [[(int(tables.start[0]), (), zero_registers(tables)),
              (int(plain.start[0]), (), zero_registers(plain))] for _ in rows]
    for step in range(max(map(len, rows)) + 6):
      device_allowed = np.asarray(allowed_fn(tables, device))
      tokens = []
      for row, (a, b) in enumerate(walks):
        if a is None:
          tokens.append(next(iter(eos)))
          continue
        mask = reference_allowed(tables, *a)
        np.testing.assert_array_equal(mask, reference_allowed(plain, *b))
        np.testing.assert_array_equal(device_allowed[row], mask)
        compared += 1
        choices = np.flatnonzero(mask & ~np.isin(np.arange(len(mask)), list(eos)))
        if step < len(rows[row]):
          token = rows[row][step]
        elif len(choices):
          token = int(nprng.choice(choices))
        else:
          walks[row] = [None, None]
          tokens.append(next(iter(eos)))
          continue
        tokens.append(token)
        walks[row] = [reference_step_stack(tables, *a[:2], token, a[2]),
                      reference_step_stack(plain, *b[:2], token, b[2])]
        assert walks[row][0] is not None and walks[row][1] is not None
      device = advance_fn(tables, device, jnp.asarray(tokens, jnp.int32))
  assert compared > 100


_FINISH = (b'"', b":", b"0", b"}", b"]")  # Tokens that close what is open, in order.


def _walk(tables, rng: random.Random, vocab, prefix: list[int], max_tokens: int) -> bytes:
  """`prefix`, random allowed tokens, then (after `max_tokens`) the first of `_FINISH`
  allowed, until end of sequence is allowed; the text."""
  state, stack, registers = int(tables.start[0]), (), zero_registers(tables)
  eos = set(vocab.eos_ids)
  finish = {t: _FINISH.index(b) for t, b in enumerate(vocab.token_bytes) if b in _FINISH}
  data = b""
  for token in prefix:
    state, stack, registers = reference_step_stack(tables, state, stack, token, registers)
    data += vocab.token_bytes[token]
  for step in range(10 * max_tokens):
    choices = [t for t in np.flatnonzero(reference_allowed(tables, state, stack, registers))
               .tolist() if t not in eos]
    if reference_end_allowed(tables, state, stack) and (
        not choices or step >= max_tokens or rng.random() < 0.05):
      return data
    closing = sorted((finish[t], t) for t in choices if t in finish)
    token = closing[0][1] if step >= max_tokens and closing else rng.choice(choices)
    state, stack, registers = reference_step_stack(tables, state, stack, token, registers)
    data += vocab.token_bytes[token]
  raise AssertionError(f"no end after {10 * max_tokens} tokens: {data!r}")


def test_random_walks_validate(tables, gemma_vocab, index):
  rng = random.Random("validate")
  for _ in range(6):  # The required key first: random extra keys would rarely end.
    prefix = index.random_tokenization(b'{"code":"', rng)
    text = _walk(tables, rng, gemma_vocab, prefix, 30)
    jsonschema.validate(json.loads(text.decode()), SCHEMA)
