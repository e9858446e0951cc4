"""The host side every driver shares (`sampling/_host.py`): padding and completions."""

import dataclasses

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.sampling import _host


@dataclasses.dataclass(frozen=True)
class _Encoder:
  """Just enough of a model for `encode_prompts`: text -> bytes, BOS 0 first."""

  bos: bool = True

  def encode(self, text: str) -> list[int]:
    return ([0] if self.bos else []) + list(text.encode())


@pytest.mark.parametrize("longest, width", [(1, 16), (16, 16), (17, 32), (100, 128)])
def test_prompt_width_is_a_power_of_two_of_at_least_16(longest, width):
  assert _host.prompt_width([[1] * longest, [2]]) == width


def test_left_pad_puts_each_prompt_at_the_right_end():
  tokens, lengths = _host.left_pad([[5, 6, 7], [9]], 4)
  np.testing.assert_array_equal(tokens, [[0, 5, 6, 7], [0, 0, 0, 9]])
  np.testing.assert_array_equal(lengths, [3, 1])
  assert tokens.dtype == np.int32 and lengths.dtype == np.int32


def test_encode_prompts_takes_text_and_ids():
  assert _host.encode_prompts(_Encoder(), ["ab", [7, np.int64(8)]]) == [[0, 97, 98], [7, 8]]
  assert _host.encode_prompts(_Encoder(), "a") == [[0, 97]]
  with pytest.raises(ValueError, match=r"Prompt 1 has no tokens\. Expected at least one"):
    _host.encode_prompts(_Encoder(bos=False), ["a", ""])


def test_completion_cuts_at_the_first_end_of_sequence(byte_vocab):
  eos = byte_vocab.eos_ids[0]
  done = _host.completion(byte_vocab, [104, 105, eos, 120], False, cd.Regex("hi"), 0)
  assert done == cd.Completion(token_ids=(104, 105), text="hi", finished=True, error=False,
                               value="hi")
  cut = _host.completion(byte_vocab, [104, 105], False, cd.Regex("hi"), 0)
  assert (cut.text, cut.finished, cut.value) == ("hi", False, None)
  wrong = _host.completion(byte_vocab, [104, eos], True, cd.Regex("hi"), 0)
  assert (wrong.error, wrong.value) == (True, None)
  rows = _host.completions(byte_vocab, np.array([[49, eos], [50, 51]]), np.array([False] * 2),
                           [cd.Json(1), None])
  assert [(r.text, r.value, r.finished) for r in rows] == [("1", 1, True), ("23", None, False)]
