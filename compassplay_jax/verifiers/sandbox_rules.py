"""What a restricted program may name: allow-lists and the source rules (stdlib only, no execution).

The coding checks run every program (a proposer's `f`, an induction solver's answer) under the
restricted runtime of `sandbox_runtime.py`. Its capabilities are exactly what is listed here:

- ALLOWED_BUILTINS: pure builtins (no `open`, `getattr`, `vars`, `eval`, `__import__`, `id`, ...);
- ALLOWED_MODULES: stdlib modules and, per module, the names a program may use; `import m` gives a
  fresh module object holding only those names (so `typing.sys`, `dataclasses.inspect` do not exist);
- `program_reason(tree)`: the source rules. The only ways from an allowed object to the interpreter's
  internals are attribute names starting with "_" (`__globals__`, `__subclasses__`, `_getframe`),
  the frame/code/traceback attributes (`f_back`, `gi_frame`, `tb_frame`, `co_consts`), and reading
  attributes by a computed name; the rules refuse the first two, and for the third the runtime
  offers no function (`getattr`, `attrgetter`, `vars`, `inspect`, `string.Formatter` are not
  there) or checks the name where it is read (`format_reason` for `str.format`/`format_map`,
  `attr_reason` for `hasattr`; see sandbox_runtime.py). `match` statements, whose class patterns
  read attributes by name, are refused;
- `value_reason(tree, names)`: the rules for value expressions (answers, inputs): literals,
  arithmetic, comprehensions, lambdas, a few pure builtins, public methods.

Imported by the trainer (`domains/coding/static_rules.py` gives the same reasons before a job is
sent) and, as a plain script, by the sandbox zygote (the job process applies the same rules to the
tree it compiles). It must not import the package.
"""
import _ast
import _string
import builtins
import functools
import importlib
import re

# Pure builtins; every exception class is added below. `__build_class__` (class statements) and the
# restricted `__import__` are added by the runtime, never named by a program.
ALLOWED_BUILTINS = frozenset((
    "abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr",
    "classmethod", "complex", "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset",
    "hasattr", "hash", "hex", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max",
    "min", "next", "object", "oct", "ord", "pow", "print", "property", "range", "repr", "reversed",
    "round", "set", "slice", "sorted", "staticmethod", "str", "sum", "super", "tuple", "type", "zip",
    "Ellipsis", "NotImplemented") + tuple(
        name for name, value in vars(builtins).items()
        if isinstance(value, type) and issubclass(value, BaseException)))

ALL_PUBLIC = "*"  # Every public, non-module attribute of the module.
# Module -> names a program may use: ALL_PUBLIC (minus EXCLUDED_NAMES) or a tuple. Left out on
# purpose: anything reading attributes by a computed name (operator.attrgetter/methodcaller,
# string.Formatter, dataclasses, functools.singledispatch/wraps, typing.get_type_hints, inspect),
# clocks and randomness (time, datetime, random: AZR bans them too), I/O, processes and code loading;
# statistics (it imports random, whose after-fork reseeding every job process would pay for).
ALLOWED_MODULES = {
    "math": ALL_PUBLIC,
    "cmath": ALL_PUBLIC,
    "itertools": ALL_PUBLIC,
    "heapq": ALL_PUBLIC,
    "bisect": ALL_PUBLIC,
    "operator": ALL_PUBLIC,
    "collections": ("Counter", "defaultdict", "deque", "OrderedDict", "namedtuple", "ChainMap"),
    "functools": ("reduce", "lru_cache", "cache", "partial", "cmp_to_key", "total_ordering",
                  "cached_property"),
    "re": ("compile", "search", "match", "fullmatch", "split", "findall", "finditer", "sub", "subn",
           "escape", "error", "IGNORECASE", "I", "MULTILINE", "M", "DOTALL", "S", "VERBOSE", "X",
           "ASCII", "A", "UNICODE", "U"),
    "string": ("ascii_letters", "ascii_lowercase", "ascii_uppercase", "digits", "hexdigits",
               "octdigits", "punctuation", "printable", "whitespace", "capwords"),
    "fractions": ("Fraction",),
    "decimal": ("Decimal", "getcontext", "localcontext", "Context", "InvalidOperation",
                "DivisionByZero", "ROUND_HALF_UP", "ROUND_HALF_EVEN", "ROUND_HALF_DOWN",
                "ROUND_UP", "ROUND_DOWN", "ROUND_CEILING", "ROUND_FLOOR", "ROUND_05UP"),
    "typing": ("Any", "Callable", "Dict", "FrozenSet", "Generator", "Iterable", "Iterator", "List",
               "Mapping", "Optional", "Sequence", "Set", "Tuple", "Union", "DefaultDict", "Deque",
               "Hashable", "TypeVar"),
    "json": ("loads", "dumps", "JSONDecodeError"),
    "copy": ("copy", "deepcopy"),
    "array": ("array",),
    "unicodedata": ("category", "name", "lookup", "numeric", "digit", "decimal", "normalize",
                    "bidirectional", "combining", "east_asian_width", "mirrored", "decomposition"),
    "textwrap": ("wrap", "fill", "dedent", "indent", "shorten"),
}
EXCLUDED_NAMES = {"operator": frozenset(("attrgetter", "methodcaller"))}

