"""Tests for the grammar model (`constraints/_grammar.py`) and the `Grammar` spec.

Oracles: hand-written languages for the analyses; for the built-in grammars, `lark`'s
Earley parser on the same grammar in Lark syntax (a "twin", kept here for the GBNF
files). Soundness: random walks through the byte DFA of `Grammar(..., max_depth=3)`
produce strings the twin accepts. Completeness: random strings drawn from the grammar
(`sample_text`, depth-bounded) are accepted by the DFA, and by the twin. Token level:
the arithmetic grammar with the Gemma 3 vocabulary under random tokenizations.
"""

import functools
import random

import lark
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _grammar_depth
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.testing import TokenIndex, reference_walk

# Lark twins of the GBNF built-ins: the same languages, written independently.
JSON_LARK = r"""
start: value
value: object | array | STRING | NUMBER | "true" | "false" | "null"
object: "{" [member ("," member)*] "}"
member: STRING ":" value
array: "[" [value ("," value)*] "]"
STRING: /"([^"\\\x00-\x1f]|\\(["\\\/bfnrt]|u[0-9a-fA-F]{4}))*"/
NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/
%ignore /[ \t\n\r]+/
"""

ARITHMETIC_LARK = r"""
start: expr
expr: term (ADD_OP term)*
term: factor (MUL_OP factor)*
factor: NUMBER | "(" expr ")" | "-" factor
ADD_OP: /[-+]/
MUL_OP: /[*\/]/
NUMBER: /[0-9]+(\.[0-9]+)?/
%ignore /[ \t]+/
"""

SEXPR_LARK = r"""
start: _WS? sexpr _WS?
?sexpr: atom | list
list: "(" _WS? (sexpr (_WS sexpr)* _WS?)? ")"
atom: SYMBOL | KEYWORD | NUMERAL | DECIMAL | HEX | BINARY | STRING | QUOTED_SYMBOL
NUMERAL: /0|[1-9][0-9]*/
DECIMAL: /(0|[1-9][0-9]*)\.[0-9]+/
HEX: /#x[0-9a-fA-F]+/
BINARY: /#b[01]+/
STRING: /"([^"]|"")*"/
SYMBOL: /[a-zA-Z~!@$%^&*_+=<>.?\/-][a-zA-Z0-9~!@$%^&*_+=<>.?\/-]*/
QUOTED_SYMBOL: /\|[^|\\]*\|/
KEYWORD: /:[a-zA-Z~!@$%^&*_+=<>.?\/-][a-zA-Z0-9~!@$%^&*_+=<>.?\/-]*/
_WS: /[ \t\r\n]+/
"""

BUILTINS = ["json", "arithmetic", "sexpr", "sql_select"]


@functools.cache
def _twin(name: str) -> lark.Lark:
  """An Earley parser for built-in `name` (`dynamic_complete` tries every token split)."""
  text = {"json": JSON_LARK, "arithmetic": ARITHMETIC_LARK, "sexpr": SEXPR_LARK}.get(name)
  if text is None:  # The Lark built-in is its own twin.
    text = cd.Grammar.builtin(name).text
  return lark.Lark(text, parser="earley", lexer="dynamic_complete")


def lark_accepts(parser: lark.Lark, data: bytes) -> bool:
  """Whether `parser` parses `data` (UTF-8) whole: the oracle's verdict."""
  try:
    parser.parse(data.decode("utf-8"))
  except lark.exceptions.LarkError:
    return False
  return True


def _twin_accepts(name: str, data: bytes) -> bool:
  return lark_accepts(_twin(name), data)


@functools.cache
def _builtin_dfa(name: str, max_depth: int):
  return compile_byte_dfa(cd.Grammar.builtin(name, max_depth=max_depth).to_ir())


@functools.cache
def _dfa(text: str, syntax: str = "gbnf", max_depth: int | None = None):
  return compile_byte_dfa(cd.Grammar(text, syntax=syntax, max_depth=max_depth).to_ir())


def _random_walk(dfa, rng: random.Random, max_len: int) -> bytes:
  """A random string of the DFA's language, up to about `max_len` bytes.

  Each step picks a successor state uniformly (then a byte leading there), so that a
  bracket competes with a whole class of letters; past a random length it takes the
  quickest way to an accepting state (the DFA is trimmed, so one always exists).
  """
  table, accepting = dfa.transitions, dfa.accepting
  distance = np.where(accepting, 0, 1 << 30)
  while True:  # Bellman-Ford on "bytes to acceptance".
    via = np.where(table >= 0, distance[np.maximum(table, 0)], 1 << 30).min(axis=1) + 1
    updated = np.minimum(distance, via)
    if (updated == distance).all():
      break
    distance = updated
  state, out, length = dfa.start, [], rng.randint(0, max_len)
  while not (len(out) >= length and accepting[state]):
    if accepting[state] and rng.random() < 0.02:
      break
    targets = sorted({int(t) for t in table[state] if t >= 0})
    if len(out) >= length:
      targets = [t for t in targets if distance[t] < distance[state]]
    target = rng.choice(targets)
    byte = rng.choice(np.nonzero(table[state] == target)[0].tolist())
    out.append(byte)
    state = target
  return bytes(out)


