"""The continuous engine on 8 simulated devices equals the one-device engine (fp32, tiny model).

Run by tests/test_eight_devices.py in its 8-device subprocess with the other 8-device cases (the device
count is fixed before jax is imported). Dense cache on meshes (2,2,2) and (1,2,4) (kv heads replicated:
2 kv heads do not split 4 ways), paged cache on (2,2,2), (8,1,1) and (1,2,4) (the pool split over the
batch shards, a pool too small for every row: rows preempted and restarted), sampled rows with eos,
stop-free budgets of 1..20 and 2 samples per prompt through more requests than slots: the same tokens
(exactly) and log-probs (to 1e-5: tensor splits change float summation order) as the dense engine on
one device, the state laid out as the rules say, dense slots from a per-device memory budget times
the batch devices, every page back in its shard's pool, and on_finish reports.
"""
import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from compassplay_jax.infra import sharding as sh  # noqa: E402
from compassplay_jax.models.config import ModelConfig  # noqa: E402
from compassplay_jax.models.decoder import init_decoder  # noqa: E402
from compassplay_jax.sampling import SamplingConfig, batching  # noqa: E402
from compassplay_jax.sampling.continuous import ContinuousEngine  # noqa: E402
from compassplay_jax.sampling.rollout_engine import Request  # noqa: E402

if jax.device_count() != 8:
  pytest.skip(f"needs 8 devices, have {jax.device_count()}", allow_module_level=True)

CFG = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2)
PROMPT_LENGTHS = (9, 3, 20, 5, 14, 2, 11, 7, 16, 4)
BUDGETS = (12, 6, 20, 1, 12, 17, 9, 20, 3, 14)
# Five eos ids: a random model picks one in ~5% of steps, so some rows end on eos and some at budget.
CONFIG = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=20, n_samples=2, eos_ids=(3, 4, 5, 6, 7),
                        bucket_lengths=(8, 16, 32))


def _requests():
  rng = np.random.default_rng(0)
  return [Request([int(t) for t in rng.integers(8, CFG.vocab_size, n)], max_new_tokens=b)
          for n, b in zip(PROMPT_LENGTHS, BUDGETS)]


@pytest.fixture(scope="module")
def model():
  graphdef, params = nnx.split(init_decoder(CFG, seed=3))
  engine = ContinuousEngine(graphdef, None, params, slots=8, chunk_tokens=4, cache_length=64)
  want = engine.generate(_requests(), CONFIG, jax.random.key(5))
  assert {"eos", "length"} <= set(want.finish_reasons)  # both stop conditions occur
  assert engine.stats.inserts == len(want) and engine.stats.prefills < engine.stats.prompts
  return graphdef, params, want


MESH_CASES = [((2, 2, 2), "dense"), ((1, 2, 4), "dense"), ((2, 2, 2), "paged"), ((8, 1, 1), "paged"),
              ((1, 2, 4), "paged")]
MESH_IDS = {(2, 2, 2): "dp2fsdp2tp2", (8, 1, 1): "dp8", (1, 2, 4): "fsdp2tp4"}
PAGE_SIZE, SHARD_PAGES = 4, 16  # rows need up to 13 pages of 4 (bucket 32 + 20): a shard holds one such row