# Names no program may use, not even for its own variables (the runtime does not have them either).
# Other builtins outside ALLOWED_BUILTINS (`open`, `input`, `id`, ...) are refused where the program
# reads them without binding them itself.
BANNED_NAMES = frozenset(("getattr", "setattr", "delattr", "vars", "globals", "locals", "eval",
                          "exec", "compile", "breakpoint"))
# Attribute names that reach internals (besides every name starting with "_").
BANNED_ATTRS = frozenset(("mro", "attrgetter", "methodcaller", "get_field",
                          "get_value", "get_type_hints", "ForwardRef", "Formatter"))
_BANNED_ATTR_PREFIX = re.compile(r"^(_|f_|gi_|cr_|ag_|tb_|co_)")
_DUNDER = re.compile(r"^__.*[A-Za-z0-9]")
_DUNDER_IN_TEXT = re.compile(r"__[A-Za-z0-9_]*[A-Za-z0-9]__")
# A literal format field reading a banned attribute or a "_" item: refused early (the runtime
# refuses every attribute field anyway, whatever text reaches str.format).
_FORMAT_FIELD_TO_PRIVATE = re.compile(r"\{[^{}]*(\[\s*_|\.\s*(_|f_|gi_|cr_|ag_|tb_|co_))")
MAX_DEPTH = 400  # AST nesting; real programs stay far below (CRUXEval, AZR seeds: < 50).


def module_names(module_name, module=None):
  """The names `module_name` offers a restricted program (imports the real module when needed)."""
  if module is None:
    return _module_names(module_name)
  return _names_of(module_name, module)


@functools.lru_cache(maxsize=None)
def _module_names(module_name):
  allowed = ALLOWED_MODULES[module_name]
  return _names_of(module_name, None if allowed != ALL_PUBLIC else
                   importlib.import_module(module_name))


def _names_of(module_name, module):
  allowed = ALLOWED_MODULES[module_name]
  if allowed != ALL_PUBLIC:
    return frozenset(allowed)
  excluded = EXCLUDED_NAMES.get(module_name, frozenset())
  return frozenset(name for name, value in vars(module).items()
                   if not name.startswith("_") and name not in excluded
                   and type(value) is not type(builtins))


def walk(tree):
  """Every node of an AST (iterative; no lookup in the ast module)."""
  todo = [tree]
  while todo:
    node = todo.pop()
    yield node
    for field in type(node)._fields:
      value = getattr(node, field, None)
      if type(value) is list:
        todo.extend(v for v in value if isinstance(v, _ast.AST))
      elif isinstance(value, _ast.AST):
        todo.append(value)


def depth(tree):
  """The AST's nesting depth (iterative)."""
  deepest, todo = 0, [(tree, 1)]
  while todo:
    node, level = todo.pop()
    deepest = max(deepest, level)
    for field in type(node)._fields:
      value = getattr(node, field, None)
      if type(value) is list:
        todo.extend((v, level + 1) for v in value if isinstance(v, _ast.AST))
      elif isinstance(value, _ast.AST):
        todo.append((value, level + 1))
  return deepest


def _name_reason(name):
  if name in BANNED_NAMES:
    return f"name {name!r} is not available"
  if _DUNDER.match(name):
    return f"dunder name {name!r} is not allowed"
  return None


def attr_reason(attr):
  """Why a program may not read the attribute named `attr` (an exact str); None when it may."""
  if _BANNED_ATTR_PREFIX.match(attr) or attr in BANNED_ATTRS:
    return f"attribute {attr!r} is not allowed"
  return None


