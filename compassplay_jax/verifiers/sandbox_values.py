"""Plain values across the sandbox boundary: encoded in the job, decoded and printed by the trainer.

A restricted job returns what `f` returned as *plain data*: None, bool, int, float, complex, str,
bytes, range, Ellipsis, and list, tuple, dict, set, frozenset, collections.Counter, OrderedDict,
defaultdict (builtin-type factory) and deque of plain data. Anything else (a class of the program,
a str subclass, a function, a generator) has no encoding, so the job reports `NotPlain`.

The encoder (`make_encoder`, run in the job process) checks exact types with `type(v) is T` and
reads values only through C functions bound when the zygote started (`int.__repr__`,
`float.__repr__`, json's C string encoder, `dict.items`, `tuple()` of exact containers): it calls no
method a program could define or patch. Shared references are written out again (bounded by
`max_chars`); a value that contains itself is refused.

Wire format (ASCII; one prefix-notation token stream):
  N None   E Ellipsis   T True   F False
  i<int>;  f<float repr>;  c<real repr>,<imag repr>;  s<JSON string>  y<hex>;  r<start>,<stop>,<step>;
  L<n>: list   U<n>: tuple   S<n>: set   Z<n>: frozenset   (then n values)
  D<n>: dict   C<n>: Counter   O<n>: OrderedDict   Y<n>,<factory>: defaultdict   (then n key, value)
  Q<n>,<maxlen or ->: deque   (then n values)

The trainer decodes with `decode` (total: any malformed text raises DecodeError; bounded depth and
size), and prints with `python_repr`, which gives what `repr` gave in the job, element order
included (sets in the job's iteration order). `python_value` rebuilds real objects (for `==`).

This file is imported by the sandbox zygote as a plain script: it must not import the package.
"""
import collections
import itertools
import json
import re

MAX_DEPTH = 400
_CONTAINER_TAGS = {"L": "list", "U": "tuple", "S": "set", "Z": "frozenset", "D": "dict",
                   "C": "Counter", "O": "OrderedDict", "Y": "defaultdict", "Q": "deque"}
MAPPINGS = ("dict", "Counter", "OrderedDict", "defaultdict")
# defaultdict factories that have an encoding (exact builtin types), by name.
FACTORIES = (int, list, set, str, float, dict, tuple, frozenset, bool, bytes, complex)


class NotPlain(Exception):
  """The value (or a part of it) is not plain data."""


class TooLarge(Exception):
  """The encoding would exceed max_chars."""


class TooDeep(Exception):
  """The value is nested deeper than MAX_DEPTH."""


class SelfReference(Exception):
  """The value contains itself."""


class DecodeError(ValueError):
  """The text is not an encoding this module writes."""


# ---------------------------------------------------------------------------------------------
# Address jitter (in a call job that checks determinism). Every fork of a zygote starts from the
# zygote's memory layout, and two calls in one job allocate alike, so the low bits of an address (an
# identity hash, a default repr) would repeat from job to job and call to call. Before the program
# runs and before each value is encoded (so between the calls of an entry), a random number of
# objects of each small size class is kept alive: the next objects land elsewhere in their pools.

JITTER_NOISE_BYTES = 4096  # Random bytes per job (256 shifts), drawn before its seccomp filter.
# pymalloc's classes of 16 to 256 bytes: object(), instances, functions, generators, iterators.
_SIZE_CLASSES = 16
_jitter = {"noise": b"", "at": 0, "ballast": []}  # The job process's own (after the fork).


def begin_jitter(noise):
  """Starts a job's jitter with its random bytes, and shifts its layout once."""
  _jitter.update(noise=noise, at=0, ballast=[])
  jitter()


def jitter():
  """Shifts where the next small objects land (no-op unless begun, or once the bytes are used)."""
  at, noise = _jitter["at"], _jitter["noise"]
  if at + _SIZE_CLASSES > len(noise):
    return
  _jitter["at"] = at + _SIZE_CLASSES
  counts = [n % 16 for n in noise[at:at + _SIZE_CLASSES]]
  ballast = list(map(object.__new__, itertools.repeat(object, counts[0])))  # 16 bytes
  ballast += map(float, range(counts[1]))  # 24 bytes: the 32-byte class
  for size_class in range(2, _SIZE_CLASSES):  # bytes of length n: 33 + n bytes
    ballast += map(bytes, itertools.repeat(16 * size_class - 17, counts[size_class]))
  _jitter["ballast"].append(ballast)


