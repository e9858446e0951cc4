"""Counted chains of push-down tables that end in one shared state (`_pda_chains`).

In an object with an e-mail address and a `maxLength` user name (extra properties are
free-form values: push-down tables with `free_form_depth=None`), the host name's chain
`[A-Za-z0-9]...{0,31}` and the name's `[a-z0-9_]{0,9}` both end, once both keys were
read, in the same state (before the closing quote, with the same object after it), which
the minimal DFA merges. The second chain gets a copy of that end
(`PdaChain.copies`) instead of every one of its positions walking ~33k tokens.
Oracles: `re` (the e-mail grammar) and `jsonschema` on texts with each count at and
past its bound under random tokenizations, and the same tables without counted chains
(every token an explicit edge) along random walks.
"""

import json
import random
import re

import jsonschema
import numpy as np
import pda_chains_sides_test  # pylint: disable=import-error  (same directory)
import pytest

import constrained_decoding as cd
from constrained_decoding.constraints import _json_formats
from constrained_decoding.testing import TokenIndex, reference_accepts, reference_allowed
from constrained_decoding.testing import reference_step_stack
from constrained_decoding.testing._reference import zero_registers

SCHEMA = {
    "type": "object",
    "properties": {
        "mail": {"type": "string", "format": "email"},
        "user": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$", "maxLength": 10},
    },
}
_HOST = ((48, 57), (65, 90), (97, 122))  # [0-9A-Za-z]
_USER = ((48, 57), (95, 95), (97, 122))  # [0-9_a-z]


@pytest.fixture(scope="module", name="compiled")
def fixture_compiled(gemma_vocab):
  """(tables, the chains `find_chains` returned for them)."""
  return pda_chains_sides_test.compile_spying_chains(gemma_vocab, SCHEMA,
                                                     cd.CompileOptions(memoize=False))


@pytest.fixture(scope="module", name="plain")
def fixture_plain(gemma_vocab):
  options = cd.CompileOptions(counted_chains=False, memoize=False)
  return cd.Compiler(gemma_vocab, options).compile(cd.JsonSchema(SCHEMA, free_form_depth=None))


@pytest.fixture(scope="module", name="index")
def fixture_index(gemma_vocab):
  return TokenIndex(gemma_vocab)


def _valid(doc) -> bool:
  mail = doc.get("mail")
  return (jsonschema.Draft202012Validator(SCHEMA).is_valid(doc)
          and (mail is None or re.fullmatch(_json_formats._EMAIL, mail) is not None))


def _host(units: int, rng: random.Random) -> str:
  """A host name of `units` units (a letter or digit, or `-`/`.` then one)."""
  chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
  text = rng.choice(chars)
  for _ in range(units - 1):
    text += rng.choice(["", "", "", "-", "."]) + rng.choice(chars)
  return text


def _documents(rng: random.Random) -> list[dict]:
  """Both keys, in both orders (the shared end is reached either way), each count at
  and past its bound, and whole words (long tokens across the bound)."""
  docs = []
  for units in (1, 5, 31, 32, 33):
    for length in (1, 9, 10, 11):
      user = rng.choice("abcxyz") + "".join(rng.choice("ab_09z") for _ in range(length - 1))
      mail = "me@" + _host(units, rng)
      docs.append({"mail": mail, "user": user})
      docs.append({"user": user, "mail": mail})
  for word in ("interrogat", "interrogate", "interrogation", "x"):
    docs.append({"mail": "a@" + "b" * 22 + word, "user": word})
    docs.append({"user": word, "mail": "a@" + word * 3})
  return docs


def _text(doc) -> bytes:
  return json.dumps(doc, separators=(",", ":")).encode()


def test_shared_end_is_copied(compiled, plain):
  tables, chains = compiled
  by_class = {chain.char_class.ranges: chain for chain in chains}
  assert _HOST in by_class and _USER in by_class  # Both found, not only the first.
  copied = [chain for chain in chains if chain.copies]
  assert copied
  owned = {s for chain in chains for s in chain.states[:-1]}
  for chain in copied:
    copy, original = chain.copies[0]
    assert chain.states[-1] == copy and copy not in owned
    assert any(other.states[-1] == original for other in chains if other is not chain)
  # The name's head `[a-z]` is a side before p_0 (a letter leads to p_0).
  assert any(j == 0 for _, j, _ in by_class[_USER].sides)
  # The name's positions are counted too: far fewer explicit edges than token by token.
  assert int(tables.edge_start[-1]) * 20 < int(plain.edge_start[-1])


def test_bounds_agree_with_re_and_jsonschema(compiled, index):
  tables, _ = compiled
  rng = random.Random("bounds")
  docs = _documents(rng)
  verdicts = [_valid(d) for d in docs]
  assert sum(verdicts) >= 10 and len(docs) - sum(verdicts) >= 10
  for doc, ok in zip(docs, verdicts):
    data = _text(doc)
    for tokens in (index.random_tokenization(data, rng), index.longest_tokenization(data)):
      assert reference_accepts(tables, tokens) == ok, data


def test_masks_equal_tables_without_counted_chains(compiled, plain, index, gemma_vocab):
  """From documents cut at random (inside a host or a name, past the other key), both
  tables allow the same tokens, then along random allowed tokens."""
  tables, _ = compiled
  rng = random.Random("walks")
  eos = set(gemma_vocab.eos_ids)
  docs = [d for d in _documents(rng) if _valid(d)]
  compared = 0
  for _ in range(12):
    data = _text(rng.choice(docs))
    tokens = index.random_tokenization(data, rng)
    tokens = tokens[:rng.randrange(len(tokens) // 2, len(tokens))]
    a = (int(tables.start[0]), (), zero_registers(tables))
    b = (int(plain.start[0]), (), zero_registers(plain))
    for step in range(len(tokens) + 4):
      mask = reference_allowed(tables, *a)
      if step >= len(tokens) - 2:  # The last tokens of the prefix, then the walk.
        np.testing.assert_array_equal(mask, reference_allowed(plain, *b))
        compared += 1
      choices = np.flatnonzero(mask)
      choices = choices[~np.isin(choices, list(eos))]
      if step < len(tokens):
        token = tokens[step]
      elif len(choices):
        token = int(rng.choice(choices.tolist()))
      else:
        break
      a = reference_step_stack(tables, *a[:2], token, a[2])
      b = reference_step_stack(plain, *b[:2], token, b[2])
      assert a is not None and b is not None
  assert compared >= 40
