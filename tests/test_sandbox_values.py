"""The plain-value wire format (verifiers/sandbox_values.py), against CPython itself as the oracle.

- 3,000 random plain values: decode(encode(v)) prints exactly as repr(v) (element order of sets,
  Counter's most_common order, OrderedDict after move_to_end ...) and rebuilds a value equal to v;
- values that are not plain data (classes of a program, subclasses of builtins, functions,
  generators, a defaultdict whose factory is a lambda) are refused, and the encoder calls none of
  their methods (each one records a call);
- self-reference, nesting and size limits;
- the decoder is total: mangled encodings and random text raise DecodeError and nothing else.
"""
import collections
import math
import random

import pytest

from compassplay_jax.verifiers import sandbox_values as sv

ENCODE = sv.make_encoder()
SEED = 23


def _random_scalar(rng):
  return rng.choice([
      lambda: None, lambda: Ellipsis, lambda: rng.random() < 0.5,
      lambda: rng.randint(-10**30, 10**30), lambda: rng.randint(-3, 3),
      lambda: rng.choice([0.0, -0.0, 1.5, -2.25, 1e300, 1e-300, math.inf, -math.inf,
                          rng.random() * 1e6]),
      lambda: complex(rng.choice([0.0, -0.0, 1.5]), rng.choice([0.0, -1.0, 2.5])),
      lambda: "".join(rng.choice(["a", "'", '"', "\\", "\n", "\x00", "é", "\u2028", "\udcff",
                                  "😀", " ", "\t"]) for _ in range(rng.randrange(8))),
      lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(6))),
      lambda: range(rng.randint(-5, 5), rng.randint(-5, 10), rng.choice([1, 2, -1, 3])),
  ])()


def _hashable(rng, depth):
  if depth > 2 or rng.random() < 0.6:
    value = _random_scalar(rng)
    return value if not isinstance(value, float) or not math.isnan(value) else 0.0
  if rng.random() < 0.5:
    return tuple(_hashable(rng, depth + 1) for _ in range(rng.randrange(3)))
  return frozenset(_hashable(rng, depth + 1) for _ in range(rng.randrange(4)))


