"""Dataclass front end: constructor calls `Name(field=value, ...)` as IR, and back (Sec. 5.2).

Public functions:
  dataclass_ir(cls, *, max_depth=3)  the IR of the constructor-call texts of `cls`.
  format_dataclass(instance)         the text of an instance in that syntax.
  parse_dataclass(cls, text)         the instance a text denotes (no `eval`).

The syntax is fixed and Python-repr-like, so the model writes what it has seen in code:
* A dataclass is `Name(f1=v1, f2=v2)`: the class's `__name__`, every `init=True` field
  as a keyword argument in declaration order (fields with defaults too), `, ` between
  arguments, no other whitespace. No fields: `Name()`.
* `str`: a double-quoted literal. Unescaped: every character except `"`, `\\`, the C0
  controls and DEL; escapes: `\\\\ \\" \\' \\n \\r \\t`, `\\xhh`, and `\\uhhhh` (never a
  surrogate). `format_dataclass` escapes only `\\ " \\n \\r \\t` and other controls
  (`\\xhh`).
* `int`: `0` or `-?[1-9][0-9]*`. `float`: a JSON-style number (`1`, `-0.5`, `1e+16`, as
  `repr` writes finite floats) bounded so that it cannot overflow to `inf`: at most 308
  integer digits, or one mantissa digit with an exponent up to 307 (or `1.0`-`1.6...`
  with 308); `repr` of floats from 1.7e308 up, `inf` and `nan` cannot be written.
  `bool`: `True`, `False`. `None`: `None`.
* `Optional[T]`, `T | None`, `Union[...]`: any alternative. `Literal[...]`: one of
  the values (str, int, bool, None or Enum members). `Enum`: `EnumName.MEMBER`.
* `list[T]`: `[a, b]`; `tuple[A, B]`: `(a, b)` (one element: `(a,)`; `tuple[()]`:
  `()`); `tuple[T, ...]`: any length; `dict[K, V]`: `{k: v}`; `Annotated[T, ...]`: `T`.
* A recursive dataclass is expanded at most `max_depth` times along a path; deeper, the
  alternatives that need it are dropped (`None` for Optional, `[]` for lists).
Any other annotation (`Any`, `set`, `bytes`, bare `list`, ...) raises
`UnsupportedSchemaError` naming the field.
"""

import ast
import collections
import dataclasses
import enum
import types
import typing

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_numbers as jn
from constrained_decoding.constraints import _json_values as jv

_DIGIT = ir.char_class([(0x30, 0x39)])
_HEX = ir.char_class([(0x30, 0x39), (0x41, 0x46), (0x61, 0x66)])
_INT = jn.integer_range(None, None)
_NONZERO = ir.char_class([(0x31, 0x39)])
_FRACTION = ir.repeat(ir.concat(ir.Bytes(b"."), ir.repeat(_DIGIT, 1, None)), 0, 1)
_EXPONENT_MARK = ir.char_class([(0x45, 0x45), (0x65, 0x65)])
_FLOAT = ir.concat(ir.repeat(ir.Bytes(b"-"), 0, 1), ir.union(
    # Positional: at most 308 integer digits, so the value stays below 1e308.
    ir.concat(ir.union(ir.Bytes(b"0"), ir.concat(_NONZERO, ir.repeat(_DIGIT, 0, 307))),
              _FRACTION),
    # One mantissa digit and an exponent <= 307, or 1.0-1.6999... with exponent 308, so
    # that no literal overflows to inf (`repr` writes every float below 1.7e308).
    ir.concat(_DIGIT, _FRACTION, _EXPONENT_MARK, ir.union(
        ir.concat(ir.Bytes(b"-"), ir.repeat(_DIGIT, 1, None)),
        ir.concat(ir.repeat(ir.Bytes(b"+"), 0, 1), ir.repeat(ir.Bytes(b"0"), 0, None),
                  jn.integer_range(0, 307)))),
    ir.concat(ir.Bytes(b"1"), ir.repeat(ir.concat(ir.Bytes(b"."), ir.char_class([(0x30, 0x36)]),
                                                  ir.repeat(_DIGIT, 0, None)), 0, 1),
              _EXPONENT_MARK, ir.repeat(ir.Bytes(b"+"), 0, 1), ir.repeat(ir.Bytes(b"0"), 0, None),
              ir.Bytes(b"308")),
))
_BOOL = ir.union(ir.Bytes(b"True"), ir.Bytes(b"False"))
_NONE = ir.Bytes(b"None")
_STR_CHAR = ir.union(
    ir.char_class([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E), (0x80, ir.MAX_CODE_POINT)]),
    ir.concat(ir.Bytes(b"\\"), ir.union(
        ir.char_class([(c, c) for c in b"\\\"'nrt"]),
        ir.concat(ir.Bytes(b"x"), _HEX, _HEX),
        jv.UNICODE_ESCAPE,
    )),
)
_STR = ir.concat(ir.Bytes(b'"'), ir.repeat(_STR_CHAR, 0, None), ir.Bytes(b'"'))
_SEPARATOR = ir.Bytes(b", ")
_SHORT_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SUPPORTED = ("str, int, float, bool, None, Optional/Union, list[T], tuple[...], dict[K, V],"
              " Literal[...], an Enum or a dataclass")


