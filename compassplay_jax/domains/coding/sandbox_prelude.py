"""Trusted helpers that run INSIDE the sandbox, as the Job.prelude of every check job.

Stdlib only, and it must not import the package: `prelude_source()` returns
this file's text. The helpers never see a gold answer; they turn values into
canonical strings that the trainer compares as plain text, so nothing a
program does in the sandbox can make a wrong answer "equal" to the gold one.

- `_cp_eval(src, names)`: evaluates a plain value expression: literals,
  arithmetic, comprehensions, lambdas, calls of a few pure builtins and
  methods whose names do not start with "_" (no dunder, frame or format access).
- `_cp_call_args(src, names)`: the same for an argument list "1, 'a', k=2".
- `_cp_canon(value)`: canonical text that is equal for two values exactly when
  Python's == would be for builtin data types (1 == 1.0 == True, dict and set
  order ignored, list != tuple). Any other type (e.g. a class whose __eq__
  always returns True) raises, so it can never match.

Binding: the worker runs this prelude with a snapshot of the builtins taken
before any program code, and every module function the helpers call is bound
to a `_cp_*` name below, so a program that patches `builtins.repr`, `json.dumps`
or `ast.walk` later changes nothing here.
"""
import ast as _cp_ast
import builtins as _cp_builtins
import collections as _cp_collections
import json as _cp_json
import math as _cp_math
import os as _cp_os
import re as _cp_re

# Bound now, before any program runs.
_cp_compile = compile
_CP_ONLY_AST = _cp_ast.PyCF_ONLY_AST
_CP_AST_NODE = _cp_ast.AST
_cp_isnan, _cp_isinf = _cp_math.isnan, _cp_math.isinf
_cp_urandom = _cp_os.urandom
_cp_encode_str = _cp_json.encoder.encode_basestring_ascii
_cp_repr = repr

