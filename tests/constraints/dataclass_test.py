"""Tests for the dataclass front end (`constraints/_dataclass.py`, `cd.Dataclass`).

Oracles: round trips `parse_dataclass(cls, format_dataclass(x)) == x` for random
instances; byte-DFA acceptance of those texts (completeness); random walks through the
DFA that must parse into instances (soundness); tables of malformed texts; and the
error messages for unsupported field types.
"""

import dataclasses
import enum
import random
import typing

import hypothesis
import numpy as np
import pytest

from constrained_decoding.testing import random_accepted_bytes
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.testing import TokenIndex, reference_step


class Color(enum.Enum):
  RED = "red"
  GREEN = "green"
  BLUE = 3


@dataclasses.dataclass
class Point:
  x: int
  y: float


@dataclasses.dataclass
class Item:
  name: str
  count: int
  price: float
  tags: list[str]
  color: Color
  kind: typing.Literal["a", "b", 7, None, True, Color.RED]
  where: Point
  size: tuple[int, int]
  history: tuple[float, ...]
  scores: dict[str, int]
  note: typing.Optional[str] = None
  parent: Point | None = None
  flag: bool = False
  empty: tuple[()] = ()
  mixed: typing.Union[int, str] = 0
  single: tuple[str] = ("x",)
  meters: typing.Annotated[float, "unit"] = 0.0


@dataclasses.dataclass
class Node:
  value: int
  children: list["Node"] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Empty:
  pass


@dataclasses.dataclass
class Derived:
  a: int
  b: int = dataclasses.field(init=False, default=0)


@dataclasses.dataclass
class Answer:
  choice: typing.Literal["A", "B", "C", "D"]
  confidence: float


CLASSES = [Point, Item, Node, Empty, Derived, Answer]

_DFAS = {}


def _dfa(spec: cd.Dataclass):
  if spec not in _DFAS:
    _DFAS[spec] = compile_byte_dfa(spec.to_ir())
  return _DFAS[spec]


_TEXT = ['"', "\\", "\n", "\t", "\r", "\x00", "\x7f", "'", " ", "a", "é", "😀", "\u2028", "\x85",
         "\ufeff", "{", ")"]


def _random_value(tp, rng: random.Random, depth: int = 0):
  """A random value of annotation `tp` (only the types the classes above use)."""
  tp = typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if tp is str:
    return "".join(rng.choice(_TEXT) for _ in range(rng.randint(0, 5)))
  if tp is bool:
    return rng.random() < 0.5
  if tp is int:
    return rng.choice([0, 1, -1, rng.randint(-10**20, 10**20)])
  if tp is float:
    return rng.choice([0.0, -0.0, 1.5, 1e16, 1e-7, -2.5e300, 1.6e308, 5e-324,
                       rng.uniform(-1e6, 1e6)])
  if tp is type(None):
    return None
  if origin in (typing.Union, __import__("types").UnionType):
    return _random_value(rng.choice(args), rng, depth)
  if origin is typing.Literal:
    return rng.choice(args)
  if isinstance(tp, type) and issubclass(tp, enum.Enum):
    return rng.choice(list(tp))
  if origin is list:
    n = rng.randint(0, 2 if depth < 2 else 0)
    return [_random_value(args[0], rng, depth + 1) for _ in range(n)]
  if origin is dict:
    return {_random_value(args[0], rng, depth + 1): _random_value(args[1], rng, depth + 1)
            for _ in range(rng.randint(0, 2))}
  if origin is tuple:
    if len(args) == 2 and args[1] is Ellipsis:
      return tuple(_random_value(args[0], rng, depth + 1) for _ in range(rng.randint(0, 3)))
    return tuple(_random_value(a, rng, depth + 1) for a in args if a != ())
  if dataclasses.is_dataclass(tp):
    hints = typing.get_type_hints(tp, include_extras=True)
    return tp(**{f.name: _random_value(hints[f.name], rng, depth + 1)
                 for f in dataclasses.fields(tp) if f.init})
  raise AssertionError(f"no generator for {tp!r}")


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_round_trip_and_acceptance_of_random_instances(cls):
  dfa = _dfa(cd.Dataclass(cls))
  rng = random.Random(cls.__name__)
  for _ in range(60):
    instance = _random_value(cls, rng)
    text = cd.format_dataclass(instance)
    assert cd.parse_dataclass(cls, text) == instance, text
    assert dfa.accepts(text.encode()), text


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_random_walks_parse_into_instances(cls):
  spec = cd.Dataclass(cls)
  dfa = _dfa(spec)
  rng = random.Random(cls.__name__)
  for _ in range(40):
    text = random_accepted_bytes(dfa, rng, soft_limit=150).decode("utf-8")
    instance = spec.parse(text)
    assert isinstance(instance, cls), text
    assert cd.format_dataclass(instance) == text or dfa.accepts(
        cd.format_dataclass(instance).encode()), text


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.text())
def test_any_string_round_trips(text):
  instance = Answer(choice="A", confidence=0.5)
  holder = Item(name=text, count=0, price=0.0, tags=[text], color=Color.BLUE, kind=None,
                where=Point(1, 2.0), size=(1, 2), history=(), scores={text: 1})
  source = cd.format_dataclass(holder)
  assert cd.parse_dataclass(Item, source) == holder
  assert _dfa(cd.Dataclass(Item)).accepts(source.encode())
  assert cd.parse_dataclass(Answer, cd.format_dataclass(instance)) == instance