def _is_dataclass_type(tp) -> bool:
  return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _init_fields(cls) -> list[dataclasses.Field]:
  return [f for f in dataclasses.fields(cls) if f.init]


def _hints(cls) -> dict:
  try:
    return typing.get_type_hints(cls, include_extras=True)
  except Exception as e:  # NameError, TypeError, ... from unresolvable annotations.
    raise errors.UnsupportedSchemaError(
        f"Dataclass {cls.__qualname__} has annotations that cannot be resolved: {e}."
        " Expected annotations resolvable from the class's module. Define the referenced"
        " types at module level."
    ) from e


def _strip_annotated(tp):
  while typing.get_origin(tp) is typing.Annotated:
    tp = typing.get_args(tp)[0]
  return tp


def _is_union(tp) -> bool:
  return typing.get_origin(tp) in (typing.Union, types.UnionType)


def dataclass_ir(cls, *, max_depth: int = 3) -> ir.Node:
  """The IR of the texts `Name(field=value, ...)` denoting instances of `cls`.

  Args:
    cls: A dataclass type.
    max_depth: Most expansions of one dataclass along any path (bounds recursion).

  Raises:
    TypeError: `cls` is not a dataclass type.
    UnsupportedSchemaError: A field has an unsupported type (the message names it), or
      a recursive dataclass has no finite instance within `max_depth`.
  """
  if not _is_dataclass_type(cls):
    raise TypeError(
        f"Dataclass spec got {cls!r}. Expected a class decorated with @dataclasses.dataclass."
        " Pass the class itself, not an instance."
    )
  builder = _Builder(max_depth)
  node = builder.dataclass(cls)
  if node == ir.NOTHING:
    raise errors.UnsupportedSchemaError(
        f"Dataclass {cls.__qualname__} is recursive and has no instance within"
        f" max_depth={max_depth}. Expected an Optional field, a list or a Union that ends the"
        " recursion. Add one, or raise max_depth."
    )
  return node


class _Builder:
  """Builds the IR of types, tracking how deep each dataclass is expanded."""

  def __init__(self, max_depth: int):
    self.max_depth = max_depth
    self.expanding: collections.Counter = collections.Counter()

  def dataclass(self, cls) -> ir.Node:
    if self.expanding[cls] >= self.max_depth:
      return ir.NOTHING
    hints = _hints(cls)
    self.expanding[cls] += 1
    try:
      parts = [ir.Bytes(f"{cls.__name__}(".encode())]
      for i, field in enumerate(_init_fields(cls)):
        if i:
          parts.append(_SEPARATOR)
        parts.append(ir.Bytes(f"{field.name}=".encode()))
        parts.append(self.type_ir(hints[field.name], f"{cls.__name__}.{field.name}"))
      parts.append(ir.Bytes(b")"))
      return ir.concat(*parts)
    finally:
      self.expanding[cls] -= 1

  def type_ir(self, tp, where: str) -> ir.Node:
    """The IR of the values of annotation `tp` (`where` names the field for errors)."""
    tp = _strip_annotated(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None) or tp is None:
      return _NONE
    if tp is bool:
      return _BOOL
    if tp is int:
      return _INT
    if tp is float:
      return _FLOAT
    if tp is str:
      return _STR
    if _is_union(tp):
      return ir.union(*(self.type_ir(a, where) for a in args))
    if origin is typing.Literal:
      return ir.union(*(ir.Bytes(_format_literal(a, where).encode()) for a in args))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
      return ir.union(*(ir.Bytes(f"{tp.__name__}.{m.name}".encode()) for m in tp))
    if _is_dataclass_type(tp):
      return self.dataclass(tp)
    if origin is list and len(args) == 1:
      return jv.delimited(b"[", b"]", self.type_ir(args[0], where), _REPR)
    if origin is dict and len(args) == 2:
      item = ir.concat(self.type_ir(args[0], where), ir.Bytes(b": "), self.type_ir(args[1], where))
      return jv.delimited(b"{", b"}", item, _REPR)
    if origin is tuple:
      return self.tuple_ir(args, where)
    raise errors.UnsupportedSchemaError(
        f"Field {where} has type {_type_name(tp)}, which is not supported. Expected"
        f" {_SUPPORTED}. Change the annotation (e.g. set[str] -> list[str])."
    )

  def tuple_ir(self, args: tuple, where: str) -> ir.Node:
    if len(args) == 2 and args[1] is Ellipsis:  # tuple[T, ...]
      item = self.type_ir(args[0], where)
      return ir.union(
          ir.Bytes(b"()"),
          ir.concat(ir.Bytes(b"("), item, ir.Bytes(b",)")),
          ir.concat(ir.Bytes(b"("), item, ir.repeat(ir.concat(_SEPARATOR, item), 1, None),
                    ir.Bytes(b")")),
      )
    if not args or args == ((),):
      return ir.Bytes(b"()")
    items = [self.type_ir(a, where) for a in args]
    if len(items) == 1:
      return ir.concat(ir.Bytes(b"("), items[0], ir.Bytes(b",)"))
    return ir.concat(ir.Bytes(b"("), *jv.interleave(items, _SEPARATOR), ir.Bytes(b")"))


