"""The restricted runtime: runs a program and calls its `f` inside a sandbox job (call jobs).

Built once in the zygote (before any job), so every job process starts from the same state:

- `Runtime.builtins`: the program's `__builtins__`, a dict of the allowed builtins only, with an
  `__import__` that returns fresh module objects holding only the allowed names of
  `sandbox_rules.ALLOWED_MODULES` (every allowed module is imported here, so a job never opens a
  file: the call-job seccomp filter has no open, stat, socket or process syscall at all);
- `prepare(program, entries, names)` (in the trusted worker): applies `sandbox_rules.program_reason`
  to the exact tree it compiles, and `sandbox_rules.value_reason` to each entry's text, and returns
  marshalled code objects. The worker is warm: parsing and compiling in the fresh job process
  would copy some 270 pages of the parser's and compiler's memory per job;
- `Runtime.run(payload)` (in the job process): runs the program's code in its own namespace,
  evaluates each entry (a value expression, or an argument list for `f`, `repeat` times on
  freshly built arguments) and encodes every value with `sandbox_values.make_encoder` (exact
  builtin types, C functions bound here). It returns the result body as text; nothing in it comes
  from a method the program defined.

The program has no object that can do I/O or reach this module, the harness's frames or the
result descriptor: see sandbox_rules.py. Where text names an attribute, the name is checked where it
is read (issue 46):

- `str.format`/`format_map`: the worker rewrites every `x.format` and `x.format_map` the program
  reads into `__cp_format__(x, "format")`, which checks the string the method is bound to
  (`sandbox_rules.format_reason`: no attribute fields, no "_" names) before handing the method out;
- `hasattr(x, name)`: False for a name the source rules refuse (`sandbox_rules.attr_reason`);
- `copy.copy`/`deepcopy` (which read and write attributes named by `__reduce_ex__`, `__slotnames__`,
  `__setstate__`): refused for a class the program made at run time with such names
  (`type(name, bases, {...})` with computed dunder keys);
- an audit hook in the job process: every attribute read CPython audits (`tb_frame`, `gi_frame`,
  `cr_frame`, `ag_frame`, `f_code`, `__code__`, ...: the only ways to a frame or a code object)
  raises, however the name was built.

This file is imported by the sandbox zygote as a plain script: it must not import the package.
"""
import _ast
import builtins
import codecs
import gc
import importlib
import json
import marshal
import sys
import types

import sandbox_rules as rules  # pylint: disable=g-import-not-at-top  (sibling plain-script module)
import sandbox_values as values  # pylint: disable=g-import-not-at-top

_ONLY_AST = _ast.PyCF_ONLY_AST
# Codecs loaded in the zygote: a call job cannot open files, so `str.encode(name)` works only for
# these (and the builtin utf-8, latin-1 and ascii fast paths); others raise LookupError.
PRELOADED_CODECS = ("utf_8_sig", "utf_16", "utf_16_le", "utf_16_be", "utf_32", "utf_32_le",
                    "utf_32_be", "ascii", "latin_1", "cp1252", "cp437", "unicode_escape",
                    "raw_unicode_escape", "rot_13", "hex_codec", "shift_jis", "euc_jp", "gbk",
                    "gb2312", "big5", "euc_kr", "koi8_r", "utf_7", "punycode", "cp932")


class ProgramRejected(Exception):
  """The program breaks a rule of sandbox_rules."""


class ValueRejected(Exception):
  """The text is not a plain value expression."""


class NoFunction(Exception):
  """The program defines no callable `f`."""