def _equivalent(a, b) -> bool:
  """Whether two minimal trimmed DFAs accept the same language (they are isomorphic)."""
  if a.num_states != b.num_states:
    return False
  if a.num_states == 0:
    return True
  mapping = {a.start: b.start}
  queue = [a.start]
  for p in queue:
    q = mapping[p]
    if a.accepting[p] != b.accepting[q]:
      return False
    for byte in range(256):
      p2, q2 = int(a.transitions[p, byte]), int(b.transitions[q, byte])
      if (p2 < 0) != (q2 < 0):
        return False
      if p2 >= 0:
        if mapping.setdefault(p2, q2) != q2:
          return False
        if p2 not in queue:
          queue.append(p2)
  return True


def _has_rule_refs(node: ir.Node) -> bool:
  return bool(_grammar.references(node))


def _g(start: str, **rules) -> _grammar.GrammarIR:
  return _grammar.GrammarIR(start, tuple(rules.items()))


def _lit(text: str) -> ir.Node:
  return ir.Bytes(text.encode())


REF = ir.RuleRef


# --------------------------------------------------------------------------------------
# The grammar model and its analyses.


def test_grammar_ir_is_hashable_and_compares_by_value():
  a = _g("s", s=ir.union(_lit("x"), ir.concat(_lit("("), REF("s"), _lit(")"))))
  b = _g("s", s=ir.union(_lit("x"), ir.concat(_lit("("), REF("s"), _lit(")"))))
  assert a == b and hash(a) == hash(b)
  assert a["s"] == b.rule_map["s"]
  assert a.names == ("s",)


@pytest.mark.parametrize("start, rules, match", [
    ("s", {"s": REF("t")}, "references the undefined rule 't'"),
    ("x", {"s": _lit("a")}, "start rule 'x' is not defined"),
])
def test_grammar_ir_rejects_bad_references(start, rules, match):
  with pytest.raises(errors.GrammarError, match=match):
    _grammar.GrammarIR(start, tuple(rules.items()))


def test_grammar_ir_rejects_duplicate_rules():
  with pytest.raises(errors.GrammarError, match=r"\['s'\] are defined more than once"):
    _grammar.GrammarIR("s", (("s", _lit("a")), ("s", _lit("b"))))


def test_strongly_connected_components_dependencies_first():
  graph = {"a": ("b",), "b": ("c", "a"), "c": ("c",), "d": ("a",), "e": ()}
  components = _grammar.strongly_connected_components(graph)
  assert sorted(components) == [("a", "b"), ("c",), ("d",), ("e",)]
  position = {name: i for i, comp in enumerate(components) for name in comp}
  assert position["c"] < position["a"] < position["d"]


def test_recursive_reachable_nullable_productive_rules():
  g = _g("s",
         s=ir.concat(REF("a"), REF("b")),
         a=ir.union(ir.EPSILON, ir.concat(_lit("x"), REF("a"))),  # Self-recursive.
         b=ir.union(_lit("y"), ir.concat(REF("c"), _lit("z"))),
         c=ir.concat(_lit("["), REF("b"), _lit("]")),  # Mutually recursive with b.
         dead=ir.concat(_lit("!"), REF("dead")),  # Unreachable and unproductive.
         )
  assert _grammar.recursive_rules(g) == {"a", "b", "c", "dead"}
  assert _grammar.reachable_rules(g) == {"s", "a", "b", "c"}
  assert _grammar.nullable_rules(g) == {"a"}
  assert _grammar.productive_rules(g) == {"s", "a", "b", "c"}


def test_normalize_inlines_non_recursive_rules_and_collapses_cycles():
  g = cd.Grammar.builtin("json").grammar_ir()
  assert g.names == ("root", "value")  # object, member, array inlined into value.
  assert _grammar.recursive_rules(g) == {"value"}
  assert _grammar.references(g["root"]) == ("value",)


