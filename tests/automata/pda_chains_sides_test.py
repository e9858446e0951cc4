"""Escapes inside counted strings of push-down tables: sides found byte by byte.

A `maxLength` string's characters `[^"\\]` are a counted chain (`_pda_chains`); an
escape `\\n` or `\\u00e9` is one character of it too. The state after its `\\` (d = 1:
`n` ends the escape at the next position, `u` starts `\\uXXXX` and is walked) and those
after `\\u`, `\\uX`, `\\uXX` (d = 4, 3, 2 hex digits to go) count the tokens that go on
in the string (`FirstIn` with `later`), instead of ~6,000 explicit edges each with Gemma
3 (where their terminals pay, `_pda_chains._MARGIN`; here all of them). Oracles: `jsonschema` on strings of n and n + 1 characters written with escapes,
under random tokenizations, and on random walks of the tables started inside escapes.
"""

import json
import random

import jsonschema
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _pda_chains
from constrained_decoding.testing import TokenIndex, reference_accepts, reference_allowed
from constrained_decoding.testing import reference_end_allowed, reference_step_stack
from constrained_decoding.testing._reference import zero_registers

SCHEMA = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 9}}}
# Characters written as escapes (`json.dumps`: \n, \", \\, \u00e9 with ensure_ascii)
# or plainly; words whose tokens run on after an escape (`\nabc`, `\u00e9tude`).
_PIECES = ["a", "Z", "7", " ", "é", "\n", '"', "\\", "\t", "中", "abc", "étude", "ff"]


def compile_spying_chains(vocab, schema, options, **patches):
  """(tables of `schema` under `free_form_depth=None`, the chains `find_chains`
  returned while compiling it), with the `_pda_chains` attributes in `patches` set."""
  found = []
  real = _pda_chains.find_chains

  def spy(*args, **kwargs):
    found.extend(real(*args, **kwargs))
    return found

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(_pda_chains, "find_chains", spy)
    for name, value in patches.items():
      patch.setattr(_pda_chains, name, value)
    tables = cd.Compiler(vocab, options).compile(cd.JsonSchema(schema, free_form_depth=None))
  return tables, list(found)


def _compile(vocab, margin: float):
  """(tables, the chains `find_chains` returned), with sides kept where they save
  `margin` times their terminal's bytes (0: all of them)."""
  # (No disk cache: the sub-tries of the sides' walks are built here.)
  return compile_spying_chains(vocab, SCHEMA, cd.CompileOptions(memoize=False, cache_dir=None),
                               _MARGIN=margin)


@pytest.fixture(scope="module", name="compiled")
def fixture_compiled(gemma_vocab):
  """Every side counted (a string this short pays for none of their terminals)."""
  return _compile(gemma_vocab, 0)


@pytest.fixture(scope="module", name="index")
def fixture_index(gemma_vocab):
  return TokenIndex(gemma_vocab)


def _valid(doc) -> bool:
  return jsonschema.Draft202012Validator(SCHEMA).is_valid(doc)


def _notes(rng: random.Random) -> list[str]:
  """Strings of 8, 9 and 10 characters (around maxLength 9) made of `_PIECES`."""
  out = []
  for length in (1, 8, 9, 10) * 6:
    text = ""
    while len(text) < length:
      text += rng.choice(_PIECES)
    out.append(text[:length])
  return out


def test_escape_states_are_sides(compiled, gemma_vocab):
  tables, chains = compiled
  (chain,) = [c for c in chains if len(c.states) == 10]  # p_0..p_9
  kinds = [h for _, _, h in chain.sides if isinstance(h, _pda_chains.FirstIn)]
  depths = {h.depth for h in kinds}
  assert {1, 2, 3, 4} <= depths
  # After `\\`: `n`, `t`, `/`, ... count on, `u` is walked.
  assert any(h.depth == 1 and h.others == (ord("u"),) for h in kinds)
  # Counted, they replace most explicit edges; by default none pays here.
  default, _ = _compile(gemma_vocab, _pda_chains._MARGIN)
  assert int(tables.edge_start[-1]) * 2 < int(default.edge_start[-1])


