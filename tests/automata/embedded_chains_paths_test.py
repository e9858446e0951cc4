"""Path graphs ending in a counted run (`_embedded_chains._path_repeat`): a
`propertyNames` pattern such as `^[a-z][a-z0-9_]{0,31}$` reaches the compiler as an
`ir.Graph` (the pattern intersected with JSON strings), one path whose tail is the run.

A character of the chain's class right before it (an e-mail host name) joins the chain
as its first position (`_embedded_chains._headed_chain`).

Oracles: `jsonschema` and `re.fullmatch` on keys and host names of every length up to
the bound + 1 under random tokenizations, plain composition (allowed sets along random
walks), the path's own language by enumeration, and the device step (jax) against the
numpy reference walk.
"""

import itertools
import json
import random
import re

import jax
import jsonschema
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _embedded_chains as ec
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.testing import _reference as ref

_EXTRA = [b"ab", b"abc", b"a_9", b"abcdefgh", b'"x', b'":', b'":1', b'a":', b',"', b'{"',
          b'{"ab', b"z9", b"_", b'1,"', b"ZZ"]


@pytest.fixture(scope="module")
def vocab():
  tokens = [bytes([b]) for b in range(256)] + _EXTRA + [None]
  return cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])


# (pattern, characters the random keys draw from, longest key the pattern allows)
_PATTERNS = [
    ("^[a-z][a-z0-9_]{0,31}$", "ab_9zZ-", 32),
    ("^[a-z][a-z0-9_]{3,20}$", "abz_09Y", 21),
    ("^x[a-z][a-z0-9]{0,12}$", "xab9_", 14),
]


def _schema(pattern: str) -> dict:
  return {"type": "object", "propertyNames": {"pattern": pattern},
          "additionalProperties": {"type": "integer"}, "maxProperties": 3}


def _path_graphs(node: ir.Node) -> list[ir.Graph]:
  found, seen, stack = [], set(), [node]
  while stack:
    n = stack.pop()
    if id(n) not in seen:
      seen.add(id(n))
      if isinstance(n, ir.Graph) and ec._path_repeat(n) is not None:  # pylint: disable=protected-access
        found.append(n)
      stack.extend(ir.children(n))
  return found


@pytest.mark.parametrize("pattern,alphabet,longest", _PATTERNS)
def test_property_names_run_is_counted_and_matches_jsonschema(pattern, alphabet, longest,
                                                              compilers, vocab):
  schema = _schema(pattern)
  assert _path_graphs(cd.JsonSchema(schema).to_ir()), "the key is no path graph any more"
  tables = compilers[0].compile(cd.JsonSchema(schema))
  assert tables.token_counts.shape[0] >= 1, "the run was not counted"
  validator = jsonschema.Draft202012Validator(schema)
  index = ref.TokenIndex(vocab)
  rng = random.Random(11)
  for length in itertools.chain(range(longest + 2), (longest, longest + 1) * 6):
    for _ in range(3):
      key = "".join(rng.choice(alphabet) for _ in range(length))
      if rng.random() < 0.5 and length:  # Often a key whose head the pattern accepts.
        head = "x" + rng.choice("ab") if pattern.startswith("^x") else rng.choice("abz")
        key = (head + key[len(head):])[:length]
      value = {key: 1}
      if rng.random() < 0.3:
        value["q" + key[1:]] = 2
      text = json.dumps(value, separators=(",", ":"))
      tokens = index.random_tokenization(text.encode(), rng)
      expected = validator.is_valid(value)
      assert expected == all(re.search(pattern, k) for k in value)
      assert ref.reference_accepts(tables, tokens) == expected, text


@pytest.mark.parametrize("pattern", [p for p, _, _ in _PATTERNS])
def test_property_names_run_equals_plain_composition(pattern, compilers, vocab):
  counted = compilers[0].compile(cd.JsonSchema(_schema(pattern)))
  plain = compilers[1].compile(cd.JsonSchema(_schema(pattern)))
  assert counted.token_counts.shape[0] >= 1 and plain.token_counts.shape[0] == 0
  ref.assert_same_walks(counted, plain, vocab.eos_ids, walks=120, max_steps=60)


_A, _B, _C = (ir.CharClass(((97, 99),)), ir.CharClass(((48, 57), (97, 122))),
              ir.CharClass(((120, 120),)))


def _accepts(graph: ir.Graph, text: str) -> bool:
  states = {0}
  for ch in text:
    states = {b for a, label, b in graph.arcs if a in states
              and any(lo <= ord(ch) <= hi for lo, hi in label.ranges)}
  return bool(states & set(graph.finals))