def test_format_examples():
  item = Item(name='say "hi"\n', count=-3, price=1e16, tags=[], color=Color.GREEN, kind=Color.RED,
              where=Point(0, -0.5), size=(1, 2), history=(1.0,), scores={"a": 1}, single=("y",))
  assert cd.format_dataclass(item) == (
      'Item(name="say \\"hi\\"\\n", count=-3, price=1e+16, tags=[], color=Color.GREEN,'
      ' kind=Color.RED, where=Point(x=0, y=-0.5), size=(1, 2), history=(1.0,),'
      ' scores={"a": 1}, note=None, parent=None, flag=False, empty=(), mixed=0,'
      ' single=("y",), meters=0.0)')
  assert cd.format_dataclass(Empty()) == "Empty()"
  assert cd.format_dataclass(Derived(a=1)) == "Derived(a=1)"


_POINT = cd.Dataclass(Point)

# (text, accepted by the constraint, parses).
POINT_TEXTS = [
    ("Point(x=1, y=2.5)", True, True),
    ("Point(x=-12, y=1e-07)", True, True),
    ("Point(x=0, y=3)", True, True),  # An int literal for a float field.
    ("Point(y=2.5, x=1)", False, True),  # Keyword order is free when parsing.
    ("Point(x=1,y=2.5)", False, True),  # Spacing too.
    ("Point(x=-0, y=2.5)", False, True),
    ("Point(x=1)", False, False),
    ("Point(x=1, y=2.5, z=3)", False, False),
    ("Point(x=1, x=1, y=2.5)", False, False),
    ("Point(x='1', y=2.5)", False, False),
    ("Point(x=1.5, y=2.5)", False, False),
    ("Point(x=True, y=2.5)", False, False),
    ("Point(1, 2.5)", False, False),
    ("Point(**{'x': 1, 'y': 2.5})", False, False),
    ("Other(x=1, y=2.5)", False, False),
    ("Point(x=01, y=2.5)", False, False),
    ("Point(x=1, y=inf)", False, False),
    ("Point(x=1, y=2.5) + 1", False, False),
    ("__import__('os').system('true')", False, False),
    ("Point(x=1, y=2.5", False, False),
    ("", False, False),
]