def make_encoder(max_depth=MAX_DEPTH):
  """encode(value, max_chars) -> str, with every function it calls bound now (before any program)."""
  type_, id_, len_, tuple_, str_, int_, float_, complex_, bytes_, range_, list_, dict_, set_ = (
      type, id, len, tuple, str, int, float, complex, bytes, range, list, dict, set)
  bool_, frozenset_, ellipsis = bool, frozenset, Ellipsis
  int_repr, float_repr, bytes_hex = int.__repr__, float.__repr__, bytes.hex
  encode_str = json.encoder.c_encode_basestring_ascii or json.encoder.encode_basestring_ascii
  dict_items, odict_items = dict.items, collections.OrderedDict.items
  counter, odict, defaultdict, deque = (collections.Counter, collections.OrderedDict,
                                        collections.defaultdict, collections.deque)
  dd_factory = collections.defaultdict.default_factory.__get__
  deque_maxlen = collections.deque.maxlen.__get__
  range_start, range_stop, range_step = (range.start.__get__, range.stop.__get__,
                                         range.step.__get__)
  complex_real, complex_imag = complex.real.__get__, complex.imag.__get__
  type_name = type.__dict__["__name__"].__get__
  factories = tuple_((t, t.__name__) for t in FACTORIES)
  sequences = ((list_, "L"), (tuple_, "U"), (set_, "S"), (frozenset_, "Z"), (deque, "Q"))
  mappings = ((dict_, "D"), (counter, "C"), (odict, "O"), (defaultdict, "Y"))
  leave = object()
  jitter_ = jitter

  def encode(value, max_chars):
    jitter_()  # The entry's next call runs elsewhere in memory (runs no program code).
    out, size = [], 0
    path = set_()
    todo = [(value, 0)]
    while todo:
      value, level = todo.pop()
      if value is leave:
        path.discard(level)
        continue
      kind = type_(value)
      if value is None:
        token = "N"
      elif value is ellipsis:
        token = "E"
      elif kind is bool_:
        token = "T" if value else "F"
      elif kind is int_:
        token = "i" + int_repr(value) + ";"
      elif kind is float_:
        token = "f" + float_repr(value) + ";"
      elif kind is complex_:
        token = "c" + float_repr(complex_real(value)) + "," + float_repr(complex_imag(value)) + ";"
      elif kind is str_:
        if len_(value) > max_chars:
          raise TooLarge(f"str of {len_(value)} chars")
        token = "s" + encode_str(value)
      elif kind is bytes_:
        if 2 * len_(value) > max_chars:
          raise TooLarge(f"bytes of {len_(value)}")
        token = "y" + bytes_hex(value) + ";"
      elif kind is range_:
        token = ("r" + int_repr(range_start(value)) + "," + int_repr(range_stop(value)) + ","
                 + int_repr(range_step(value)) + ";")
      else:
        tag = None
        for container, letter in sequences + mappings:
          if kind is container:
            tag = letter
            break
        if tag is not None:
          # Every item takes at least one char: size first, before copying a huge container.
          if len_(value) > max_chars - size:
            raise TooLarge(f"{type_name(kind)} of {len_(value)} items")
          if tag in "DCOY":
            pairs = tuple_(odict_items(value) if kind is odict else dict_items(value))
            items = tuple_(x for pair in pairs for x in pair)
          else:
            items = tuple_(value)
        if tag is None:
          raise NotPlain(type_name(kind))
        if level >= max_depth:
          raise TooDeep(f"nested deeper than {max_depth}")
        key = id_(value)
        if key in path:
          raise SelfReference("the value contains itself")
        count = len_(items) // 2 if tag in "DCOY" else len_(items)
        token = tag + str_(count)
        if tag == "Y":
          factory = dd_factory(value)
          name = "-" if factory is None else None
          for candidate, candidate_name in factories:
            if factory is candidate:
              name = candidate_name
          if name is None:
            raise NotPlain("defaultdict with factory " + type_name(type_(factory)))
          token += "," + name
        elif tag == "Q":
          maxlen = deque_maxlen(value)
          token += "," + ("-" if maxlen is None else int_repr(maxlen))
        token += ":"
        path.add(key)
        todo.append((leave, key))
        todo.extend((item, level + 1) for item in reversed(items))
      size += len_(token)
      if size > max_chars:
        raise TooLarge(f"encoding longer than {max_chars} chars")
      out.append(token)
    return "".join(out)

  return encode


