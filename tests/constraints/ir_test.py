"""The IR's one generic walk: `children`, `rebuild`, `transform`."""

import pytest

from constrained_decoding.constraints import _ir as ir

_A = ir.Bytes(b"a")
_B = ir.Bytes(b"b")
_DIGIT = ir.char_class([(0x30, 0x39)])

# One node of every type, with its children.
NODES = [
    (ir.Bytes(b"x"), ()),
    (_DIGIT, ()),
    (ir.byte_class([(0, 9)]), ()),
    (ir.Terminal("TEXT_TOKEN"), ()),
    (ir.RuleRef("value"), ()),
    (ir.Marker("set", 0, 1), ()),
    (ir.Concat((_A, _B)), (_A, _B)),
    (ir.Union((_A, _B)), (_A, _B)),
    (ir.Repeat(_A, 2, None), (_A,)),
    (ir.Graph(2, ((0, _A, 1), (1, _B, 0)), (1,)), (_A, _B)),
    (ir.Fragment("f", _DIGIT), (_DIGIT,)),
]


def test_every_node_type_is_covered():
  assert {type(node) for node, _ in NODES} == set(ir.Node.__args__)


@pytest.mark.parametrize("node, kids", NODES)
def test_children(node, kids):
  assert ir.children(node) == kids


def test_children_rejects_what_is_not_a_node():
  # Under the tests' runtime type checks the annotation catches it first.
  with pytest.raises(TypeError, match="'a'"):
    ir.children("a")


@pytest.mark.parametrize("node, kids", NODES)
def test_rebuild_with_the_same_children_is_the_node_itself(node, kids):
  assert ir.rebuild(node, kids) is node


@pytest.mark.parametrize("node, kids", [(n, k) for n, k in NODES if k and
                                        not isinstance(n, ir.Fragment)])
def test_rebuild_with_new_children(node, kids):
  new = tuple(ir.Bytes(b"z" * (i + 1)) for i in range(len(kids)))
  out = ir.rebuild(node, new)
  assert type(out) is type(node) and out is not node
  assert ir.children(out) == new
  if isinstance(node, ir.Repeat):
    assert (out.min, out.max) == (node.min, node.max)
  if isinstance(node, ir.Graph):
    assert out.num_states == node.num_states and out.finals == node.finals
    assert [(s, t) for s, _, t in out.arcs] == [(s, t) for s, _, t in node.arcs]


def test_rebuild_uses_the_plain_constructors():
  # No flattening or dropping of the empty string: the structure is kept.
  out = ir.rebuild(ir.Concat((_A, _B)), (ir.Concat((_A, _B)), ir.EPSILON))
  assert out == ir.Concat((ir.Concat((_A, _B)), ir.EPSILON))
  simplified = ir.rebuild_simplified(ir.Concat((_A, _B)), (ir.Concat((_A, _B)), ir.EPSILON))
  assert simplified == ir.Concat((_A, _B))


def test_rebuild_checks_the_number_of_children():
  with pytest.raises(ValueError, match="Expected 2 children to rebuild Concat, got 1"):
    ir.rebuild(ir.Concat((_A, _B)), (_A,))


def test_rebuild_keeps_a_fragment_name_only_when_asked():
  fragment = ir.Fragment("f", _DIGIT)
  with pytest.raises(ValueError, match="Fragment 'f' would keep its name"):
    ir.rebuild(fragment, (_A,))
  out = ir.rebuild(fragment, (_A,), allow_fragment_body_change=True)
  assert out.name == "f" and out.body == _A


def _upper(node):
  return ir.Bytes(node.data.upper()) if isinstance(node, ir.Bytes) else node


@pytest.mark.parametrize("node, kids", NODES)
def test_transform_reaches_every_child(node, kids):
  del kids
  out = ir.transform(node, _upper, enter_fragments=True)
  seen = []
  ir.transform(out, lambda n: seen.append(n) or n, enter_fragments=True)
  assert ir.Bytes(b"a") not in seen and ir.Bytes(b"b") not in seen


def test_transform_without_change_returns_the_same_object():
  tree = ir.Concat((ir.Union((_A, ir.Repeat(_DIGIT, 0, 3))),
                    ir.Graph(2, ((0, _DIGIT, 1),), (1,)), ir.Fragment("f", _A)))
  assert ir.transform(tree, lambda n: n) is tree
  assert ir.transform(tree) is tree


def test_transform_keeps_unchanged_siblings():
  untouched = ir.Repeat(_DIGIT, 0, 3)
  tree = ir.Concat((untouched, _A))
  out = ir.transform(tree, _upper)
  assert out == ir.Concat((untouched, ir.Bytes(b"A")))
  assert out.parts[0] is untouched


def test_transform_is_post_order():
  order = []
  tree = ir.Concat((ir.Union((_A, _B)), _DIGIT))
  ir.transform(tree, lambda n: order.append(n) or n)
  assert order == [_A, _B, ir.Union((_A, _B)), _DIGIT, tree]


def test_transform_visits_a_shared_sub_tree_once():
  shared = ir.Union((ir.Bytes(b"a"), ir.Bytes(b"b")))
  tree = ir.Concat((shared, ir.Repeat(shared, 0, 2),
                    ir.Graph(2, ((0, shared, 1), (1, shared, 0)), (1,))))
  calls = []

  def count(n):
    calls.append(n)
    return _upper(n)

  out = ir.transform(tree, count)
  assert sum(1 for n in calls if n == ir.Union((ir.Bytes(b"A"), ir.Bytes(b"B")))) == 1
  assert len(calls) == 6  # a, b, the union, the repeat, the graph, the concat.
  shared_out = out.parts[0]
  assert out.parts[1].node is shared_out
  assert all(label is shared_out for _, label, _ in out.parts[2].arcs)


def test_transform_memo_may_be_shared_between_calls():
  shared = ir.Union((_A, _B))
  memo: dict = {}
  calls = []

  def count(n):
    calls.append(n)
    return n

  ir.transform(ir.Concat((shared, _DIGIT)), count, memo=memo)
  ir.transform(ir.Repeat(shared, 0, 2), count, memo=memo)
  assert calls.count(shared) == 1


def test_transform_leaves_fragment_bodies_alone_by_default():
  fragment = ir.Fragment("f", _A)
  assert ir.transform(ir.Concat((fragment, _B)), _upper) == ir.Concat((fragment, ir.Bytes(b"B")))
  out = ir.transform(ir.Concat((fragment, _B)), _upper, enter_fragments=True)
  assert out.parts[0].body == ir.Bytes(b"A")


def test_transform_before_replaces_whole_sub_trees_top_down():
  inner = ir.Repeat(_A, 0, 2)
  outer = ir.Repeat(ir.Concat((inner, _B)), 1, 3)
  seen = []

  def before(n):
    seen.append(n)
    return ir.Terminal("TEXT_TOKEN") if isinstance(n, ir.Repeat) else None

  out = ir.transform(ir.Concat((outer, _DIGIT)), lambda n: _upper(n), before=before)
  assert out == ir.Concat((ir.Terminal("TEXT_TOKEN"), _DIGIT))
  assert inner not in seen  # `outer` was replaced before its children were visited.


def test_inline_fragments():
  nested = ir.Fragment("outer", ir.Concat((ir.Fragment("inner", _A), _B)))
  assert ir.inline_fragments(ir.Union((nested, _DIGIT))) == ir.Union(
      (ir.Concat((_A, _B)), _DIGIT))
  plain = ir.Concat((_A, _B))
  assert ir.inline_fragments(plain) is plain