_CP_SAFE_CALLS = {name: getattr(_cp_builtins, name) for name in (
    "abs", "all", "any", "bin", "bool", "bytes", "chr", "complex", "dict", "divmod", "enumerate",
    "filter", "float", "frozenset", "hex", "int", "len", "list", "map", "max", "min", "oct", "ord",
    "pow", "range", "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "zip")}
_CP_BAD_ATTR = _cp_re.compile(r"^(_|gi_|cr_|ag_|f_|tb_|co_)|^(format|format_map|mro)$")
_CP_NODES = (
    _cp_ast.Expression, _cp_ast.Constant, _cp_ast.Tuple, _cp_ast.List, _cp_ast.Set, _cp_ast.Dict,
    _cp_ast.UnaryOp, _cp_ast.BinOp, _cp_ast.BoolOp, _cp_ast.Compare, _cp_ast.IfExp,
    _cp_ast.Subscript, _cp_ast.Slice, _cp_ast.Starred, _cp_ast.Name, _cp_ast.Call,
    _cp_ast.Attribute, _cp_ast.Lambda, _cp_ast.arguments, _cp_ast.arg, _cp_ast.keyword,
    _cp_ast.ListComp, _cp_ast.SetComp, _cp_ast.DictComp, _cp_ast.GeneratorExp,
    _cp_ast.comprehension, _cp_ast.JoinedStr, _cp_ast.FormattedValue, _cp_ast.expr_context,
    _cp_ast.operator, _cp_ast.unaryop, _cp_ast.cmpop, _cp_ast.boolop)
_CP_MAX_SRC = 100000
_CP_MAX_DEPTH = 400


class _CpRejected(Exception):
  """The text is not a plain value expression."""


class _CpNotPlain(Exception):
  """The value is not built from builtin data types."""


class _CpNonDeterministic(Exception):
  """Two calls with fresh arguments disagreed."""


def _cp_walk(tree):
  """ast.walk without looking anything up in the ast module at call time."""
  todo = [tree]
  while todo:
    node = todo.pop()
    yield node
    for field in type(node)._fields:
      value = getattr(node, field, None)
      if type(value) is list:
        todo.extend(v for v in value if isinstance(v, _CP_AST_NODE))
      elif isinstance(value, _CP_AST_NODE):
        todo.append(value)


def _cp_parse_ast(src, mode):
  return _cp_compile(src, "<value>", mode, _CP_ONLY_AST)


def _cp_check(tree, names):
  bound = set()
  for node in _cp_walk(tree):
    if isinstance(node, _cp_ast.arg):
      bound.add(node.arg)
    elif isinstance(node, _cp_ast.comprehension):
      for target in _cp_walk(node.target):
        if isinstance(target, _cp_ast.Name):
          bound.add(target.id)
  for node in _cp_walk(tree):
    if not isinstance(node, _CP_NODES):
      raise _CpRejected(f"{type(node).__name__} is not allowed in a value")
    if isinstance(node, _cp_ast.Attribute) and _CP_BAD_ATTR.search(node.attr):
      raise _CpRejected(f"attribute {node.attr!r} is not allowed in a value")
    if isinstance(node, _cp_ast.Name):
      if node.id.startswith("__") or node.id.startswith("_cp"):
        raise _CpRejected(f"name {node.id!r} is not allowed in a value")
      if node.id not in bound and node.id not in names and node.id not in _CP_SAFE_CALLS:
        raise _CpRejected(f"unknown name {node.id!r}")
    if isinstance(node, _cp_ast.arguments) and (node.vararg or node.kwarg or node.kw_defaults
                                                 or node.defaults):
      raise _CpRejected("lambda defaults and *args are not allowed in a value")


def _cp_parse(src, names):
  if type(src) is not str or len(src) > _CP_MAX_SRC:
    raise _CpRejected("value text missing or too long")
  tree = _cp_parse_ast(src.strip(), "eval")
  _cp_check(tree, names)
  return tree


def _cp_eval(src, names=None):
  names = dict(names or {})
  tree = _cp_parse(src, names)
  scope = dict(_CP_SAFE_CALLS)
  scope.update(names)
  scope["__builtins__"] = {}
  return eval(compile(tree, "<value>", "eval"), scope)  # pylint: disable=eval-used


def _cp_call_args(src, names=None):
  """Evaluates "1, 'a', k=2" into (args, kwargs)."""
  names = dict(names or {})
  names["_cp_collect"] = lambda *args, **kwargs: (args, kwargs)
  text = src.strip()
  tree = _cp_parse_ast(f"_cp_collect({text}\n)", "eval")
  call = tree.body
  if not isinstance(call, _cp_ast.Call) or not isinstance(call.func, _cp_ast.Name):
    raise _CpRejected("not an argument list")
  for part in list(call.args) + [k.value for k in call.keywords]:
    _cp_check(_cp_ast.Expression(part), names)
  scope = dict(_CP_SAFE_CALLS)
  scope.update(names)
  scope["__builtins__"] = {}
  return eval(compile(tree, "<args>", "eval"), scope)  # pylint: disable=eval-used


_CP_DICT_TYPES = (dict, _cp_collections.OrderedDict, _cp_collections.Counter,
                  _cp_collections.defaultdict)


def _cp_canon(value, _depth=0, _stack=None):
  """Canonical text; equal texts <=> equal builtin values (NaN never equals anything)."""
  stack = set() if _stack is None else _stack
  if _depth > _CP_MAX_DEPTH:
    raise _CpNotPlain("value nested too deeply")
  kind = type(value)
  if value is None:
    return "N"
  if value is Ellipsis:
    return "E"
  if kind is bool or kind is int:
    return f"n{int(value)}"
  if kind is float:
    if _cp_isnan(value):
      return "nan#" + _cp_urandom(8).hex()
    if _cp_isinf(value):
      return "f" + ("inf" if value > 0 else "-inf")
    if value == int(value):
      return f"n{int(value)}"
    return "f" + float.__repr__(value)
  if kind is complex:
    if value.imag == 0:
      return _cp_canon(value.real, _depth + 1, stack)
    return "c(" + _cp_canon(value.real) + "," + _cp_canon(value.imag) + ")"
  if kind is str:
    return "s" + str.__repr__(value)
  if kind is bytes:
    return "b" + bytes.__repr__(value)
  if kind is range:
    return "r" + str((len(value), value.start if len(value) else 0,
                      value.step if len(value) > 1 else 0))
  if id(value) in stack:
    raise _CpNotPlain("self-referencing value")
  stack.add(id(value))
  try:
    sub = lambda item: _cp_canon(item, _depth + 1, stack)
    if kind is list:
      return "L[" + ",".join(map(sub, value)) + "]"
    if kind is tuple:
      return "T(" + ",".join(map(sub, value)) + ")"
    if kind in (set, frozenset):
      return "S{" + ",".join(sorted(map(sub, value))) + "}"
    if kind in _CP_DICT_TYPES:
      return "D{" + ",".join(sorted(sub(k) + ":" + sub(v) for k, v in dict.items(value))) + "}"
    if kind is _cp_collections.deque:
      return "Q[" + ",".join(map(sub, value)) + "]"
  finally:
    stack.discard(id(value))
  raise _CpNotPlain(f"{kind.__name__} is not a builtin data type")


def _cp_is_plain(value):
  try:
    _cp_canon(value)
    return True
  except (_CpNotPlain, RecursionError):
    return False


def _cp_run_program(src):
  """Executes a program in its own namespace (so it cannot rebind these helpers by name)."""
  namespace = {"__name__": "__main__", "__builtins__": _cp_builtins}
  exec(compile(src, "<program>", "exec"), namespace)  # pylint: disable=exec-used
  return namespace


def _cp_plain_names(namespace):
  return {k: v for k, v in namespace.items()
          if not k.startswith("_") and k.isidentifier() and _cp_is_plain(v)}


def _cp_truncate(text, max_length=400):
  """AZR's gold-output truncation: head 200 + '...' + tail 200 beyond 400 chars."""
  if len(text) <= max_length:
    return text
  half = max_length // 2
  return text[:half] + "..." + text[-half:]


def _cp_gold_output(f, args_src, names):
  """AZR's determinism check: two calls on fresh arguments must agree; returns the gold repr."""
  args1, kwargs1 = _cp_call_args(args_src, names)
  args2, kwargs2 = _cp_call_args(args_src, names)
  first = f(*args1, **kwargs1)
  second = f(*args2, **kwargs2)
  first_repr, second_repr = _cp_repr(first), _cp_repr(second)
  if type(first_repr) is not str or type(second_repr) is not str:
    raise _CpNotPlain("__repr__ returned a str subclass")
  if bool(first != second) or first_repr != second_repr:
    raise _CpNonDeterministic("two calls with the same input returned different values")
  return _cp_truncate(str.strip(first_repr))


def _cp_canon_or_reason(thunk):
  """Runs thunk and canonicalises its value; failures become '!reason' (never a canon text)."""
  try:
    return _cp_canon(thunk())
  except BaseException as e:  # pylint: disable=broad-except
    return "!" + type(e).__name__


def _cp_dumps(values):
  """JSON list of str, written with the C string encoder bound above (not json.dumps)."""
  return "[" + ", ".join([_cp_encode_str(v) for v in values]) + "]"