def test_normalize_ignores_unreachable_and_unproductive_rules():
  g = _g("s", s=ir.union(_lit("a"), REF("loop")), loop=ir.concat(_lit("b"), REF("loop")),
         unused=_lit("c"))
  normal = _grammar.normalize(g)
  assert normal.names == ("s",)
  assert normal["s"] == _lit("a")


def test_unproductive_start_raises():
  g = _g("s", s=ir.concat(_lit("a"), REF("s")))
  with pytest.raises(errors.EmptyConstraintError, match=r"'s' derives no finite string"):
    _grammar.normalize(g)


@pytest.mark.parametrize("text, accepted, rejected", [
    # Immediate left recursion, several alternatives at once.
    ('root ::= root "+" num | root "-" num | num\nnum ::= [0-9]',
     ["1", "1+2", "1-2+3"], ["", "+1", "1+", "12"]),
    # Through a group: root -> (root "," | "[") "x" is root "," "x" | "[" "x".
    ('root ::= ( root "," | "[" ) "x"', ["[x", "[x,x,x"], ["x", "[x,"]),
    # Indirect: a -> b "x" | "y", b -> a "z" | "w"; b is inlined, then a is immediate.
    ('root ::= b "x" | "y"\nb ::= root "z" | "w"', ["y", "wx", "yzx", "wxzx"], ["yz", "x"]),
    # Only left recursion: A -> A x | y is y x* and needs no max_depth.
    ('root ::= root "a" | "b"', ["b", "baaa"], ["a", ""]),
])
def test_left_recursion_is_eliminated(text, accepted, rejected):
  dfa = _dfa(text)  # No max_depth: the grammar became regular.
  for s in accepted:
    assert dfa.accepts(s.encode()), s
  for s in rejected:
    assert not dfa.accepts(s.encode()), s


@pytest.mark.parametrize("text, match", [
    # a and b both keep a cycle of their own, so neither is inlined into the other.
    ('root ::= a\na ::= b "x" | "(" a ")" | "y"\nb ::= a "z" | "[" b "]" | "w"',
     r"'a' -> 'b' -> 'a' are left-recursive"),
    # Left recursion behind a nullable prefix.
    ('root ::= "c"? root "a" | "b"', r"'root' -> 'root' are left-recursive"),
])
def test_non_immediate_left_recursion_raises(text, match):
  with pytest.raises(errors.GrammarRecursionError, match=match):
    cd.Grammar(text, max_depth=3).grammar_ir()


# --------------------------------------------------------------------------------------
# Unrolling and the Grammar spec.

NESTED = 'root ::= "(" root ")" | "x"'  # The start rule itself is recursive.
WRAPPED = 'root ::= "<" inner ">"\ninner ::= "(" inner ")" | "x"'


@pytest.mark.parametrize("text, wrap, max_depth", [
    (NESTED, ("", ""), 1), (NESTED, ("", ""), 3), (WRAPPED, ("<", ">"), 1),
    (WRAPPED, ("<", ">"), 4),
])
def test_max_depth_counts_active_recursive_rules(text, wrap, max_depth):
  dfa = _dfa(text, max_depth=max_depth)
  for n in range(7):
    s = f"{wrap[0]}{'(' * n}x{')' * n}{wrap[1]}"
    assert dfa.accepts(s.encode()) == (n + 1 <= max_depth), s
  assert _grammar_depth.min_depth(cd.Grammar(text).grammar_ir()) == 1


def test_to_ir_is_regular_ir():
  for name in BUILTINS:
    node = cd.Grammar.builtin(name, max_depth=2).to_ir()
    assert not _has_rule_refs(node), name


def test_recursive_grammar_without_max_depth_raises():
  with pytest.raises(errors.UnsupportedFeatureError,
                     match=r"\['root'\] are recursive.*max_depth=N.*push-down runtime"):
    cd.Grammar(NESTED).to_ir()


def test_max_depth_too_small_raises():
  with pytest.raises(errors.GrammarRecursionError,
                     match=r"max_depth=0 leaves no string.*Expected max_depth >= 1"):
    cd.Grammar(NESTED, max_depth=0).to_ir()


def test_cut_keeps_non_recursive_alternatives():
  dfa = _dfa('root ::= "a" | "[" root "]"\n', max_depth=1)
  assert dfa.accepts(b"a") and not dfa.accepts(b"[a]")
  dfa = _dfa('root ::= "<" (inner | "-") ">"\ninner ::= "(" inner ")" | "x"', max_depth=0)
  assert dfa.accepts(b"<->") and not dfa.accepts(b"<x>")


def test_non_recursive_grammar_ignores_max_depth():
  text = 'root ::= greeting " " name\ngreeting ::= "hi" | "hello"\nname ::= [a-z]+'
  assert _equivalent(_dfa(text), _dfa(text, max_depth=0))
  assert _dfa(text).accepts(b"hello bob")