def format_reason(text):
  """Why `text.format(...)` or `text.format_map(...)` would read an attribute or a "_" name;
  None when its fields only name arguments and items.

  A field's attributes (`{0.gi_frame}`) are refused whatever their name: format is the one place
  where text names attributes, and no ordinary program needs it. Keys and argument names starting
  with "_" are refused too. Fields nested in a format spec (`{0:{1}}`) are checked like the
  others. The check walks the text in str.format's own order and stops where str.format's parser
  would fail, so nothing it skips would ever be read."""
  return _fields_reason(text, nested=True)


def _fields_reason(text, nested):
  try:
    for _, field, spec, _ in _string.formatter_parser(text):
      if field is None:
        continue
      first, rest = _string.formatter_field_name_split(field)
      if type(first) is str and first.startswith("_"):
        return f"format field {field!r}: a name starting with '_' is not allowed"
      for is_attribute, key in rest:
        if is_attribute:
          return f"format field {field!r}: reading an attribute in a format string is not allowed"
        if type(key) is str and key.startswith("_"):
          return f"format field {field!r}: a key starting with '_' is not allowed"
      if nested and spec:  # str.format expands one level of fields inside a spec.
        reason = _fields_reason(spec, nested=False)
        if reason:
          return reason
  except ValueError:  # Malformed: str.format raises at this very point, before reading further.
    return None
  return None


def _text_reason(value):
  if _DUNDER_IN_TEXT.search(value):
    return "a dunder name inside a string is not allowed"
  if _FORMAT_FIELD_TO_PRIVATE.search(value):
    return "a format field reading a banned attribute or a '_' key is not allowed"
  return None


def _import_reason(node, aliases, module_names_of):
  if isinstance(node, _ast.Import):
    for alias in node.names:
      if alias.name not in ALLOWED_MODULES:
        return f"module {alias.name!r} is not available"
      if alias.asname:
        aliases[alias.asname] = alias.name
      else:
        aliases[alias.name] = alias.name
    return None
  if node.level:
    return "relative imports are not available"
  if node.module not in ALLOWED_MODULES:
    return f"module {node.module!r} is not available"
  offered = module_names_of(node.module)
  for alias in node.names:
    if alias.name != "*" and alias.name not in offered:
      return f"name {alias.name!r} of module {node.module!r} is not available"
  return None


def _nodes_and_depth(tree):
  """Every node of the tree (one iterative pass) and the tree's depth."""
  nodes, deepest, todo = [], 0, [(tree, 1)]
  ast_type = _ast.AST
  while todo:
    node, level = todo.pop()
    nodes.append(node)
    if level > deepest:
      deepest = level
    for field in type(node)._fields:
      value = getattr(node, field, None)
      if type(value) is list:
        todo.extend((v, level + 1) for v in value if isinstance(v, ast_type))
      elif isinstance(value, ast_type):
        todo.append((value, level + 1))
  return nodes, deepest


def _bound_names(nodes):
  """Every name the program binds anywhere (assignments, defs, arguments, imports, handlers)."""
  bound = set()
  for node in nodes:
    if isinstance(node, _ast.Name) and not isinstance(node.ctx, _ast.Load):
      bound.add(node.id)
    elif isinstance(node, (_ast.FunctionDef, _ast.AsyncFunctionDef, _ast.ClassDef)):
      bound.add(node.name)
    elif isinstance(node, _ast.arg):
      bound.add(node.arg)
    elif isinstance(node, (_ast.Import, _ast.ImportFrom)):
      bound.update((a.asname or a.name.split(".")[0]) for a in node.names)
    elif isinstance(node, _ast.ExceptHandler) and node.name:
      bound.add(node.name)
    elif isinstance(node, (_ast.Global, _ast.Nonlocal)):
      bound.update(node.names)
  return bound


_BUILTIN_NAMES = frozenset(vars(builtins))