def _random_value(rng, depth=0):
  if depth > 3 or rng.random() < 0.35:
    return _random_scalar(rng)
  items = [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
  pairs = [(_hashable(rng, depth + 1), _random_value(rng, depth + 1))
           for _ in range(rng.randrange(4))]
  kind = rng.randrange(11)
  if kind == 0:
    return items
  if kind == 1:
    return tuple(items)
  if kind == 2:
    return {_hashable(rng, depth + 1) for _ in range(rng.randrange(6))}
  if kind == 3:
    return frozenset(_hashable(rng, depth + 1) for _ in range(rng.randrange(6)))
  if kind == 4:
    return dict(pairs)
  if kind == 5:
    return collections.Counter({k: rng.randint(-2, 3) for k, _ in pairs})
  if kind == 6:
    od = collections.OrderedDict(pairs)
    if od and rng.random() < 0.5:
      od.move_to_end(next(iter(od)))
    return od
  if kind == 7:
    return collections.defaultdict(rng.choice([int, list, None, set, str]), pairs)
  if kind == 8:
    return collections.deque(items, rng.choice([None, 3, 10]))
  if kind == 9:  # A set that grew and shrank: its iteration order is not insertion order.
    s = set(range(rng.randrange(40)))
    for x in list(s)[::2]:
      s.discard(x)
    s.update(_hashable(rng, depth + 1) for _ in range(3))
    return s
  shared = [items]
  return [shared, shared, (shared,)]  # Shared references are written out each time.


def _same(a, b):
  """== (a NaN inside makes == False; the printed forms are compared for those instead)."""
  return a == b or ("nan" in repr(b) and sorted(repr(a)) == sorted(repr(b)))


def test_random_values_print_as_cpython_prints_them():
  rng = random.Random(SEED)
  for _ in range(3000):
    value = _random_value(rng)
    text = ENCODE(value, 1 << 20)
    assert text.isascii()
    decoded = sv.decode(text)
    assert sv.python_repr(decoded) == repr(value), (value, text)
    assert _same(sv.python_value(decoded), value)
    assert type(sv.python_value(decoded)) is type(value)


def test_orders_that_repr_shows_are_kept():
  counter = collections.Counter("abracadabra")  # most_common order, ties by insertion
  od = collections.OrderedDict(a=1, b=2, c=3)
  od.move_to_end("a")
  grown = set(range(100))
  for x in range(0, 100, 3):
    grown.discard(x)
  grown.add(1000)
  for value in (counter, od, grown, {"b": 1, "a": 2}, collections.deque([3, 1], maxlen=2),
                collections.defaultdict(list, {"k": [1]}), collections.Counter(),
                collections.OrderedDict(), set(), frozenset(), (), (1,), [], -0.0, 1e16, 2**64):
    assert sv.python_repr(sv.decode(ENCODE(value, 1 << 16))) == repr(value)


class _Spy:
  """Records every method the encoder might call (it must call none)."""
  calls = []

  def __eq__(self, other):
    _Spy.calls.append("eq")
    return True

  def __hash__(self):
    _Spy.calls.append("hash")
    return 1

  def __repr__(self):
    _Spy.calls.append("repr")
    return "1"

  def __iter__(self):
    _Spy.calls.append("iter")
    return iter([1])

  def __len__(self):
    _Spy.calls.append("len")
    return 1


class _SpyMeta(type):
  def __eq__(cls, other):
    _Spy.calls.append("meta eq")
    return True

  def __hash__(cls):
    _Spy.calls.append("meta hash")
    return 1


class _StrSub(str):
  pass


class _ListSub(list):
  def __iter__(self):
    _Spy.calls.append("list iter")
    return iter([])


def _gen():
  yield 1


@pytest.mark.parametrize("value", [
    _Spy(), [1, _Spy()], {"k": _Spy()}, {_Spy(): 1}, {_Spy()}, (_Spy(),), _StrSub("x"),
    _ListSub([1]), [_ListSub()], lambda: 1, _gen(), object(), type, _SpyMeta("M", (), {}),
    collections.defaultdict(lambda: 0), collections.defaultdict(_SpyMeta("F", (), {})),
    bytearray(b"x"), memoryview(b"x"), collections.ChainMap(), 1j.__class__, NotImplemented,
], ids=lambda v: type(v).__name__)
def test_not_plain_values_are_refused_without_calling_them(value):
  _Spy.calls.clear()
  with pytest.raises(sv.NotPlain):
    ENCODE(value, 1 << 16)
  assert _Spy.calls == []


def test_self_reference_depth_and_size_limits():
  loop = [1]
  loop.append(loop)
  with pytest.raises(sv.SelfReference):
    ENCODE(loop, 1 << 16)
  d = {}
  d["d"] = [d]
  with pytest.raises(sv.SelfReference):
    ENCODE(d, 1 << 16)
  deep = []
  for _ in range(sv.MAX_DEPTH):  # The innermost list is at depth MAX_DEPTH: one too deep.
    deep = [deep]
  with pytest.raises(sv.TooDeep):
    ENCODE(deep, 1 << 20)
  assert sv.decode(ENCODE(deep[0], 1 << 20)) is not None  # MAX_DEPTH levels are fine.
  for big in ("x" * 70000, b"x" * 40000, list(range(10**6)), [[0]] * 20000, {i: i for i in range(10**5)}):
    with pytest.raises(sv.TooLarge):
      ENCODE(big, 1 << 16)
  with pytest.raises(ValueError):  # CPython's own int-to-text limit, as repr() would raise.
    ENCODE(10**5000, 1 << 20)


def test_decoder_is_total():
  rng = random.Random(SEED)
  samples = [ENCODE(_random_value(rng), 1 << 16) for _ in range(300)]
  accepted = rejected = 0
  for i in range(6000):
    text = rng.choice(samples)
    mode = i % 5
    if mode == 0 and text:
      cut = rng.randrange(len(text))
      text = text[:cut]
    elif mode == 1 and text:
      pos = rng.randrange(len(text))
      text = text[:pos] + rng.choice('NETFifcsyrLUSZDCOYQ0123456789:;,"\\-x\udcff') + text[pos:]
    elif mode == 2:
      text = "".join(rng.choice('LDS0123456789:;i"') for _ in range(rng.randrange(40)))
    elif mode == 3:
      text = "L" + str(rng.choice([10**9, 2**63, 5])) + ":" + "N" * rng.randrange(8)
    elif mode == 4:
      text = "L1:" * rng.choice([10, 1000, 5000]) + "N"
    try:
      sv.decode(text)
      accepted += 1
    except sv.DecodeError:
      rejected += 1
  assert accepted + rejected == 6000 and rejected > 1000
  for bad in (None, b"N", 1, "", "NN", "Y1,lambda:i1;i1;", "Q1,x:N", "i;", "s\"\\udcff", "U2:N"):
    with pytest.raises(sv.DecodeError):
      sv.decode(bad)
