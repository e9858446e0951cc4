"""The per-vocabulary byte arrays shared by the register passes, against per-token oracles.

`_joined.joined` (all token bytes in one buffer) against slicing each token back
out; `_registers._tokens_with` (which tokens hold a byte of a set, memoized per
vocabulary and set) against a per-token scan, over edge cases (no tokens, None and b""
tokens, a byte vocabulary, long tokens) and several sets on one vocabulary (the memo
must not answer one set with another's result, nor one vocabulary with another's);
`_unique_strings._hash_tokens` (now on the shared buffer) against `hash_of` per token;
the `Vocabulary` fingerprint (which builds the buffer) against its formula.
"""

import hashlib
import random

import numpy as np
import pytest

from constrained_decoding import Vocabulary
from constrained_decoding.automata import _registers, _unique_strings
from constrained_decoding.vocab import _joined, _vocabulary

# pylint: disable=protected-access

_BYTE_VOCAB = tuple(bytes([b]) for b in range(256))


def _vocabularies():
  rng = random.Random(7)
  long_tokens = tuple(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 70)))
                      for _ in range(200))
  return {
      "empty": (),
      "all_none": (None, None, b""),
      "bytes": _BYTE_VOCAB,
      "mixed": (None, b"", b'"', b'a"b', None, b"\x00\xff", b"}", b'","', b"xyz") * 3,
      "long": long_tokens,
  }


def _scan(token_bytes, wanted) -> list[bool]:
  return [any(wanted[b] for b in (t or b"")) for t in token_bytes]


@pytest.mark.parametrize("name", sorted(_vocabularies()))
def test_joined_slices_give_back_each_token(name):
  token_bytes = _vocabularies()[name]
  data, starts, ends = _joined.joined(token_bytes)
  assert data.dtype == np.uint8 and len(starts) == len(ends) == len(token_bytes)
  assert [data[s:e].tobytes() for s, e in zip(starts.tolist(), ends.tolist())] == [
      t or b"" for t in token_bytes]
  assert _joined.joined(token_bytes)[0] is data  # One buffer per vocabulary object.


@pytest.mark.parametrize("name", sorted(_vocabularies()))
def test_tokens_with_equals_scan_for_several_sets(name):
  token_bytes = _vocabularies()[name]
  rng = np.random.default_rng(len(name))
  sets = [np.zeros(256, bool), np.ones(256, bool)]
  for size in (1, 3, 40, 200):
    wanted = np.zeros(256, bool)
    wanted[rng.choice(256, size, replace=False)] = True
    sets.append(wanted)
  quote = np.zeros(256, bool)
  quote[[ord('"'), ord("}")]] = True
  sets.append(quote)
  for _ in range(2):  # The second round answers from the memo.
    for wanted in sets:
      got = _registers._tokens_with(token_bytes, wanted)
      assert got.dtype == bool and got.tolist() == _scan(token_bytes, wanted)


def test_tokens_with_tells_vocabularies_apart():
  """Two vocabularies asked the same set each get their own answer (the memo keeps the
  object, so a freed vocabulary's id reused by a new one is not taken for it)."""
  wanted = np.zeros(256, bool)
  wanted[ord("a")] = True
  for i in range(12):  # More vocabularies than the memo keeps; ids get reused.
    token_bytes = tuple([b"a"] * i + [b"b"] * (12 - i))
    assert _registers._tokens_with(token_bytes, wanted).tolist() == _scan(token_bytes,
                                                                          wanted)


def test_tokens_with_on_bytes_is_the_set_itself():
  wanted = np.zeros(256, bool)
  wanted[[0, 34, 125, 255]] = True
  assert np.array_equal(_registers._tokens_with(_BYTE_VOCAB, wanted), wanted)


@pytest.mark.parametrize("name", sorted(_vocabularies()))
def test_hash_tokens_equal_hash_of_each_token(name):
  token_bytes = _vocabularies()[name]
  got = _unique_strings._hash_tokens(token_bytes)
  assert got.shape == (len(token_bytes), 4)
  assert got.tolist() == [list(_unique_strings.hash_of(t or b"")) for t in token_bytes]


def test_vocabulary_fingerprint_joins_for_the_compiler():
  """The fingerprint hashes (header, per-token lengths with -1 for None, all bytes) as
  before the shared buffer, and leaves the joined bytes ready for the first compile."""
  token_bytes = [b"a", None, b"", b"bc", b"\xff" * 40]
  vocab = Vocabulary.from_token_bytes(token_bytes, eos_ids=[0], vocab_size=7)
  h = hashlib.sha256(f"v{_vocabulary.FORMAT_VERSION}|7|(0,)|5|".encode())
  h.update(np.array([1, -1, -1, 2, 40], np.int64).tobytes())
  h.update(b"abc" + b"\xff" * 40)
  assert vocab.fingerprint == h.hexdigest()
  assert _joined._JOINED[id(vocab.token_bytes)][0] is vocab.token_bytes