class Runtime:
  """The restricted builtins and module proxies, and the call harness (see module docstring)."""

  def __init__(self):
    for name in PRELOADED_CODECS:
      try:
        codecs.lookup(name)
      except LookupError:
        pass
    self.proxies = {}
    for name in rules.ALLOWED_MODULES:
      try:
        module = importlib.import_module(name)
      except ImportError:
        continue
      proxy = types.ModuleType(name)
      for attr in sorted(rules.module_names(name, module)):
        if hasattr(module, attr):
          setattr(proxy, attr, getattr(module, attr))
      self.proxies[name] = proxy
    self.builtins = {name: getattr(builtins, name) for name in rules.ALLOWED_BUILTINS
                     if hasattr(builtins, name)}
    # No address or str hash reaches a value: see sandbox_values.make_hash / make_build_class.
    self.builtins["__build_class__"] = values.make_build_class(builtins.__build_class__)
    self.builtins["hash"] = values.make_hash()
    self.builtins["__import__"] = self._importer()
    self.builtins["hasattr"] = _checked_hasattr
    self.builtins[FORMAT_GUARD] = _format_method
    if "copy" in self.proxies:
      _gate_copy(self.proxies["copy"])
    self.value_calls = {name: getattr(builtins, name) for name in rules.VALUE_CALLS}
    self.encode = values.make_encoder()
    self.encode_str = json.encoder.c_encode_basestring_ascii or json.encoder.encode_basestring_ascii

  def _importer(self):
    proxies, import_error = self.proxies, ImportError

    def restricted_import(name, globals=None, locals=None, fromlist=(), level=0):  # pylint: disable=redefined-builtin
      del globals, locals, fromlist
      if level or name not in proxies:
        raise import_error(f"module {name!r} is not available in the sandbox")
      return proxies[name]
    return restricted_import

  # ------------------------------------------------------------------------------------------

  def plain_names(self, namespace):
    """The program's public globals that are plain data (usable in its inputs)."""
    found = {}
    for key, value in dict.items(namespace):
      if type(key) is str and not key.startswith("_") and key.isidentifier():
        try:
          self.encode(value, 1 << 16)
        except (values.NotPlain, values.TooLarge, values.TooDeep, values.SelfReference,
                ValueError, RecursionError):
          continue
        found[key] = value
    return found

  def run(self, payload, max_chars):
    """Result body (JSON text, ASCII) for a payload made by `prepare`; never raises but
    MemoryError. The job process compiles nothing: it runs the worker's code objects."""
    _add_audit_hook(_refuse_internals)  # This job process only; it cannot be removed.
    encode_str = self.encode_str
    status, error_type, error_message, outcomes = "ok", None, None, []
    try:
      namespace = None
      if payload.get("code") is not None:
        namespace = {"__name__": "__main__", "__builtins__": dict(self.builtins)}
        exec(marshal.loads(payload["code"]), namespace)  # pylint: disable=exec-used
        function = dict.get(namespace, "f")
        if function is None or not callable(function):
          raise NoFunction("the program defines no function f")
      names = self.plain_names(namespace) if namespace and payload.get("names") else {}
      for kind, code, repeat, refused in payload["entries"]:
        if refused is not None:
          outcomes.append(["!" + refused] * repeat)
        else:
          outcomes.append(self._entry(kind, marshal.loads(code), repeat, names, namespace,
                                      max_chars))
    except MemoryError:
      status, error_type, error_message = "memory", "MemoryError", "memory limit exceeded"
      outcomes = []
    except BaseException as e:  # pylint: disable=broad-except  (program errors of any kind)
      status, error_type, error_message = "error", _type_name(type(e)), _message(e)
      outcomes = []
    gc.disable()  # Nothing below may run a finalizer of the program.
    parts = ['{"status":', encode_str(status), ',"error_type":',
             "null" if error_type is None else encode_str(error_type), ',"error_message":',
             "null" if error_message is None else encode_str(error_message), ',"outcomes":[']
    parts.append(",".join("[" + ",".join(encode_str(o) for o in entry) + "]" for entry in outcomes))
    parts.append("]}")
    return "".join(parts)

  def _entry(self, kind, code, repeat, names, namespace, max_chars):
    results = []
    scope = dict(self.value_calls)
    scope.update(names)
    scope["_cp_collect"] = _collect
    scope["__builtins__"] = {}
    encode, gc_enable, gc_disable = self.encode, gc.enable, gc.disable
    function = dict.get(namespace, "f") if namespace is not None else None
    for _ in range(repeat):
      try:
        if kind == "value":
          value = eval(code, dict(scope))  # pylint: disable=eval-used
        else:
          args, kwargs = eval(code, dict(scope))  # pylint: disable=eval-used
          value = function(*args, **kwargs)
        gc_disable()  # The encoder runs no program code, not even a finalizer.
        try:
          results.append("+" + encode(value, max_chars))
        finally:
          gc_enable()
        del value
      except MemoryError:
        raise
      except BaseException as e:  # pylint: disable=broad-except
        results.append("!" + _type_name(type(e)) + ":" + _message(e))
    return results


