"""The paged KV cache in the continuous engine (kv_layout="paged"): the same rows as the dense engine
(sampled tokens exactly, log-probs to float tolerance, stop strings, eos, budgets, n samples) through a
pool so small that rows are preempted, with every page back in the pool at the end; greedy equal to
transformers; the decode attention kernels (Pallas, interpret mode) against the pure-JAX gather; the
decode step's bytes (XLA cost analysis) scaling with the filled tokens."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.models.loading import load_hf_model
from compassplay_jax.sampling import SamplingConfig
from compassplay_jax.sampling import paged_kernels as pk
from compassplay_jax.sampling.continuous import ContinuousEngine
from compassplay_jax.sampling.rollout_engine import Request
from compassplay_jax.sampling.paged_slots import decode_step_bytes, page_bucket

CFG = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2)
# Page size 4: prompts of whole pages (4, 8: no partial page to copy), of one token, and across pages.
PROMPT_LENGTHS = (4, 9, 1, 13, 8, 3, 17, 6)
BUDGETS = (20, 7, 24, 1, 15, 24, 11, 18)


class _Letters:
  """A tokenizer stand-in: token t decodes to one letter, so stop strings are checkable."""
  pad_token_id = 0

  def decode(self, ids, skip_special_tokens=True):
    return "".join(chr(97 + int(i) % 26) for i in ids)


@pytest.fixture(scope="module")
def rows():
  graphdef, params = nnx.split(init_decoder(CFG, seed=4))
  rng = np.random.default_rng(2)
  requests = [Request([int(t) for t in rng.integers(5, 61, n)], max_new_tokens=b)
              for n, b in zip(PROMPT_LENGTHS, BUDGETS)]
  config = SamplingConfig(temperature=0.8, top_p=0.9, max_new_tokens=24, n_samples=2, eos_ids=(3,),
                          stop_strings=("k", "ba"), bucket_lengths=(8, 16, 32))
  key = jax.random.key(3)
  dense = ContinuousEngine(graphdef, _Letters(), params, slots=4, chunk_tokens=4).generate(requests, config, key)
  # 15 pages of 4 columns for 4 slots: one full row (32 + 24 columns) and little more, so rows are
  # preempted and restarted.
  engine = ContinuousEngine(graphdef, _Letters(), params, slots=4, chunk_tokens=4, kv_layout="paged", page_size=4,
                            num_pages=16)
  finished = []
  paged = engine.generate(requests, config, key, on_finish=lambda r, *rest: finished.append(r))
  return dense, paged, engine, finished, (graphdef, params, requests, config, key)


def test_paged_rows_equal_the_dense_engine_and_every_page_comes_back(rows):
  dense, paged, engine, finished, _ = rows
  for r in range(len(dense)):
    np.testing.assert_array_equal(paged.tokens[r], dense.tokens[r], err_msg=f"row {r}")
    np.testing.assert_allclose(paged.logprobs[r], dense.logprobs[r], atol=1e-5)
  assert paged.finish_reasons == dense.finish_reasons and paged.texts == dense.texts
  assert {"stop", "eos", "length"} <= set(paged.finish_reasons)
  assert sorted(finished) == list(range(len(dense)))  # each row reported once, restarts included
  stats = engine.stats
  assert stats.preempted > 0 and stats.peak_pages <= stats.pages == 15
  engine.pool.check()
  assert engine.pool.free == engine.pool.capacity  # no page leaked
  pool_bytes = sum(x.nbytes for layer in engine._state.pages for x in layer)
  assert engine.release_memory() >= pool_bytes and engine._state is None  # the pool goes back too


def test_paged_greedy_equals_transformers(tmp_path):
  from tests.hf_fixtures import save_tiny_hf_model
  from tests.test_sampling_continuous import _hf_greedy
  directory, hf_model = save_tiny_hf_model(tmp_path, "qwen2")
  graphdef, params = nnx.split(load_hf_model(directory))
  rng = np.random.default_rng(0)
  prompts = [[int(t) for t in rng.integers(1, 50, n)] for n in (5, 12, 3)]
  config = SamplingConfig(temperature=0.0, max_new_tokens=14, n_samples=2, eos_ids=(), bucket_lengths=(16,))
  engine = ContinuousEngine(graphdef, None, params, slots=4, chunk_tokens=8, kv_layout="paged", page_size=8)
  got = engine.generate(prompts, config, 0)
  for r in range(len(got)):
    np.testing.assert_array_equal(got.tokens[r], _hf_greedy(hf_model, prompts[r // 2], 14, None))
  assert engine.pool.free == engine.pool.capacity


def test_the_gpu_kernel_decodes_the_same_rows_through_the_engine(rows):
  """paged_attention="pallas_gpu" (Pallas's GPU paged kernel, interpret mode on CPU) in the engine: its
  pool layout is the kernel's own, each row's page table goes in as it is, and the rows equal the
  dense engine's, preemptions and all. (The TPU kernel reads K and V as bfloat16: tested below on
  its own, ~50 s through the engine in interpret mode.)"""
  dense, _, _, _, (graphdef, params, requests, config, key) = rows
  engine = ContinuousEngine(graphdef, _Letters(), params, slots=4, chunk_tokens=4, kv_layout="paged", page_size=4,
                            num_pages=16, paged_attention="pallas_gpu", paged_interpret=True)
  got = engine.generate(requests, config, key)
  for r in range(len(dense)):
    np.testing.assert_array_equal(got.tokens[r], dense.tokens[r], err_msg=f"row {r}")
    np.testing.assert_allclose(got.logprobs[r], dense.logprobs[r], atol=1e-5)
  assert engine.stats.preempted > 0 and engine.pool.free == engine.pool.capacity
  assert set(engine.stats.page_buckets) == {16}  # one table width: 56 columns = 14 pages, two blocks of 8


def test_auto_layout_is_paged_and_one_engine_switches_layouts(rows):
  """kv_layout="auto" (the config's default) decodes over pages, with the dense rows (on a mesh too:
  tests/sampling_mesh_cases.py). The same engine object runs a dense call between two paged ones: each
  call allocates its own layout's state."""
  dense, _, _, _, (graphdef, params, requests, config, key) = rows
  engine = ContinuousEngine(graphdef, _Letters(), params, chunk_tokens=4, kv_layout="auto", page_size=4,
                            memory_budget_bytes=1 << 24)
  layouts = []
  for layout in ("auto", "dense", "auto"):
    engine.kv_layout = layout
    got = engine.generate(requests, config, key)
    layouts.append("paged" if engine.stats.pages else "dense")
    for r in range(len(dense)):
      np.testing.assert_array_equal(got.tokens[r], dense.tokens[r], err_msg=f"{layout} row {r}")
  assert layouts == ["paged", "dense", "paged"] and engine.pool.free == engine.pool.capacity