def test_unroll_budget_raises():
  text = 'root ::= "(" root root root root root root ")" | "x"'
  with pytest.raises(errors.CompileBudgetError, match=r"unrolls to \d+ IR nodes"):
    cd.Grammar(text, max_depth=9).to_ir()


# Wrong types raise TypeError; under the tests' type checker (conftest.py) it comes from
# the annotations before __post_init__ runs, hence the alternative in `match`.
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(text=b"root ::= 'a'"), TypeError, "Expected str|parameter 'text'"),
    (dict(text="root ::= \"a\"", syntax="ebnf"), ValueError, "syntax 'ebnf' is not supported"),
    (dict(text="root ::= \"a\"", max_depth=-1), ValueError, "max_depth -1 is invalid"),
    (dict(text="root ::= \"a\"", max_depth=True), ValueError, "max_depth True is invalid"),
    (dict(text="root ::= \"a\"", start=3), TypeError,
     "Expected the name of a rule|parameter 'start'"),
])
def test_grammar_spec_validates_arguments(kwargs, error, match):
  with pytest.raises(error, match=match):
    cd.Grammar(**kwargs)


def test_grammar_spec_is_a_cache_key_and_describes_itself():
  a, b = cd.Grammar.builtin("json", max_depth=2), cd.Grammar.builtin("json", max_depth=2)
  assert a == b and hash(a) == hash(b)
  assert a.grammar_ir() is b.grammar_ir()  # Memoized.
  assert a.describe() == "Grammar(gbnf: 'root   ::= ws value ws', max_depth=2)"


def test_unknown_builtin_raises():
  with pytest.raises(ValueError, match=r"'yaml' does not exist. Expected one of \['arithmetic'"):
    cd.Grammar.builtin("yaml")


def test_start_rule_is_configurable():
  text = 'root ::= "a"\nother ::= "b"'
  assert _dfa(text).accepts(b"a")
  assert compile_byte_dfa(cd.Grammar(text, start="other").to_ir()).accepts(b"b")


def test_grammar_compiles_with_byte_vocabulary(byte_compiler):
  tables = byte_compiler.compile(cd.Grammar.builtin("json", max_depth=2))
  for text, ok in [(b'{"a": [], "b": 2.5e3}', True), (b'[[]]', True), (b'[[1]]', False),
                   (b'{"a" 1}', False)]:
    states, walked = reference_walk(tables, list(text))
    assert (walked and bool(np.asarray(tables.accepting)[states[-1]])) == ok, text


# --------------------------------------------------------------------------------------
# Built-in grammars: soundness and completeness against the Lark twins.


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_parses_and_has_one_recursive_rule(name):
  g = cd.Grammar.builtin(name).grammar_ir()
  assert len(_grammar.recursive_rules(g)) == 1
  assert _twin(name) is not None


@pytest.mark.parametrize("name, walks", [("json", 25), ("arithmetic", 25), ("sexpr", 25),
                                         ("sql_select", 12)])
def test_builtin_random_walks_are_accepted_by_twin(name, walks):
  dfa = _builtin_dfa(name, 3)
  rng = random.Random(f"walk-{name}")
  for _ in range(walks):
    text = _random_walk(dfa, rng, max_len=50)
    assert _twin_accepts(name, text), text


@pytest.mark.parametrize("name, samples, checked", [
    ("json", 100, 20), ("arithmetic", 100, 20), ("sexpr", 100, 20), ("sql_select", 40, 4)])
def test_builtin_random_strings_are_accepted_by_dfa(name, samples, checked):
  g = cd.Grammar.builtin(name).grammar_ir()
  dfa = _builtin_dfa(name, 3)
  rng = random.Random(f"sample-{name}")
  texts = [_grammar_depth.sample_text(g, rng, max_depth=3) for _ in range(samples)]
  for text in texts:
    assert dfa.accepts(text), text
  for text in sorted(texts, key=len)[:checked]:  # The generator itself, against the twin.
    assert _twin_accepts(name, text), text