_REPR = jv.Whitespace("single")  # `[a, b]`, `{k: v}`: Python's repr spacing.


def _type_name(tp) -> str:
  return tp.__name__ if isinstance(tp, type) and not typing.get_args(tp) else repr(tp)


def _format_literal(value, where: str) -> str:
  if value is None or isinstance(value, (bool, int, str, enum.Enum)):
    return _format_value(value)
  raise errors.UnsupportedSchemaError(
      f"Field {where} has the Literal value {value!r}, which is not supported. Expected str,"
      " int, bool, None or Enum members in Literal[...]. Use one of those."
  )


# ---- Formatting. ----


def format_dataclass(instance) -> str:
  """The text of a dataclass instance in the syntax of `dataclass_ir` (module docstring).

  ```python
  format_dataclass(Point(x=1, label="a\\nb"))  # 'Point(x=1, label="a\\\\nb")'
  ```

  Raises:
    TypeError: `instance` is not a dataclass instance, or holds a value that cannot be
      written (a set, bytes, a non-finite float, ...).
  """
  if not dataclasses.is_dataclass(instance) or isinstance(instance, type):
    raise TypeError(
        f"format_dataclass got {instance!r}. Expected a dataclass instance. Construct one"
        " first."
    )
  return _format_value(instance)


def _format_str(text: str) -> str:
  out = []
  for ch in text:
    if ch in _SHORT_ESCAPES:
      out.append(_SHORT_ESCAPES[ch])
    elif ord(ch) < 0x20 or ch == "\x7f":
      out.append(f"\\x{ord(ch):02x}")
    else:
      out.append(ch)
  return '"' + "".join(out) + '"'


def _format_value(value) -> str:
  if value is None or isinstance(value, bool):
    return repr(value)
  if isinstance(value, enum.Enum):
    return f"{type(value).__name__}.{value.name}"
  if isinstance(value, int):
    return str(int(value))
  if isinstance(value, float):
    text = repr(value)
    if text in ("inf", "-inf", "nan"):
      raise TypeError(
          f"Float {value!r} cannot be written as a literal. Expected a finite float."
          " Replace it before formatting."
      )
    return text
  if isinstance(value, str):
    return _format_str(value)
  if isinstance(value, list):
    return "[" + ", ".join(_format_value(v) for v in value) + "]"
  if isinstance(value, tuple):
    if len(value) == 1:
      return f"({_format_value(value[0])},)"
    return "(" + ", ".join(_format_value(v) for v in value) + ")"
  if isinstance(value, dict):
    return "{" + ", ".join(f"{_format_value(k)}: {_format_value(v)}"
                           for k, v in value.items()) + "}"
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    arguments = ", ".join(f"{f.name}={_format_value(getattr(value, f.name))}"
                          for f in _init_fields(type(value)))
    return f"{type(value).__name__}({arguments})"
  raise TypeError(
      f"Value {value!r} of type {type(value).__name__} cannot be written. Expected a value"
      f" of a supported field type ({_SUPPORTED})."
  )


# ---- Parsing. ----