class Node:
  """A decoded container: kind (e.g. "list", "Counter"), items (values, or (key, value) pairs for
  mappings) in the job's iteration order, extra (deque maxlen, defaultdict factory name)."""
  __slots__ = ("kind", "items", "extra")

  def __init__(self, kind, items, extra=None):
    self.kind, self.items, self.extra = kind, items, extra

  def __repr__(self):
    return f"Node({self.kind}, {self.items!r}, {self.extra!r})"


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NUMBER_END = re.compile(r"[^;]*;")
_HEADER = re.compile(r"(\d+)(?:,([^:]*))?:")


def decode(text, max_depth=MAX_DEPTH):
  """The value an encoding describes (scalars as Python objects, containers as Node); DecodeError
  on anything else."""
  if type(text) is not str:
    raise DecodeError("not a str")
  pos, end = 0, len(text)
  root = Node("root", [], 1)
  stack = [[root, 1, []]]  # [node, values still expected, collected values]
  try:
    while True:
      while stack and stack[-1][1] == 0:
        node, _, values = stack.pop()
        if node.kind in MAPPINGS:
          node.items = list(zip(values[0::2], values[1::2]))
        else:
          node.items = values
        if stack:
          stack[-1][2].append(node)
      if not stack:
        break
      if pos >= end:
        raise DecodeError("truncated")
      tag = text[pos]
      pos += 1
      if tag in "NETF":
        value = {"N": None, "E": Ellipsis, "T": True, "F": False}[tag]
      elif tag in "ifcyr":
        found = _NUMBER_END.match(text, pos)
        if not found:
          raise DecodeError("unterminated number")
        body, pos = text[pos:found.end() - 1], found.end()
        value = _scalar(tag, body)
      elif tag == "s":
        found = _STRING.match(text, pos)
        if not found:
          raise DecodeError("bad string")
        value, pos = json.loads(found.group()), found.end()
      elif tag in _CONTAINER_TAGS:
        found = _HEADER.match(text, pos)
        if not found:
          raise DecodeError("bad container header")
        count, extra = int(found.group(1)), found.group(2)
        pos = found.end()
        kind = _CONTAINER_TAGS[tag]
        expected = count * (2 if kind in MAPPINGS else 1)
        if expected > end - pos or len(stack) > max_depth:
          raise DecodeError("container larger or deeper than its text allows")
        node = Node(kind, [], _container_extra(kind, extra))
        stack[-1][1] -= 1
        stack.append([node, expected, []])
        continue
      else:
        raise DecodeError(f"unknown tag {tag!r}")
      stack[-1][1] -= 1
      stack[-1][2].append(value)
  except (ValueError, KeyError, IndexError, RecursionError, MemoryError) as e:
    if isinstance(e, DecodeError):
      raise
    raise DecodeError(f"{type(e).__name__}") from None
  if pos != end:
    raise DecodeError("trailing text")
  return root.items[0]


def _scalar(tag, body):
  if tag == "i":
    return int(body)
  if tag == "f":
    return float(body)
  if tag == "c":
    real, imag = body.split(",")
    return complex(float(real), float(imag))
  if tag == "y":
    return bytes.fromhex(body)
  start, stop, step = (int(x) for x in body.split(","))
  return range(start, stop, step)


def _container_extra(kind, extra):
  if kind == "defaultdict":
    names = {t.__name__: t for t in FACTORIES}
    if extra != "-" and extra not in names:
      raise DecodeError("bad defaultdict factory")
    return None if extra == "-" else extra
  if kind == "deque":
    return None if extra == "-" else int(extra)
  if extra is not None:
    raise DecodeError("unexpected header field")
  return None


def fold(value, leaf, container):
  """Post-order fold without recursion: container(node, folded children) for each Node."""
  todo, done = [(value, False)], []
  while todo:
    item, expanded = todo.pop()
    if type(item) is not Node:
      done.append(leaf(item))
    elif not expanded:
      todo.append((item, True))
      children = ([x for pair in item.items for x in pair] if item.kind in MAPPINGS
                  else item.items)
      todo.extend((child, False) for child in reversed(children))
    else:
      size = len(item.items) * (2 if item.kind in MAPPINGS else 1)
      children = done[len(done) - size:] if size else []
      del done[len(done) - size:]
      done.append(container(item, children))
  return done[0]


def python_value(value):
  """Real Python objects equal to the job's value (for ==; plain data only, built here)."""
  def container(node, children):
    kind = node.kind
    if kind == "list":
      return children
    if kind == "tuple":
      return tuple(children)
    if kind == "set":
      return set(children)
    if kind == "frozenset":
      return frozenset(children)
    if kind == "deque":
      return collections.deque(children, node.extra)
    pairs = list(zip(children[0::2], children[1::2]))
    if kind == "dict":
      return dict(pairs)
    if kind == "OrderedDict":
      return collections.OrderedDict(pairs)
    if kind == "defaultdict":
      factory = None if node.extra is None else {t.__name__: t for t in FACTORIES}[node.extra]
      return collections.defaultdict(factory, pairs)
    result = collections.Counter()
    for key, count in pairs:
      result[key] = count
    return result
  return fold(value, lambda x: x, container)