# (name, text, verdict at max_depth=3): "yes" both accept, "no" both reject, "deep" the
# twin accepts but the text nests deeper than max_depth=3, so the DFA rejects.
VERDICTS = [
    ("json", '{"a": [1, -2.5e+3, "x\\n\\u00e9"], "b": {"c": null}}', "yes"),
    ("json", " true ", "yes"),
    ("json", '{"a": {"b": {}}}', "yes"),
    ("json", '{"a": {"b": {"c": 1}}}', "deep"),
    ("json", "[1,]", "no"),
    ("json", '{"a"}', "no"),
    ("json", "01", "no"),
    ("json", '"\x01"', "no"),
    ("arithmetic", "1 + 2 * (3 - 4.5) / -6", "yes"),
    ("arithmetic", "((1))", "yes"),
    ("arithmetic", "-(2)", "yes"),
    ("arithmetic", "(((1)))", "deep"),
    ("arithmetic", "-(-(2))", "deep"),
    ("arithmetic", "1 +", "no"),
    ("arithmetic", "1 2", "no"),
    ("arithmetic", "1.", "no"),
    ("sexpr", "( )", "yes"),
    ("sexpr", "((a))", "yes"),
    ("sexpr", '(a "b""c" #x1F #b01 1.5 :k |q s|)', "yes"),
    ("sexpr", "(define-fun max2 ((x Int) (y Int)) Int (ite (>= x y) x y))", "deep"),
    ("sexpr", "(a(b))", "no"),
    ("sexpr", "1a", "no"),
    ("sexpr", "(a", "no"),
    ("sql_select", "SELECT * FROM t", "yes"),
    ("sql_select", "select a, count(*) as n from t where a > 1 and not (b is null)"
     " group by a order by n desc limit 10;", "yes"),
    ("sql_select", "SELECT a FROM t JOIN u ON t.id = u.id", "yes"),
    ("sql_select", "SELECT a FROM t WHERE ((a=1))", "yes"),
    ("sql_select", "SELECT a FROM t WHERE (((a=1)))", "deep"),
    ("sql_select", "SELECT FROM t", "no"),
    ("sql_select", "SELECTa FROM t", "no"),
]


@pytest.mark.parametrize("name, text, verdict", VERDICTS)
def test_builtin_verdicts_match_twin(name, text, verdict):
  assert _twin_accepts(name, text.encode()) == (verdict != "no")
  assert _builtin_dfa(name, 3).accepts(text.encode()) == (verdict == "yes")


@pytest.mark.parametrize("name", ["json", "arithmetic", "sexpr"])
def test_gbnf_builtin_equals_its_lark_twin_through_our_lark_front_end(name):
  twin = {"json": JSON_LARK, "arithmetic": ARITHMETIC_LARK, "sexpr": SEXPR_LARK}[name]
  assert _equivalent(_builtin_dfa(name, 2), _dfa(twin, "lark", 2))


# --------------------------------------------------------------------------------------
# Token level, with the real Gemma 3 vocabulary.


def test_arithmetic_with_gemma_vocabulary(gemma_compiler, gemma_vocab):
  spec = cd.Grammar.builtin("arithmetic", max_depth=2)
  tables = gemma_compiler.compile(spec)
  accepting = np.asarray(tables.accepting)
  index = TokenIndex(gemma_vocab)
  rng = random.Random(0)
  g = spec.grammar_ir()
  texts = [_grammar_depth.sample_text(g, rng, max_depth=2) for _ in range(15)]
  texts += [b"1 + 2 * (3 - 4)", b" -7 "]
  for text in texts:
    for _ in range(3):
      states, ok = reference_walk(tables, index.random_tokenization(text, rng))
      assert ok and accepting[states[-1]], text
  for text in [b"1 +", b"((1))", b"(1", b"1 2", b"+1"]:  # ((1)) needs depth 3.
    for _ in range(3):
      states, ok = reference_walk(tables, index.random_tokenization(text, rng))
      assert not (ok and accepting[states[-1]]), text


def _refs_in_order(node: ir.Node) -> tuple[str, ...]:
  """Oracle for `references`: a plain recursive pre-order walk, no sharing, no memo."""
  if isinstance(node, ir.RuleRef):
    return (node.name,)
  out: list[str] = []
  for child in ir.children(node):
    out.extend(r for r in _refs_in_order(child) if r not in out)
  return tuple(out)


def test_references_reuses_answered_sub_nodes_in_first_occurrence_order():
  # `references` answers a sub-node it was asked about before from its memo; the names
  # it then adds must still come in the order of a full walk.
  rng = random.Random(7)
  names = "abcdefg"
  for _ in range(200):
    nodes = [REF(rng.choice(names)) for _ in range(4)] + [ir.Bytes(b"x")]
    for _ in range(12):
      parts = tuple(rng.choice(nodes) for _ in range(rng.randint(1, 3)))
      nodes.append(ir.Concat(parts) if rng.random() < 0.5 else ir.Union(parts))
    for node in rng.sample(nodes, 5) + [nodes[-1]]:
      assert _grammar.references(node) == _refs_in_order(node)
