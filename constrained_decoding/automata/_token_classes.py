"""Token classes of the token-level terminal labels (Sec. 2.5.1): which tokens they hold.

A class is defined by the bytes of its tokens, so its bitmap is found by walking the
vocabulary trie with a small byte DFA; tokens without bytes (control, unknown, unused,
end of sequence) are not in the trie and so in no class.

  TEXT_TOKEN       tokens whose bytes are non-empty, valid UTF-8 (whole characters).
  PARAGRAPH_TOKEN  text tokens without the byte `\\n`.

Public functions:
  class_bits(trie, name, num_words)  uint32 `[W]`: the tokens of class `name`.
"""

import functools

import numpy as np

from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._detokenizer import VocabTrie
from constrained_decoding.constraints import _ir as ir

# The characters a token of each class is made of (one or more of them).
_CLASS_CHARS = {
    "TEXT_TOKEN": ((0, ir.MAX_CODE_POINT),),
    "PARAGRAPH_TOKEN": ((0, 0x09), (0x0B, ir.MAX_CODE_POINT)),
}
assert set(_CLASS_CHARS) == set(ir.TOKEN_CLASSES)


@functools.cache
def _class_dfa(name: str) -> ByteDfa:
  """The byte DFA of the token strings of class `name`: one or more of its characters."""
  # Imported here: importing the package must not need pynini (decoding-only installs).
  from constrained_decoding.automata import _fsa  # pylint: disable=g-import-not-at-top

  return _fsa.compile_byte_dfa(ir.repeat(ir.char_class(_CLASS_CHARS[name]), 1, None))


def class_bits(trie: VocabTrie, name: str, num_words: int) -> np.ndarray:
  """uint32 `[num_words]`: the tokens whose bytes the class `name` accepts.

  One level-by-level walk of the whole trie (about 0.1 s for Gemma's 262k tokens); the
  caller caches the result per vocabulary (`_wide.WideStates.token_class_bits`).

  Raises:
    ValueError: `name` is not one of `ir.TOKEN_CLASSES`.
  """
  if name not in _CLASS_CHARS:
    raise ValueError(f"Token class {name!r} is unknown. Expected one of {ir.TOKEN_CLASSES}.")
  dfa = _class_dfa(name)
  accepted = np.zeros(trie.num_nodes, bool)
  node = np.zeros(1, np.int32)
  state = np.full(1, dfa.start, np.int32)
  while len(node):
    pair, slot = trie.child_slots(node)
    nxt = dfa.transitions[state[pair], trie.child_byte[slot]]
    keep = np.nonzero(nxt != NO_STATE)[0]
    node, state = trie.child_node[slot[keep]], nxt[keep]
    accepted[node] = dfa.accepting[state]
  token_node = np.repeat(np.arange(trie.num_nodes), np.diff(trie.token_start))
  tokens = trie.token_ids[accepted[token_node]].astype(np.int64)
  bits = np.zeros(num_words, np.uint32)
  np.bitwise_or.at(bits, tokens >> 5, np.uint32(1) << (tokens & 31).astype(np.uint32))
  return bits