@pytest.mark.parametrize("text, accepted, parses", POINT_TEXTS, ids=[t for t, _, _ in POINT_TEXTS])
def test_malformed_point_texts(text, accepted, parses):
  assert _dfa(_POINT).accepts(text.encode()) == accepted
  if parses:
    assert isinstance(_POINT.parse(text), Point)
  else:
    with pytest.raises(ValueError, match="Expected"):
      _POINT.parse(text)


@pytest.mark.parametrize("text", [
    'Item(name="a\\x00\\u00e9\\\'", count=0, price=0.0, tags=["x", ""], color=Color.BLUE,'
    ' kind="b", where=Point(x=1, y=1.0), size=(1, 2), history=(), scores={}, note="n",'
    ' parent=Point(x=2, y=2.0), flag=True, empty=(), mixed="m", single=("",), meters=-1.5)',
])
def test_hand_written_item(text):
  assert _dfa(cd.Dataclass(Item)).accepts(text.encode())
  item = cd.parse_dataclass(Item, text)
  assert item.name == "a\x00é'" and item.mixed == "m" and item.kind == "b"


@pytest.mark.parametrize("text", [
    'Item(name=\'single\', count=0, price=0.0, tags=[], color=Color.BLUE, kind="b",'
    ' where=Point(x=1, y=1.0), size=(1, 2), history=(), scores={}, note=None, parent=None,'
    ' flag=False, empty=(), mixed=0, single=("",), meters=0.0)',
    'Item(name="raw\nnewline", count=0, price=0.0, tags=[], color=Color.BLUE, kind="b",'
    ' where=Point(x=1, y=1.0), size=(1, 2), history=(), scores={}, note=None, parent=None,'
    ' flag=False, empty=(), mixed=0, single=("",), meters=0.0)',
    'Item(name="a", count=0, price=0.0, tags=[], color=Color.PURPLE, kind="b",'
    ' where=Point(x=1, y=1.0), size=(1, 2), history=(), scores={}, note=None, parent=None,'
    ' flag=False, empty=(), mixed=0, single=("",), meters=0.0)',
    'Item(name="a", count=0, price=0.0, tags=[], color=Color.BLUE, kind="c",'
    ' where=Point(x=1, y=1.0), size=(1, 2), history=(), scores={}, note=None, parent=None,'
    ' flag=False, empty=(), mixed=0, single=("",), meters=0.0)',
    'Item(name="a", count=0, price=0.0, tags=[], color=Color.BLUE, kind="b",'
    ' where=Point(x=1, y=1.0), size=(1, 2, 3), history=(), scores={}, note=None, parent=None,'
    ' flag=False, empty=(), mixed=0, single=("",), meters=0.0)',
])
def test_malformed_item_texts_are_rejected_by_both(text):
  assert not _dfa(cd.Dataclass(Item)).accepts(text.encode())
  if "raw\n" not in text and "'single'" not in text:
    with pytest.raises(ValueError):
      cd.parse_dataclass(Item, text)


def test_recursive_dataclass_depth_bound():
  for max_depth in (1, 2, 3):
    dfa = _dfa(cd.Dataclass(Node, max_depth=max_depth))
    text = "Node(value=1, children=[])"
    for depth in range(1, 5):
      assert dfa.accepts(text.encode()) == (depth <= max_depth), (max_depth, text)
      text = f"Node(value=0, children=[{text}, {text}])"


@dataclasses.dataclass
class BadSet:
  tags: set[str]


@dataclasses.dataclass
class BadAny:
  value: typing.Any


@dataclasses.dataclass
class BadBytes:
  data: bytes


@dataclasses.dataclass
class BadList:
  items: list


@dataclasses.dataclass
class BadLiteral:
  ratio: typing.Literal[1.5]


@dataclasses.dataclass
class Wrapper:
  inner: typing.Optional[BadSet]


@dataclasses.dataclass
class Loop:
  me: "Loop"


@dataclasses.dataclass
class Unresolved:
  other: "Missing"  # noqa: F821