def _graph(labels, finals, order=None) -> ir.Graph:
  """The path 0 -> ... reading `labels`; `order` renumbers its states."""
  n = len(labels) + 1
  order = list(range(n)) if order is None else order
  return ir.Graph(n, tuple((order[j], lab, order[j + 1]) for j, lab in enumerate(labels)),
                  tuple(sorted(order[f] for f in finals)))


@pytest.mark.parametrize("labels,finals,order", [
    ([_A] + [_B] * 6, range(1, 8), None),
    ([_C, _A] + [_B] * 5, range(4, 8), None),
    ([_B] * 5, range(0, 6), None),
    ([_A] + [_B] * 6, range(3, 8), [0, 5, 2, 7, 1, 3, 6, 4]),
    ([_A, _B, _A, _B, _B], range(3, 6), None),
])
def test_path_repeat_language_equals_the_graph(labels, finals, order):
  graph = _graph(labels, list(finals), order)
  head, run = ec._path_repeat(graph)  # pylint: disable=protected-access
  pattern = "".join(map(_regex_of, head + [run]))
  for text in ("".join(t) for k in range(len(labels) + 2)
               for t in itertools.product("ax0", repeat=k)):
    assert bool(re.fullmatch(pattern, text)) == _accepts(graph, text), (pattern, text)


def _regex_of(node: ir.Node) -> str:
  if isinstance(node, ir.Repeat):
    return f"(?:{_regex_of(node.node)}){{{node.min},{node.max}}}"
  return "[" + "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}"
                       for lo, hi in node.ranges) + "]"


@pytest.mark.parametrize("graph", [
    _graph([_A] + [_B] * 6, [1, 3, 5, 7]),        # finals not one run to the end
    _graph([_A] + [_B] * 6, [0, 7]),              # a final in the head
    _graph([_A, _B], [1, 2]),                     # a run of one: nothing to count
    ir.Graph(3, ((0, _A, 1), (0, _B, 2)), (1, 2)),  # branching
    ir.Graph(3, ((0, _A, 1), (1, _B, 1), (1, _B, 2)), (2,)),  # a loop
])
def test_path_repeat_refuses_other_graphs(graph):
  assert ec._path_repeat(graph) is None  # pylint: disable=protected-access


# A head of the chain's class right before it (`_headed_chain`): e-mail's host name.
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9]|[-.][A-Za-z0-9]){0,31}"
_HEADED = [r"[a-z]+@" + _HOST, r'\[("[a-z0-9][a-z0-9]{2,12}",)*\]',
           r'(a[A-Za-z0-9][A-Za-z0-9]{0,9}!)+']


@pytest.mark.parametrize("pattern", _HEADED)
def test_headed_chain_equals_plain_composition(pattern, compilers, vocab):
  counted = compilers[0].compile(cd.Regex(pattern))
  plain = compilers[1].compile(cd.Regex(pattern))
  assert counted.token_counts.shape[0] >= 1 and plain.token_counts.shape[0] == 0
  ref.assert_same_walks(counted, plain, vocab.eos_ids, walks=120, max_steps=60)


def test_headed_host_name_matches_re_at_every_length(compilers, vocab):
  pattern = _HEADED[0]
  tables = compilers[0].compile(cd.Regex(pattern))
  index = ref.TokenIndex(vocab)
  rng = random.Random(5)
  for units in itertools.chain(range(35), (31, 32, 33) * 8):
    for _ in range(3):
      # Mostly valid units; a first unit `-b` or `.c` (no label starts with them), a
      # stray `-` or `_` now and then.
      units_of = ["a", "Z", "9", "-b", ".c"] + (["-", "_"] if rng.random() < 0.3 else [])
      host = "".join(rng.choice(units_of if j else ["a", "Z", "9", "-b", ".c"])
                     for j in range(units))
      text = "ab@" + host
      tokens = index.random_tokenization(text.encode(), rng)
      assert ref.reference_accepts(tables, tokens) == bool(re.fullmatch(pattern, text)), text


def test_headed_chain_device_step_agrees_with_reference(compilers, vocab):
  tables = compilers[0].compile(cd.Regex(_HEADED[0]))
  index = ref.TokenIndex(vocab)
  rng = random.Random(2)
  step = jax.jit(cd.advance)
  for text in ["ab@" + "a" * 32, "ab@Z-b.c9", "ab@a" + "-b" * 31, "ab@abcdefgh.c"]:
    tokens = index.random_tokenization(text.encode(), rng)
    states, ok = ref.reference_walk(tables, tokens)
    state = cd.init_state(tables, batch_size=1)
    for token, expected in zip(tokens, states):
      allowed = np.asarray(cd.allowed_tokens(tables, state))[0]
      np.testing.assert_array_equal(
          allowed, ref.reference_allowed(tables, int(state.state[0]), ()))
      state = step(tables, state, np.array([token], np.int32))
      assert int(state.state[0]) == expected
    assert ok == bool(re.fullmatch(_HEADED[0], text))