def parse_dataclass(cls, text: str):
  """The instance of `cls` that `text` denotes, evaluated without `eval`.

  `ast.parse` reads the text; a small evaluator accepts only literals, `-` before
  numbers, lists, tuples, dicts, `Enum.MEMBER` of the field's Enum, and calls of the
  expected dataclass with keyword arguments, each checked against the field's type.
  Keyword order is free and fields with defaults may be omitted (the constraint always
  writes all of them, in order).

  Raises:
    ValueError: `text` is not a valid constructor call for `cls`.
  """
  if not _is_dataclass_type(cls):
    raise TypeError(f"parse_dataclass got {cls!r}. Expected a dataclass type.")
  try:
    tree = ast.parse(text.strip(), mode="eval")
  except SyntaxError as e:
    raise ValueError(
        f"Text {_clip(text)!r} is not a Python expression ({e.msg}). Expected"
        f" {cls.__name__}(field=value, ...). Constrain the output with Dataclass({cls.__name__})."
    ) from e
  return _evaluate(tree.body, cls, cls.__name__)


def _clip(text: str, limit: int = 60) -> str:
  return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(node: ast.AST, tp, where: str) -> ValueError:
  return ValueError(
      f"Value {_clip(ast.unparse(node))!r} at {where} is not a {_type_name(tp)}. Expected a"
      f" literal of that type. Check the text against Dataclass(...)'s syntax."
  )


def _number(node: ast.AST):
  """The int or float a (possibly negated) numeric literal denotes, else None."""
  sign = 1
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    sign, node = -1, node.operand
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):
    return sign * node.value
  return None


def _evaluate(node: ast.AST, tp, where: str, exact: bool = False):
  """The value of `node` as annotation `tp`. `exact`: a float field needs a float literal."""
  tp = _strip_annotated(tp)
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if tp is type(None) or tp is None:
    if isinstance(node, ast.Constant) and node.value is None:
      return None
  elif tp is bool or tp is str:
    if isinstance(node, ast.Constant) and type(node.value) is tp:
      return node.value
  elif tp is int:
    value = _number(node)
    if type(value) is int:
      return value
  elif tp is float:
    value = _number(node)
    if value is not None and (type(value) is float or not exact):
      return float(value)
  elif _is_union(tp):
    for strict in (True, False):
      for alternative in args:
        try:
          return _evaluate(node, alternative, where, exact=strict)
        except ValueError:
          pass
  elif origin is typing.Literal:
    for value in args:
      try:
        if _evaluate(node, type(value), where, exact=True) == value:
          return value
      except ValueError:
        pass
  elif isinstance(tp, type) and issubclass(tp, enum.Enum):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id == tp.__name__ and node.attr in tp.__members__):
      return tp[node.attr]
  elif _is_dataclass_type(tp):
    return _evaluate_call(node, tp, where)
  elif origin is list and isinstance(node, ast.List):
    return [_evaluate(e, args[0], f"{where}[{i}]") for i, e in enumerate(node.elts)]
  elif origin is dict and isinstance(node, ast.Dict) and None not in node.keys:
    return {_evaluate(k, args[0], f"{where} key"): _evaluate(v, args[1], f"{where}[...]")
            for k, v in zip(node.keys, node.values)}
  elif origin is tuple and isinstance(node, ast.Tuple):
    if len(args) == 2 and args[1] is Ellipsis:
      return tuple(_evaluate(e, args[0], f"{where}[{i}]") for i, e in enumerate(node.elts))
    expected = () if args == ((),) else args
    if len(node.elts) == len(expected):
      return tuple(_evaluate(e, a, f"{where}[{i}]")
                   for i, (e, a) in enumerate(zip(node.elts, expected)))
  raise _fail(node, tp, where)


def _evaluate_call(node: ast.AST, cls, where: str):
  if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id == cls.__name__):
    raise ValueError(
        f"Value {_clip(ast.unparse(node))!r} at {where} is not a call of {cls.__name__}."
        f" Expected {cls.__name__}(field=value, ...). Check the text against the constraint."
    )
  fields = {f.name: f for f in _init_fields(cls)}
  if node.args or any(k.arg is None for k in node.keywords):
    raise ValueError(
        f"Call {_clip(ast.unparse(node))!r} at {where} has positional or ** arguments."
        f" Expected keyword arguments only. Write {cls.__name__}(name=value, ...)."
    )
  hints = _hints(cls)
  kwargs = {}
  for keyword in node.keywords:
    if keyword.arg not in fields or keyword.arg in kwargs:
      problem = "is not a field" if keyword.arg not in fields else "is given twice"
      raise ValueError(
          f"Argument {keyword.arg!r} of {cls.__name__} at {where} {problem}. Expected each"
          f" of {list(fields)} at most once. Fix the call."
      )
    kwargs[keyword.arg] = _evaluate(keyword.value, hints[keyword.arg],
                                    f"{cls.__name__}.{keyword.arg}")
  missing = [n for n, f in fields.items() if n not in kwargs
             and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
  if missing:
    raise ValueError(
        f"Call of {cls.__name__} at {where} misses the fields {missing}. Expected every field"
        " without a default. Add them."
    )
  return cls(**kwargs)
