"""`string_except`: exactly the canonical JSON strings whose value is not excluded.

Oracle: a product walk of its byte DFA with the DFA of all canonical JSON strings,
tracking whether the bytes read so far still spell a prefix of an excluded string's
canonical encoding. The languages must differ exactly on the excluded strings.
"""

import collections
import json

import pytest

from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_values as jv

_ANY_CANONICAL = ir.concat(ir.Bytes(b'"'), ir.repeat(jv._ANY_CANONICAL_CHAR, 0, None),  # pylint: disable=protected-access
                           ir.Bytes(b'"'))


def _first_difference(dfa, everything, excluded: set[bytes]) -> bytes | None:
  """A string on which `dfa` differs from `everything` minus `excluded`, or None."""
  prefixes = {e[:k] for e in excluded for k in range(len(e) + 1)}
  # (state of dfa, state of everything, bytes read if still a prefix of an excluded
  # string else None); any word reaching the state serves as a witness.
  start = (dfa.start, everything.start, b"")
  witness = {start: b""}
  queue = collections.deque([start])
  while queue:
    x, y, spelled = key = queue.popleft()
    got = x >= 0 and bool(dfa.accepting[x])
    want = y >= 0 and bool(everything.accepting[y]) and spelled not in excluded
    if got != want:
      return witness[key]
    for b in range(256):
      nx = int(dfa.transitions[x, b]) if x >= 0 else -1
      ny = int(everything.transitions[y, b]) if y >= 0 else -1
      if nx < 0 and ny < 0:
        continue
      longer = None if spelled is None else spelled + bytes([b])
      nxt = (nx, ny, longer if longer in prefixes else None)
      if nxt not in witness:
        witness[nxt] = witness[key] + bytes([b])
        queue.append(nxt)
  return None


@pytest.mark.parametrize("texts", [
    [], [""], ["Final Answer", "Solution"], ["a", "ab", "abc"], ["é", "e\u0301"],
    ["\n", '"', "\\", "a\"b\\c\u0001"], ["\u2603\U0001d11e", "\U0001d11ex"],
    ["name", "class", "life", "mana", "equipment", "n"], ["\x7f", " ", "~"],
])
def test_string_except_is_the_exact_complement(texts):
  dfa = compile_byte_dfa(jv.string_except(texts))
  everything = compile_byte_dfa(_ANY_CANONICAL)
  excluded = {json.dumps(t, ensure_ascii=False).encode() for t in texts}
  assert _first_difference(dfa, everything, excluded) is None
  for t in texts:
    assert not dfa.accepts(json.dumps(t, ensure_ascii=False).encode())
  assert dfa.accepts(json.dumps("".join(texts) + "Z", ensure_ascii=False).encode())