class _PublicNames:
  """The names a value expression may use when the program's plain globals are visible: any name
  not starting with "_" (only the plain ones exist when it is evaluated; others fail there)."""

  def __contains__(self, name):
    return not name.startswith("_")


def compile_value(text, kind, with_names):
  """Code for a value expression (kind "value") or an argument list (kind "call")."""
  if type(text) is not str or len(text) > rules.MAX_VALUE_CHARS:
    raise ValueRejected("value text missing or too long")
  names = _PublicNames() if with_names else ()
  text = text.strip()
  if kind == "value":
    tree = compile(text, "<value>", "eval", _ONLY_AST)
    reason = rules.value_reason(tree, names)
  else:
    tree = compile(f"_cp_collect({text}\n)", "<args>", "eval", _ONLY_AST)
    call = tree.body
    if not isinstance(call, _ast.Call) or not isinstance(call.func, _ast.Name):
      raise ValueRejected("not an argument list")
    reason = None
    for part in list(call.args) + [k.value for k in call.keywords]:
      reason = reason or rules.value_reason(_ast.Expression(part), names)
  if reason:
    raise ValueRejected(reason)
  return compile(tree, "<value>", "eval")


def prepare(program, entries, with_names, module_names_of=rules.module_names):
  """The job payload for a call job, made by the trusted worker: the program's code object and
  each entry's (rules checked, then compiled). Raises ProgramRejected, SyntaxError, ... when the
  program itself cannot run; an entry that cannot be compiled carries its refusal instead."""
  code = None
  if program is not None:
    code = marshal.dumps(compile_program(program, module_names_of))
  compiled = []
  for kind, text, repeat in entries:
    try:
      compiled.append([kind, marshal.dumps(compile_value(text, kind, with_names)), repeat, None])
    except MemoryError:
      raise
    except BaseException as e:  # pylint: disable=broad-except  (SyntaxError, ValueRejected, ...)
      compiled.append([kind, None, repeat, type(e).__name__ + ":" + str(e)[:300]])
  return {"code": code, "entries": compiled, "names": bool(with_names)}


def compile_program(source, module_names_of=rules.module_names):
  """The code object of a program that passes `sandbox_rules.program_reason` (the rules are
  applied to the very tree compiled here); raises ProgramRejected or the parser's error."""
  tree = compile(source, "<program>", "exec", _ONLY_AST)
  reason = rules.program_reason(tree, module_names_of)
  if reason:
    raise ProgramRejected(reason)
  if "format" in source:  # Cheap skip: the name cannot appear otherwise.
    _guard_format_reads(tree)
  return compile(tree, "<program>", "exec")


# ---------------------------------------------------------------------------------------------
# Names read from text (issue 46). Everything here runs inside the job with the program's objects,
# so it keeps no state a program could reach: no default arguments, nothing but module globals.

FORMAT_GUARD = "__cp_format__"  # A dunder name: no program can write, bind or shadow it.
_FORMAT_NAMES = frozenset(("format", "format_map"))
_STR_FORMAT, _STR_FORMAT_MAP = str.format, str.format_map
_BUILTIN_METHOD = type("".format)
_LOCATION = ("lineno", "col_offset", "end_lineno", "end_col_offset")