def _attention_case(seed=0, b=3, kv=2, g=2, hd=128, ps=16, pages=32, per_row=4):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, kv, g, hd)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(kv, pages, ps, hd)), jnp.float32)  # the pool's layout (paged_slots.py)
  v = jnp.asarray(rng.normal(size=(kv, pages, ps, hd)), jnp.float32)
  table = rng.permutation(np.arange(1, pages))[:b * per_row].reshape(b, per_row).astype(np.int32)
  lengths = np.array([5, 4 * ps, 17], np.int32)[:b]  # inside a page, exactly full pages, one past a page
  return q, k, v, table, lengths


def test_gather_attention_reads_only_filled_pages_and_equals_the_full_table():
  q, k, v, table, lengths = _attention_case()
  ps = k.shape[2]
  want = jax.jit(pk.table_attention)(q, k, v, jnp.asarray(table), jnp.asarray(lengths))
  counts = -(-lengths // ps)  # 1, 4, 2 pages: only these are listed
  for block in (1, 3):  # blocks of one page; blocks of 3 (a row's last block padded with the trash page)
    flat = pk.flat_blocks(table, counts, page_bucket(pk.blocks_for(counts, block)), ps, block)
    got = jax.jit(pk.gather_attention)(q, k, v, *map(jnp.asarray, flat), jnp.asarray(lengths))
    np.testing.assert_allclose(got, want, atol=1e-5)
  # The table reference against plain softmax attention over row 2's 17 columns (numpy).
  q, k, v, want = (np.asarray(x, np.float64) for x in (q, k, v, want))
  keys, vals = (x[:, table[2]].reshape(x.shape[0], -1, x.shape[-1])[:, :17].transpose(1, 0, 2) for x in (k, v))
  s = np.einsum("kgd,nkd->kgn", q[2], keys) / np.sqrt(q.shape[-1])
  p = np.exp(s - s.max(-1, keepdims=True))
  np.testing.assert_allclose(want[2], np.einsum("kgn,nkd->kgd", p / p.sum(-1, keepdims=True), vals), atol=1e-5)


@pytest.mark.parametrize("kind", ["pallas_gpu", "pallas_tpu", "ragged_tpu_reference"])
def test_kernels_in_interpret_mode_equal_the_gather(kind):
  q, k, v, table, lengths = _attention_case()
  if kind == "pallas_tpu":  # that kernel reads K and V as bfloat16 (paged_attention_kernel._maybe_dequantize)
    k, v = (x.astype(jnp.bfloat16).astype(jnp.float32) for x in (k, v))
  want = pk.table_attention(q, k, v, jnp.asarray(table), jnp.asarray(lengths))
  got = pk.kernel_attention(q, k, v, jnp.asarray(table), jnp.asarray(lengths), kind=kind, interpret=True)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_decode_bytes_scale_with_filled_tokens():
  cfg = ModelConfig(vocab_size=64, hidden_size=256, intermediate_size=64, num_attention_heads=8,
                    num_key_value_heads=2, num_hidden_layers=1)
  low = decode_step_bytes(cfg, slots=16, columns=1024, fill=0.1)  # one row at 1024 columns, 15 at 40
  full = decode_step_bytes(cfg, slots=16, columns=1024, fill=1.0)
  assert low["window"] == full["window"] == 1024 and low["dense"] == full["dense"]  # longest row at the cap
  cache = lambda r, name: r[name] - r["base"]
  assert cache(low, "paged") <= 0.25 * cache(low, "dense")
  assert cache(full, "paged") > 3 * cache(low, "paged")


def test_static_batching_over_pages_equals_the_static_engine(rows):
  """The static path over pages: ContinuousEngine(refill="static", kv_layout="paged") admits a new
  batch only once every slot is free (static batching), reads pages, and gives the rows of the
  static engine (StaticEngine: the `generate` sampler, dense micro-batches), preemptions included."""
  from compassplay_jax.sampling.static_engine import StaticEngine
  _, _, _, _, (graphdef, params, requests, config, key) = rows
  want = StaticEngine(graphdef, _Letters(), params).generate(requests, config, key)
  engine = ContinuousEngine(graphdef, _Letters(), params, slots=4, chunk_tokens=4, refill="static", kv_layout="paged",
                            page_size=4, num_pages=16)
  got = engine.generate(requests, config, key)
  for r in range(len(want)):
    np.testing.assert_array_equal(got.tokens[r], want.tokens[r], err_msg=f"row {r}")
    np.testing.assert_allclose(got.logprobs[r], want.logprobs[r], atol=1e-5)
  assert got.finish_reasons == want.finish_reasons and got.texts == want.texts
  assert engine.stats.pages == 15 and engine.pool.free == engine.pool.capacity
  # Static batching: a batch's slots wait for its longest row, so slot-steps exceed the useful ones.
  assert engine.stats.slot_steps > engine.stats.useful_slot_steps