@pytest.mark.parametrize("cls, error, message", [
    (BadSet, cd.UnsupportedSchemaError,
     r"Field BadSet.tags has type set\[str\], which is not supported"),
    (BadAny, cd.UnsupportedSchemaError, r"Field BadAny.value has type (typing\.)?Any, which"),
    (BadBytes, cd.UnsupportedSchemaError, r"Field BadBytes.data has type bytes"),
    (BadList, cd.UnsupportedSchemaError, r"Field BadList.items has type list"),
    (BadLiteral, cd.UnsupportedSchemaError, r"Field BadLiteral.ratio has the Literal value 1.5"),
    (Wrapper, cd.UnsupportedSchemaError, r"Field BadSet.tags has type set\[str\]"),
    (Loop, cd.UnsupportedSchemaError, r"Dataclass Loop is recursive and has no instance within"
                                      r" max_depth=3"),
    (Unresolved, cd.UnsupportedSchemaError, r"Dataclass Unresolved has annotations that cannot be"
                                            r" resolved"),
], ids=lambda v: getattr(v, "__name__", None))
def test_unsupported_field_types(cls, error, message):
  with pytest.raises(error, match=message):
    cd.Dataclass(cls).to_ir()


def test_spec_and_function_argument_errors():
  with pytest.raises(TypeError, match=r"Dataclass spec got Point\(x=1, y=2.0\)"):
    cd.Dataclass(Point(1, 2.0))
  with pytest.raises(TypeError, match=r"Dataclass spec got <class 'int'>"):
    cd.Dataclass(int)
  with pytest.raises(ValueError, match=r"Dataclass max_depth 0 is not an int >= 1"):
    cd.Dataclass(Point, max_depth=0)
  with pytest.raises(TypeError, match=r"format_dataclass got <class '.*Point'>"):
    cd.format_dataclass(Point)
  with pytest.raises(TypeError, match=r"Float inf cannot be written as a literal"):
    cd.format_dataclass(Point(1, float("inf")))
  with pytest.raises(TypeError, match=r"Value \{1\} of type set cannot be written"):
    cd.format_dataclass(BadSet({1}))
  with pytest.raises(TypeError, match=r"parse_dataclass got 3"):
    cd.parse_dataclass(3, "x")


def test_spec_is_hashable_and_describes_itself():
  assert cd.Dataclass(Point) == cd.Dataclass(Point)
  assert hash(cd.Dataclass(Point)) == hash(cd.Dataclass(Point))
  assert cd.Dataclass(Point) != cd.Dataclass(Point, max_depth=2)
  assert cd.Dataclass(Point).describe() == f"Dataclass({__name__}.Point)"


def test_token_level_with_gemma(gemma_compiler, gemma_vocab):
  spec = cd.Dataclass(Answer)
  tables = gemma_compiler.compile(spec)
  index = TokenIndex(gemma_vocab)
  rng = random.Random(0)
  for _ in range(15):
    text = cd.format_dataclass(_random_value(Answer, rng)).encode()
    for _ in range(2):
      state = int(tables.start[0])
      for token in index.random_tokenization(text, rng):
        state = reference_step(tables, state, token)
        assert state is not None, text
      assert tables.accepting[state], text


@pytest.mark.parametrize("text, accepted", [
    ("1", True), ("-0.5", True), ("1e+16", True), ("1.5e-07", True), ("1.6999e308", True),
    ("1e+307", True), ("9.99e307", True), ("1" + "0" * 307 + ".0", True), ("1e-999", True),
    ("1.7976931348623157e+308", False), ("1e309", False), ("2e308", False),
    ("1" + "0" * 308, False),
    ("inf", False), ("nan", False), ("1.", False), (".5", False), ("01", False),
])
def test_float_literals_never_overflow(text, accepted):
  dfa = _dfa(cd.Dataclass(Point))
  assert dfa.accepts(f"Point(x=0, y={text})".encode()) == accepted
  if accepted:
    assert np.isfinite(cd.parse_dataclass(Point, f"Point(x=0, y={text})").y)
