"""Static rules that keep a proposer's program away from the interpreter's internals.

A proposer program runs in the same sandbox process as the trusted helpers that
compute its gold output (determinism check, repr, canonical text). These rules
reject the ways a program could reach and patch those helpers or the builtins
they use, so the gold output is what `f` really returns:

- attribute chains to internals: any attribute whose name starts with "_"
  (`repr.__self__`, `f.__globals__`, `().__class__.__subclasses__`, `sys._getframe`),
  frame/code/generator attributes (`f_back`, `gi_frame`, `tb_frame`, `co_consts`, ...),
  and string-driven attribute access (`attrgetter`, `methodcaller`, `get_field`,
  `get_type_hints`, `ForwardRef`, `mro`);
- names that reach them: `getattr`/`setattr`/`delattr`, `vars`, `globals`, `locals`,
  `eval`/`exec`/`compile`/`__import__`, `breakpoint`, and any dunder name
  (`__builtins__`, `__loader__`, `__class__` ...);
- modules that expose them (`sys`, `gc`, `inspect`, `ctypes`, `types`, `builtins`,
  `importlib`, `pickle`, `marshal`, ...; any module or imported name starting with "_");
- writes to attributes (`json.dumps = ...`, `del ast.walk`): a program cannot patch a
  module or class the helpers use;
- dunder names or `{0.__x}` format fields inside string literals.

Nothing here executes code; `unsafe_reason(tree)` walks an already parsed AST.
"""
import ast
import re
from typing import Optional

BANNED_NAMES = frozenset((
    "getattr", "setattr", "delattr", "vars", "globals", "locals", "eval", "exec", "compile",
    "__import__", "breakpoint"))
BANNED_ATTRS = frozenset(("mro", "attrgetter", "methodcaller", "get_field", "get_value",
                          "get_type_hints", "ForwardRef", "Formatter"))
_BANNED_ATTR_PREFIX = re.compile(r"^(_|f_|gi_|cr_|ag_|tb_|co_)")
# Introspection, code loading, serialisation that calls functions, processes and the OS.
BANNED_MODULES = frozenset((
    "sys", "gc", "inspect", "ctypes", "types", "builtins", "importlib", "imp", "zipimport",
    "pkgutil", "runpy", "os", "posix", "nt", "pickle", "marshal", "copyreg", "shelve", "code",
    "codeop", "pdb", "bdb", "trace", "tracemalloc", "faulthandler", "signal", "mmap", "resource",
    "atexit", "weakref", "threading", "multiprocessing", "concurrent", "subprocess", "socket",
    "asyncio", "timeit", "doctest", "unittest", "pydoc", "cProfile", "profile", "dis",
    "py_compile", "compileall", "sysconfig", "site", "shutil", "tempfile", "pathlib", "glob",
    "fcntl", "pty", "tty", "termios", "select", "selectors", "ssl", "urllib", "http", "ftplib",
    "smtplib", "sqlite3", "dbm", "ensurepip", "venv", "platform", "ast", "symtable", "opcode",
    "linecache", "tokenize", "traceback", "warnings", "logging", "io"))
_DUNDER = re.compile(r"^__.*[A-Za-z0-9]")
_DUNDER_IN_TEXT = re.compile(r"__[A-Za-z0-9_]*[A-Za-z0-9]__")
_FORMAT_FIELD_TO_PRIVATE = re.compile(r"\{[^{}]*[.\[]\s*_")


def _module_reason(module: str) -> Optional[str]:
  parts = module.split(".")
  for part in parts:
    if part in BANNED_MODULES or part.startswith("_"):
      return f"module {module!r} is not allowed ({part})"
  return None


def _name_reason(name: str) -> Optional[str]:
  if name in BANNED_NAMES:
    return f"name {name!r} is not allowed"
  if _DUNDER.match(name):
    return f"dunder name {name!r} is not allowed"
  return None


def _attr_reason(attr: str) -> Optional[str]:
  if _BANNED_ATTR_PREFIX.match(attr) or attr in BANNED_ATTRS:
    return f"attribute {attr!r} is not allowed"
  return None


def unsafe_reason(tree: ast.AST) -> Optional[str]:
  """Why the program could reach or patch interpreter internals; None when it cannot."""
  for node in ast.walk(tree):
    reason = None
    if isinstance(node, ast.Import):
      for alias in node.names:
        reason = reason or _module_reason(alias.name)
    elif isinstance(node, ast.ImportFrom):
      reason = _module_reason(node.module or "")
      for alias in node.names:
        reason = reason or _name_reason(alias.name) or (
            _attr_reason(alias.name) if alias.name != "*" else None)
    elif isinstance(node, ast.Name):
      reason = _name_reason(node.id)
    elif isinstance(node, ast.Attribute):
      reason = _attr_reason(node.attr)
      if reason is None and not isinstance(node.ctx, ast.Load):
        reason = "assigning or deleting an attribute is not allowed"
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      reason = _name_reason(node.name)
    elif isinstance(node, ast.arg):
      reason = _name_reason(node.arg)
    elif isinstance(node, ast.keyword) and node.arg is not None:
      reason = _name_reason(node.arg)
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
      for name in node.names:
        reason = reason or _name_reason(name)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      if _DUNDER_IN_TEXT.search(node.value):
        reason = "a dunder name inside a string is not allowed"
      elif _FORMAT_FIELD_TO_PRIVATE.search(node.value):
        reason = "a format field reaching a '_' attribute is not allowed"
    if reason:
      return reason
  return None
