"""`string_except`: exactly the JSON strings whose value is not excluded, canonical ones
and surrogate pair escapes where they cannot spell an excluded value.

Oracle: a product walk of its byte DFA with the DFA of all canonical JSON strings (plus
surrogate pair escapes), tracking whether the bytes read so far still spell a prefix of
one of the excluded strings' spellings (canonical, each character above U+FFFF as UTF-8
or as a pair). The languages must differ on the excluded strings and, where the byte DFA
rejects, only on strings with a surrogate pair escape (a narrowing: a pair is taken only
where the trie of excluded strings continues with no character above U+FFFF).
"""

import collections
import itertools
import json
import re

import pytest

from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_values as jv

_ANY_STRING = ir.concat(ir.Bytes(b'"'), ir.repeat(jv._ANY_KEY_CHAR, 0, None),  # pylint: disable=protected-access
                        ir.Bytes(b'"'))
_PAIR = re.compile(rb"\\u[dD][89abAB]")


def _spellings(text: str) -> set[bytes]:
  """`text` as a JSON string, each character above U+FFFF as UTF-8 or as a pair."""
  parts = [[json.dumps(c, ensure_ascii=False)[1:-1]] + ([json.dumps(c)[1:-1]] if ord(c) > 0xFFFF
                                                       else []) for c in text]
  return {('"' + "".join(p) + '"').encode() for p in itertools.product(*parts)}


def _first_difference(dfa, everything, excluded: set[bytes]) -> bytes | None:
  """A string on which `dfa` differs from `everything` minus `excluded` other than by
  rejecting a string with a pair escape, or None."""
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
    if got != want and (got or not _PAIR.search(witness[key])):
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
    ["\U0001F600", "a\U0001F600b", "\U00010000\U0010FFFF"],
    ["name", "class", "life", "mana", "equipment", "n"], ["\x7f", " ", "~"],
])
def test_string_except_is_the_exact_complement(texts):
  dfa = compile_byte_dfa(jv.string_except(texts))
  everything = compile_byte_dfa(_ANY_STRING)
  excluded = set().union(*(_spellings(t) for t in texts))
  assert _first_difference(dfa, everything, excluded) is None
  for t in texts:
    assert not any(dfa.accepts(e) for e in _spellings(t))
  assert dfa.accepts(json.dumps("".join(texts) + "Z", ensure_ascii=False).encode())
  left = json.dumps("".join(texts) + "Z", ensure_ascii=False)[:-1] + '\\ud83d\\ude00"'
  assert dfa.accepts(left.encode())  # Out of the trie: pairs too.