def test_lengths_with_escapes_agree_with_jsonschema(compiled, index):
  tables, _ = compiled
  rng = random.Random("escapes")
  docs = [{"note": note} for note in _notes(rng)]
  verdicts = [_valid(d) for d in docs]
  assert 5 <= sum(verdicts) <= len(docs) - 5
  for doc, ok in zip(docs, verdicts):
    for ascii_only in (False, True):
      data = json.dumps(doc, ensure_ascii=ascii_only, separators=(",", ":")).encode()
      for tokens in (index.random_tokenization(data, rng), index.longest_tokenization(data)):
        assert reference_accepts(tables, tokens) == ok, data


# One token each with Gemma 3: short of the escape's hex digits, so walked.
_SHORT = {"\\": ["n", "u"], "\\u": ["0", "ab", "add"], "\\u0": ["0", "ff", "fed"],
          "\\u00": ["e", "a"]}


def test_random_walks_from_inside_escapes_validate(compiled, index, gemma_vocab):
  """Walks started after `\\`, `\\u`, `\\u0` or `\\u00` at several counts, then random
  allowed tokens (closing tokens once long): every text ends as a valid document. Where
  the escape leaves room, its short continuations (`n`, `u`; `0`, `ab`: fewer hex
  digits than the escape needs) are allowed first."""
  tables, _ = compiled
  rng = random.Random("walks")
  eos = set(gemma_vocab.eos_ids)
  closing = {t for t, b in enumerate(gemma_vocab.token_bytes) if b in (b'"', b'"}', b"}")}
  for before in ("", "abc", "abcdefg", "abcdefgh"):
    for escape in ("\\", "\\u", "\\u0", "\\u00"):
      head = f'{{"note":"{before}{escape}'.encode()
      tokens = index.random_tokenization(head, rng)
      state, stack, registers = int(tables.start[0]), (), zero_registers(tables)
      for token in tokens:
        state, stack, registers = reference_step_stack(tables, state, stack, token,
                                                       registers)
      data = head
      mask = reference_allowed(tables, state, stack, registers)
      room = 9 - len(before)
      for word in _SHORT[escape] if room >= 1 else ():
        (token,) = index.longest_tokenization(word.encode())
        assert mask[token], (head, word)
      for step in range(40):
        if reference_end_allowed(tables, state, stack):
          break
        allowed = np.flatnonzero(reference_allowed(tables, state, stack, registers))
        allowed = [t for t in allowed.tolist() if t not in eos]
        assert allowed, data
        ends = [t for t in allowed if t in closing]
        token = rng.choice(ends if step > 6 and ends else allowed)
        state, stack, registers = reference_step_stack(tables, state, stack, token,
                                                       registers)
        data += gemma_vocab.token_bytes[token]
      jsonschema.validate(json.loads(data.decode()), SCHEMA)


def test_two_character_chain_agrees_with_jsonschema(gemma_vocab, index):
  """A two-letter code (`minLength` = `maxLength` = 2) is a chain of two positions:
  codes of 1, 2 and 3 characters (escapes and multi-byte ones too) against `jsonschema`
  under random tokenizations."""
  schema = {"type": "object",
            "properties": {"cc": {"type": "string", "minLength": 2, "maxLength": 2}}}
  tables, found = compile_spying_chains(gemma_vocab, schema,
                                        cd.CompileOptions(memoize=False))
  assert [len(c.states) for c in found] == [3]  # p_0, p_1, p_2
  rng = random.Random("codes")
  for code in ["U", "US", "USA", "é", "éé", "\\n", "a\\", "中国", "中国人", "", "ab"]:
    doc = {"cc": code, "x": [code]}
    ok = jsonschema.Draft202012Validator(schema).is_valid(doc)
    for ascii_only in (False, True):
      data = json.dumps(doc, ensure_ascii=ascii_only, separators=(",", ":")).encode()
      for tokens in (index.random_tokenization(data, rng), index.longest_tokenization(data)):
        assert reference_accepts(tables, tokens) == ok, data
