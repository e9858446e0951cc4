"""States inside a surrogate pair escape of a JSON key (`{"\\uD800\\uDC0`): exact, cheap.

Such a state reads one hex digit back into the key's string-body loop. `_near_loop.py`
once paired it with a loop state that lacks the uppercase hex digits (keys' escapes in
the loop are `\\u00XX`), so every token led by `A`-`F` became an explicit edge (6,519
with Gemma 3). It now takes `_wide.py`'s entry terminal. Oracle: the same byte DFA
composed without any terminal (every token an explicit edge), on a small vocabulary.
"""

import random

import numpy as np

import constrained_decoding as cd
from constrained_decoding.automata import _compose
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _loops

from near_loop_test import _token_map  # pylint: disable=g-bad-import-order

SCHEMA = {"type": "object", "additionalProperties": {"type": "string"},
          "properties": {"ab": {"const": 1}}}


def _vocab():
  rng = random.Random(1)
  alphabet = 'ABCDEFabcdef0129xyz"\\u:{},'
  pieces = {bytes(rng.choice(alphabet.encode()) for _ in range(rng.randint(2, 5)))
            for _ in range(400)}
  pieces |= {b"\\uD800", b"\\uDC0", b"\\uDC", b"D800", b"Abc", b'A"', b'Fx":'}
  tokens = [bytes([b]) for b in range(256)] + sorted(pieces) + [None]
  return cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])


def _state_after(dfa, data: bytes) -> int:
  state = dfa.start
  for byte in data:
    state = int(dfa.transitions[state, byte])
  return state


def test_surrogate_escape_states_take_entry_terminals(monkeypatch):
  monkeypatch.setattr(_loops, "MIN_TERMINAL_TOKENS", 8)
  vocab = _vocab()
  compiler = cd.Compiler(vocab, cd.CompileOptions(cache_dir=None))
  dfa = _fsa.compile_byte_dfa(cd.JsonSchema(SCHEMA).to_ir())
  num_words = -(-vocab.vocab_size // 32)
  with_terminals = _compose.compose_token_dfa(
      dfa, compiler.trie, wide=compiler.wide_states.find(dfa), num_words=num_words)
  plain = _compose.compose_token_dfa(dfa, compiler.trie, num_words=num_words)
  assert _token_map(with_terminals) == _token_map(plain)
  for prefix in (b'{"\\uD800\\uDC0', b'{"ab":1,"\\uD800\\uDC0'):
    p = _state_after(dfa, prefix)
    assert with_terminals.state_terminals[p, 0, 0] >= 0
    explicit = with_terminals.edge_token[with_terminals.edge_source == p]
    led_by_upper_hex = [t for t in explicit.tolist()
                        if vocab.token_bytes[t][:1] in b"ABCDEF" and len(vocab.token_bytes[t]) > 1
                        and all(c in b"0123456789ABCDEFabcdefxyz" for c in vocab.token_bytes[t])]
    # Tokens that stay in the key body (`Abc`) are terminal, not explicit.
    assert not led_by_upper_hex, [vocab.token_bytes[t] for t in led_by_upper_hex]
    assert np.isin(explicit, plain.edge_token[plain.edge_source == p]).all()