@pytest.mark.parametrize("shape,layout", MESH_CASES, ids=[f"{MESH_IDS[m]}-{k}" for m, k in MESH_CASES])
def test_sharded_engine_equals_one_device(model, shape, layout):
  graphdef, params, want = model
  mesh = sh.make_mesh(shape)
  divisor = sh.batch_divisor(mesh)
  tensor = mesh.shape["tensor"]
  if layout == "dense":
    # 4 slots per device by the budget: exactly what four slots and a one-row prefill need.
    budget = 4 * batching.bytes_per_slot(CFG, 64, "float32", tensor) + batching.bytes_per_row(CFG, 32, 0)
    engine = ContinuousEngine(graphdef, None, params, memory_budget_bytes=budget, chunk_tokens=4, cache_length=64,
                              mesh=mesh, max_prefill_tokens=32, shrink_floor=1, kv_layout="dense")
  else:
    engine = ContinuousEngine(graphdef, None, params, slots=4 * divisor, chunk_tokens=4, cache_length=64, mesh=mesh,
                              max_prefill_tokens=32, shrink_floor=1, kv_layout="paged", page_size=PAGE_SIZE,
                              num_pages=SHARD_PAGES)
    decode_args = _first_decode_args(engine)
  reported = {}
  got = engine.generate(_requests(), CONFIG, jax.random.key(5),
                        on_finish=lambda r, t, text, why: reported.setdefault(r, (t, why)))
  slots = min(4 * divisor, 32)  # the budget's, or the call's 20 rows rounded up to a power of two
  assert engine.stats.slots == slots
  assert min(engine.stats.slot_sizes) < slots  # the drain shrank the slots (each device its own rows)
  for r in range(len(want)):
    np.testing.assert_array_equal(got.tokens[r], want.tokens[r], err_msg=f"row {r} on {shape}")
    np.testing.assert_allclose(got.logprobs[r], want.logprobs[r], atol=1e-5, err_msg=f"row {r} on {shape}")
    assert got.finish_reasons[r] == want.finish_reasons[r]
    np.testing.assert_array_equal(reported[r][0], want.tokens[r])
  assert sorted(reported) == list(range(len(want)))
  state = engine._state
  if layout == "paged":
    pool = engine.pool
    assert pool.shards == divisor and pool.num_pages == SHARD_PAGES * divisor
    pool.check()
    assert pool.free == pool.capacity  # every page back, in its own shard
    assert engine.stats.peak_pages > 0
    # Where a shard gets several rows the pool runs short: rows preempted, restarted, still equal
    # (dp8 spreads the 20 rows over 32 slots).
    assert engine.stats.preempted > 0 or divisor == 8
    heads = "tensor" if CFG.num_key_value_heads % tensor == 0 and tensor > 1 else None
    for layer in state.pages:
      for pages in layer:
        assert pages.sharding.mesh.shape == mesh.shape
        assert pages.sharding.spec == P(heads, sh.BATCH_AXES)  # pages over the batch shards
        assert pages.sharding.shard_shape(pages.shape)[1] == SHARD_PAGES
    assert state.done.sharding.spec == sh.fit_spec(P(sh.BATCH_AXES), state.done.shape, mesh)
    if shape == (2, 2, 2):
      _decode_moves_no_page(engine, graphdef, decode_args[0])
    return
  # Every array of the slot state lives on this mesh: slots over (data, fsdp), kv heads over tensor.
  for layer in state.cache:
    for cache in layer:
      assert cache.sharding.mesh.shape == mesh.shape
      assert cache.sharding.spec == sh.fit_spec(P(sh.BATCH_AXES, None, "tensor"), cache.shape, mesh)
      assert cache.sharding.spec[0] is not None  # slots really split
  assert state.done.sharding.spec == sh.fit_spec(P(sh.BATCH_AXES), state.done.shape, mesh)
  for path, leaf in jax.tree_util.tree_leaves_with_path(engine.params):
    assert leaf.sharding.spec == sh.param_spec(sh.path_str(path), leaf.shape, mesh, CFG.head_dim)


def _first_decode_args(engine):
  """Records the shapes and shardings of every paged decode call's arguments (a list, filled as it runs)."""
  calls, run = [], engine.paged_programs.decode_paged

  def spy(graphdef, *args, **kw):
    calls.append(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
                              if isinstance(x, jax.Array) else x, args))
    return run(graphdef, *args, **kw)
  engine.paged_programs.decode_paged = spy
  return calls


# An HLO collective's result: "%x = f32[8,1,16]{2,1,0} all-reduce(" or a tuple "(f32[..]{..}, ..) all-reduce(".
COLLECTIVE = re.compile(r" = (\S+|\(.*?\)) (?:all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)"
                        r"(?:-start)?\(")