_ODICT_AS_LIST = repr(collections.OrderedDict(a=1)).startswith("OrderedDict([")


def python_repr(value):
  """What repr(value) gave in the job (CPython's reprs of these types, the job's element order)."""
  def container(node, children):
    kind = node.kind
    if kind in ("list", "tuple", "set", "frozenset", "deque"):
      inner = ", ".join(children)
      if kind == "list":
        return "[" + inner + "]"
      if kind == "tuple":
        return "(" + inner + ("," if len(children) == 1 else "") + ")"
      if kind == "deque":
        return ("deque([" + inner + "]" +
                ("" if node.extra is None else f", maxlen={node.extra}") + ")")
      if not children:
        return kind + "()"
      return "{" + inner + "}" if kind == "set" else "frozenset({" + inner + "})"
    pairs = list(zip(children[0::2], children[1::2]))
    if kind == "Counter":
      if not pairs:
        return "Counter()"
      counts = [python_value(v) for _, v in node.items]
      try:  # Counter.__repr__ prints most_common() order (stable sort on the counts).
        order = sorted(range(len(pairs)), key=counts.__getitem__, reverse=True)
      except TypeError:
        order = range(len(pairs))
      pairs = [pairs[i] for i in order]
    body = "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
    if kind == "dict":
      return body
    if kind == "Counter":
      return "Counter(" + body + ")"
    if kind == "defaultdict":
      factory = "None" if node.extra is None else repr({t.__name__: t for t in FACTORIES}[node.extra])
      return f"defaultdict({factory}, {body})"
    if not pairs:
      return "OrderedDict()"
    if _ODICT_AS_LIST:
      return "OrderedDict([" + ", ".join(f"({k}, {v})" for k, v in pairs) + "])"
    return "OrderedDict(" + body + ")"
  return fold(value, repr, container)


# ---------------------------------------------------------------------------------------------
# Identity: what a restricted program cannot observe (the runtime installs these as builtins).
# An address or a str hash differs from process to process, so a value computed from one is not
# a property of the program and its input (docs/coding_tasks.md, "Determinism across jobs").

# Types whose hash is a function of the value alone (not of an address or of the hash seed).
_VALUE_HASHED = (int, bool, float, complex, range)


def make_hash():
  """hash() for restricted programs: numbers, ranges and tuples/frozensets of them only. Other
  hashes are an address (objects, classes, functions, None in 3.11) or depend on the process's
  hash seed (str, bytes); those raise TypeError."""
  type_, hash_, tuple_, frozenset_, type_error = type, hash, tuple, frozenset, TypeError
  value_hashed = _VALUE_HASHED
  type_name = type.__dict__["__name__"].__get__

  def restricted_hash(value):
    todo = [value]
    while todo:
      item = todo.pop()
      kind = type_(item)
      if kind is tuple_ or kind is frozenset_:
        todo.extend(item)  # Exact types: iterating them runs no program code.
        continue
      for allowed in value_hashed:
        if kind is allowed:
          break
      else:
        raise type_error(f"hash() of a {type_name(kind)!r} value differs between processes")
    return hash_(value)
  return restricted_hash


def make_build_class(build_class):
  """__build_class__ for restricted programs: a class that would print or hash its instances by
  address (object's __repr__ and __hash__) gets a __repr__ that raises and no hash, so its
  instances can be neither shown (repr, str, format, f-strings) nor put in a set or dict."""
  type_, isinstance_, object_, type_error = type, isinstance, object, TypeError
  mro_of = type.__dict__["__mro__"].__get__
  dict_of = type.__dict__["__dict__"].__get__
  set_attr = type.__setattr__  # Not the metaclass's: a program's metaclass cannot intercept it.
  type_name = type.__dict__["__name__"].__get__

  def address_repr(self):
    raise type_error(f"the default repr of a {type_name(type_(self))} object shows its address")

  def restricted_build_class(*args, **kwargs):
    cls = build_class(*args, **kwargs)
    if isinstance_(cls, type_):
      for slot, replacement in (("__repr__", address_repr), ("__hash__", None)):
        owner = None
        for klass in mro_of(cls):
          if slot in dict_of(klass):
            owner = klass
            break
        if owner is object_:
          set_attr(cls, slot, replacement)
    return cls
  return restricted_build_class