def program_reason(tree, module_names_of=module_names):
  """Why a program could reach the interpreter's internals or a capability; None when it cannot.

  tree: the program's parsed module (ast.parse, or compile(..., PyCF_ONLY_AST)).
  """
  nodes, deepest = _nodes_and_depth(tree)
  if deepest > MAX_DEPTH:
    return f"nested deeper than {MAX_DEPTH}"
  aliases = {}
  for node in nodes:
    if isinstance(node, (_ast.Import, _ast.ImportFrom)):
      reason = _import_reason(node, aliases, module_names_of)
      for alias in node.names:
        reason = reason or (_name_reason(alias.asname) if alias.asname else None)
      if reason:
        return reason
  bound = _bound_names(nodes)
  for node in nodes:
    reason = None
    kind = type(node)
    if kind is _ast.Name:
      reason = _name_reason(node.id)
      if (reason is None and node.id not in bound and node.id in _BUILTIN_NAMES
          and node.id not in ALLOWED_BUILTINS):
        reason = f"name {node.id!r} is not available"
    elif kind is _ast.Attribute:
      reason = attr_reason(node.attr)
      if reason is None and type(node.ctx) is not _ast.Load:
        reason = "assigning or deleting an attribute is not allowed"
      if (reason is None and type(node.value) is _ast.Name and node.value.id in aliases
          and node.attr not in module_names_of(aliases[node.value.id])):
        reason = f"name {node.attr!r} of module {aliases[node.value.id]!r} is not available"
    elif kind in (_ast.FunctionDef, _ast.AsyncFunctionDef, _ast.ClassDef):
      reason = _name_reason(node.name)
    elif kind is _ast.arg:
      reason = _name_reason(node.arg)
    elif kind is _ast.keyword and node.arg is not None:
      reason = _name_reason(node.arg)
    elif kind in (_ast.Global, _ast.Nonlocal):
      for name in node.names:
        reason = reason or _name_reason(name)
    elif kind is _ast.Match:
      reason = "match statements are not allowed (class patterns read attributes by name)"
    elif kind is _ast.Constant and type(node.value) is str:
      reason = _text_reason(node.value)
    if reason:
      return reason
  return None


# ---------------------------------------------------------------------------------------------
# Value expressions: deduction answers, abduction answers, task inputs.

# Builtins a value expression may call (pure constructors and functions).
VALUE_CALLS = ("abs", "all", "any", "bin", "bool", "bytes", "chr", "complex", "dict", "divmod",
               "enumerate", "filter", "float", "frozenset", "hex", "int", "len", "list", "map",
               "max", "min", "oct", "ord", "pow", "range", "reversed", "round", "set", "slice",
               "sorted", "str", "sum", "tuple", "zip")
_VALUE_NODES = tuple(getattr(_ast, name) for name in (
    "Expression", "Constant", "Tuple", "List", "Set", "Dict", "UnaryOp", "BinOp", "BoolOp",
    "Compare", "IfExp", "Subscript", "Slice", "Starred", "Name", "Call", "Attribute", "Lambda",
    "arguments", "arg", "keyword", "ListComp", "SetComp", "DictComp", "GeneratorExp",
    "comprehension", "JoinedStr", "FormattedValue", "expr_context", "operator", "unaryop", "cmpop",
    "boolop"))
_VALUE_BAD_ATTR = re.compile(r"^(_|gi_|cr_|ag_|f_|tb_|co_)|^(format|format_map|mro)$")
MAX_VALUE_CHARS = 100_000


def value_reason(tree, names=()):
  """Why an expression tree is not a plain value expression; None when it is.

  names: the extra names it may use (plain-data globals of a program).
  """
  if depth(tree) > MAX_DEPTH:
    return f"nested deeper than {MAX_DEPTH}"
  bound = set()
  for node in walk(tree):
    if isinstance(node, _ast.arg):
      bound.add(node.arg)
    elif isinstance(node, _ast.comprehension):
      bound.update(t.id for t in walk(node.target) if isinstance(t, _ast.Name))
  for node in walk(tree):
    if not isinstance(node, _VALUE_NODES):
      return f"{type(node).__name__} is not allowed in a value"
    if isinstance(node, _ast.Attribute) and _VALUE_BAD_ATTR.search(node.attr):
      return f"attribute {node.attr!r} is not allowed in a value"
    if isinstance(node, _ast.Name):
      if node.id.startswith("_"):
        return f"name {node.id!r} is not allowed in a value"
      if node.id not in bound and node.id not in names and node.id not in VALUE_CALLS:
        return f"unknown name {node.id!r}"
    if isinstance(node, _ast.arguments) and (node.vararg or node.kwarg or node.kw_defaults
                                              or node.defaults or node.posonlyargs
                                              or node.kwonlyargs):
      return "lambda defaults and *args are not allowed in a value"
  return None