def _guard_format_reads(tree):
  """Rewrites every read of an attribute `format`/`format_map` into `__cp_format__(x, name)`
  (in place; the rules were applied to this tree first and the rewrite adds only that call)."""
  todo = [tree]
  while todo:
    node = todo.pop()
    for field in type(node)._fields:
      value = getattr(node, field, None)
      if type(value) is list:
        for i, item in enumerate(value):
          if isinstance(item, _ast.AST):
            value[i] = _format_call(item)
            todo.append(value[i])
      elif isinstance(value, _ast.AST):
        setattr(node, field, _format_call(value))
        todo.append(getattr(node, field))
  return tree


def _format_call(node):
  if type(node) is not _ast.Attribute or node.attr not in _FORMAT_NAMES:
    return node
  call = _ast.Call(func=_ast.Name(id=FORMAT_GUARD, ctx=_ast.Load()),
                   args=[node.value, _ast.Constant(value=node.attr)], keywords=[])
  for new in (call, call.func, call.args[1]):
    for name in _LOCATION:
      setattr(new, name, getattr(node, name, None))
  return call


def _format_method(obj, name):
  """`obj.<name>` for name "format"/"format_map"; str's own method only once the string it is
  bound to passes `sandbox_rules.format_reason` (ValueError otherwise)."""
  method = getattr(obj, name)
  if type(method) is _BUILTIN_METHOD:
    target = method.__self__  # (C getters: no program code runs here.)
    if issubclass(type(target), str) and method.__name__ in _FORMAT_NAMES:
      _check_format_text(target)
    return method
  if method is _STR_FORMAT:
    return _checked_format
  if method is _STR_FORMAT_MAP:
    return _checked_format_map
  return method


_passed_texts = {}  # Exact strs already checked (format in a loop checks its text once).


def _check_format_text(text):
  exact = type(text) is str
  if exact and text in _passed_texts:
    return
  reason = rules.format_reason(text)
  if reason:
    raise ValueError(reason + " in the sandbox")
  if exact and len(_passed_texts) < 4096:
    _passed_texts[text] = True


def _checked_format(self, *args, **kwargs):
  """str.format, read unbound (`str.format`, `type(s).format`), with its text checked first."""
  if issubclass(type(self), str):
    _check_format_text(self)
  return _STR_FORMAT(self, *args, **kwargs)  # (A non-str raises str.format's own TypeError.)


def _checked_format_map(self, mapping):
  if issubclass(type(self), str):
    _check_format_text(self)
  return _STR_FORMAT_MAP(self, mapping)


_real_hasattr = builtins.hasattr
_exact_str = str.__str__  # On a str subclass: an exact copy of its text (no program method).


def _checked_hasattr(obj, name):
  """hasattr, False for a name the source rules would refuse (`_x`, `gi_frame`, `mro`, ...)."""
  if type(name) is not str:
    if not issubclass(type(name), str):
      return _real_hasattr(obj, name)  # Raises hasattr's own TypeError.
    name = _exact_str(name)
  if rules.attr_reason(name):
    return False
  return _real_hasattr(obj, name)


# Attribute reads CPython audits are the frame and code attributes (`tb_frame`, `gi_frame`,
# `cr_frame`, `ag_frame`, `f_code`, `gi_code`, `__code__`, ...): no ordinary program or allowed
# module reads them (`namedtuple`/`typing` use `sys._getframe` internally, which stays). Audited
# writes are a function's `__code__` and every attribute of a class (namedtuple sets `__module__`).
_REFUSED_EVENTS = frozenset(("object.__getattr__", "object.__setattr__", "object.__delattr__",
                             "sys._current_frames", "sys.settrace", "sys.setprofile",
                             "gc.get_objects", "gc.get_referrers", "gc.get_referents",
                             "code.__new__", "function.__new__"))
_add_audit_hook = sys.addaudithook