def _decode_moves_no_page(engine, graphdef, args):
  """The paged decode program (its HLO after SPMD partitioning) moves no KV page between devices: no
  collective carries arrays of pages (..., page_size, head_dim) or of gathered blocks (..., block
  columns, head_dim); each device writes and reads its own shard of the pool (write_and_attend)."""
  hlo = engine.paged_programs.decode_paged_jit(graphdef, args, sampler=CONFIG.sampler, eos_ids=CONFIG.eos_ids,
                                               attention="gather").lower(*args).compile().as_text()
  shapes = [dims for m in COLLECTIVE.finditer(hlo) for dims in re.findall(r"\[([0-9,]*)\]", m.group(1))]
  assert "8,1,16" in shapes  # the activations' collectives are seen (tensor-parallel matmuls, 8 rows a shard)
  page_data = (f",{PAGE_SIZE},{CFG.head_dim}", f",{engine.page_block * PAGE_SIZE},{CFG.head_dim}")
  assert not [x for x in shapes if x.endswith(page_data)], shapes


def test_decode_and_insert_keep_the_cache_split(model):
  """The sharded decode and insert programs never gather a whole KV cache onto one device (insert
  gathers only the prefill's rows, which any slot may need)."""
  graphdef, params, _ = model
  mesh = sh.make_mesh((2, 2, 2))
  engine = ContinuousEngine(graphdef, None, params, slots=8, chunk_tokens=4, cache_length=64, mesh=mesh)
  engine.precompile(CONFIG, (8,), 0)
  state = engine._state
  host_done = np.ones((8,), bool)
  jitted = engine.programs.decode_chunk_jit(graphdef, engine.params, state, host_done, np.int32(9),
                                            sampler=CONFIG.sampler, eos_ids=CONFIG.eos_ids, window=64)
  hlo = jitted.lower(engine.params, state, host_done, np.int32(9)).compile().as_text()
  prefix = engine.programs.prefill_prompts(graphdef, engine.params, np.ones((4, 8), np.int32),
                                           np.ones((4, 8), np.int32), np.zeros((4,), np.int32), jax.random.key(0),
                                           n_samples=CONFIG.n_samples, sampler=CONFIG.sampler, cache_dtype="float32")
  admit = engine.programs.admit_arrays(8)
  insert = next(fn for key, fn in engine.programs._jits.items() if key[0] == "insert")
  insert_hlo = insert.lower(state, prefix, admit, jax.random.key(0)).compile().as_text()
  full = f"f32[8,64,{CFG.num_key_value_heads},{CFG.head_dim}]"
  for text in (hlo, insert_hlo):
    gathers = [line for line in text.splitlines() if "all-gather" in line and full in line]
    assert not gathers, gathers[:3]
  assert "all-gather" in insert_hlo  # the prefix rows are gathered (the check sees all-gathers)


def test_shrinking_keeps_each_devices_own_rows():
  """slots.compact on the mesh (shard_map, local indices) equals the one-device gather of the same
  global rows, and the new slots stay split over the batch axes."""
  from compassplay_jax.sampling import slots as slots_lib
  mesh = sh.make_mesh((2, 2, 2))
  on_mesh, one = slots_lib.SlotPrograms(mesh, CFG.head_dim), slots_lib.SlotPrograms(None)
  state = one.init_slots(jax.random.key(0), cfg=CFG, slots=8, length=16, chunk=2, cache_dtype="float32")
  rng = np.random.default_rng(1)
  state = state._replace(first_col=np.arange(8, dtype=np.int32) * 3, done=np.zeros((8,), bool),
                         cache=[type(c)(*(rng.normal(size=c.k.shape).astype(np.float32) for _ in range(2)))
                                for c in state.cache])
  keep, valid = np.array([1, 0, 1, 0], np.int32), np.array([True, False, True, True])
  want = one.compact(state, np.arange(4) * 2 + keep, valid)  # 2 slots per shard: global = 2 * shard + local
  placed = jax.device_put(state, jax.tree.map(lambda s: s, on_mesh._rows(state)))
  got = on_mesh.compact(placed, keep, valid)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert list(np.asarray(got.done)) == [False, True, False, False]
  assert got.cache[0].k.sharding.spec == sh.fit_spec(P(sh.BATCH_AXES, None, "tensor"), (4, 16, 2, 8), mesh)
