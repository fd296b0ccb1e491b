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
result descriptor: see sandbox_rules.py. This file is imported by the sandbox zygote as a plain
script: it must not import the package.
"""
import _ast
import builtins
import codecs
import gc
import importlib
import json
import marshal
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
    self.builtins["__build_class__"] = builtins.__build_class__
    self.builtins["__import__"] = self._importer()
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
  return compile(tree, "<program>", "exec")


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