def _refuse_internals(event, args):
  if event not in _REFUSED_EVENTS:
    return
  if event == "object.__getattr__":
    raise AttributeError(f"attribute {args[1]!r} is not available in the sandbox")
  if event.startswith("object."):  # A write: type attributes (namedtuple sets __module__) or code.
    if type(args[1]) is str and args[1] == "__code__":  # (Exact str: no program __eq__ here.)
      raise AttributeError("attribute '__code__' cannot be changed in the sandbox")
    return
  raise RuntimeError(f"{event} is not available in the sandbox")


# copy.copy/deepcopy turn a class's `__reduce_ex__`, `__reduce__`, `__getstate__`, `__setstate__`,
# `__slotnames__` and `__slots__` into attribute reads and writes by name (`setattr(y, key, v)`,
# `getattr(obj, slot)`). A class statement cannot define them; `type(name, bases, ns)` with computed
# keys can. The gate refuses to copy an instance of such a class.
_COPY_HOOKS = frozenset(("__reduce_ex__", "__reduce__", "__getstate__", "__setstate__",
                         "__slotnames__", "__slots__", "__copy__", "__deepcopy__",
                         "__getattr__", "__getattribute__"))
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by Python code (static types are C's).
_type_flags = type.__dict__["__flags__"].__get__
_type_mro = type.__dict__["__mro__"].__get__
_type_dict = type.__dict__["__dict__"].__get__
_trusted_classes = {}  # id -> class: every heap type that existed before any program ran.


def _all_classes():
  found, todo = {}, [object]
  while todo:
    cls = todo.pop()
    if id(cls) not in found:
      found[id(cls)] = cls
      todo.extend(type.__subclasses__(cls))
  return found


def _copy_reason(cls):
  for klass in _type_mro(cls):
    if not _type_flags(klass) & _HEAPTYPE or id(klass) in _trusted_classes:
      continue
    for key, value in _type_dict(klass).items():
      if type(key) is not str:
        return "a class with a non-str attribute name"
      if key in _COPY_HOOKS and not (key == "__slots__" and type(value) is tuple and not value
                                     or key == "__slotnames__" and type(value) is list
                                     and not value):
        return f"a class that defines {key!r} at run time"
  return None


def _copy_getattr(obj, name, *default):
  """The `getattr` of the copy module: copy's every lookup of a copy hook passes here."""
  cls = obj if issubclass(type(obj), type) else type(obj)  # copy.copy looks up __copy__ on cls.
  reason = _copy_reason(cls)
  if reason:
    raise TypeError(f"copying {reason} is not available in the sandbox")
  return getattr(obj, name, *default)


def _gate_copy(proxy):
  """Gives the `copy` proxy the functions of a private copy of the copy module whose `getattr` is
  the gate (the real module, which trusted code may use, is left alone). In the zygote: the
  classes that exist now are the trusted ones."""
  _trusted_classes.update(_all_classes())
  real = importlib.import_module("copy")
  private = types.ModuleType("copy")
  private.getattr = _copy_getattr  # Shadows the builtin for every lookup in the module.
  exec(real.__spec__.loader.get_code("copy"), vars(private))  # pylint: disable=exec-used
  for name in ("copy", "deepcopy"):
    if hasattr(proxy, name):
      setattr(proxy, name, getattr(private, name))


def _collect(*args, **kwargs):
  return args, kwargs


_type_name = type.__dict__["__name__"].__get__
_args_of = BaseException.args.__get__
# Compared by identity only: `in` on a set or tuple would call a metaclass's __hash__ or __eq__.
_KNOWN_EXCEPTIONS = tuple(v for v in vars(builtins).values()
                          if isinstance(v, type) and issubclass(v, BaseException)) + (
                              ProgramRejected, ValueRejected, NoFunction, values.NotPlain,
                              values.TooLarge, values.TooDeep, values.SelfReference)


def _message(error):
  """The first argument of a builtin (or our) exception when it is a str; never program code."""
  kind = type(error)
  for known in _KNOWN_EXCEPTIONS:
    if kind is known:
      break
  else:
    return ""
  args = _args_of(error)
  if len(args) >= 1 and type(args[0]) is str:
    return args[0][:300]
  return ""
