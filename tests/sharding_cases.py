"""Sharded == single-device, on 8 simulated CPU devices. Run by tests/test_sharding.py in a subprocess.

Not collected by the main pytest run (the name has no test_ prefix): the device count must be set
before jax is imported, so this module is its own pytest process:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python3 -m pytest tests/sharding_cases.py
Tiny models: hidden 64, 8 heads of 8, 2 layers, vocab 96; the Qwen2 one has 2 kv heads (sharded over
tensor=2, replicated over tensor=4), the Llama one is tied with 8 kv heads (always sharded).
"""
import math
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from compassplay_jax import sharding as sh  # noqa: E402
from compassplay_jax.models.config import ModelConfig  # noqa: E402
from compassplay_jax.models.decoder import init_decoder  # noqa: E402

if jax.device_count() != 8:
  pytest.skip(f"needs 8 devices, have {jax.device_count()} (set XLA_FLAGS before jax is imported)",
              allow_module_level=True)

MESHES = [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)]
MESH_IDS = ["dp8", "fsdp8", "dp2fsdp2tp2", "fsdp2tp4"]
TOL = dict(rtol=1e-5, atol=1e-5)
CONFIGS = {
    "qwen2": ModelConfig(model_type="qwen2", vocab_size=96, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, attention_bias=True),
    "llama_tied": ModelConfig(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8,
                              tie_word_embeddings=True),
}
N, T = 8, 16


def close(a, b):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)


def tree_close(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    close(x, y)


def batch(vocab, seed=0):
  """Left-padded rows, loss on the last 6 real tokens; row 3 has no loss tokens (cosine 0)."""
  rng = np.random.default_rng(seed)
  lengths = [16, 12, 9, 14, 16, 10, 11, 15]
  tokens = np.zeros((N, T), np.int32)
  mask = np.zeros((N, T), np.int32)
  loss = np.zeros((N, T), np.int32)
  for r, n in enumerate(lengths):
    tokens[r, T - n:] = rng.integers(1, vocab, n)
    mask[r, T - n:] = 1
    if r != 3:
      loss[r, T - 6:] = 1
  return {"tokens": tokens, "attention_mask": mask, "loss_mask": loss}


@pytest.fixture(scope="module", params=list(CONFIGS))
def family(request):
  cfg = CONFIGS[request.param]
  graphdef, params = nnx.split(init_decoder(cfg, seed=1))
  return cfg, graphdef, params


@pytest.fixture(scope="module", params=MESHES, ids=MESH_IDS)
def mesh(request):
  return sh.make_mesh(request.param)


def expected_shard_shape(shape, spec, mesh):
  """Shard shape computed from the spec alone (independent of jax's own bookkeeping)."""
  out = list(shape)
  for dim, axes in enumerate(spec):
    if axes is not None:
      names = axes if isinstance(axes, tuple) else (axes,)
      out[dim] //= math.prod(mesh.shape[a] for a in names)
  return tuple(out)


def assert_rule_shardings(tree, mesh, cfg, prefix_ok=False):
  """Every leaf's actual sharding is the one its rule names, and its shards have that shape."""
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    path = sh.path_str(key_path)
    spec = sh.param_spec(path, leaf.shape, mesh, cfg.head_dim)
    assert leaf.sharding.spec == spec, (path, leaf.sharding.spec, spec)
    assert leaf.sharding.mesh.shape == mesh.shape, path
    want = expected_shard_shape(leaf.shape, spec, mesh)
    assert all(s.data.shape == want for s in leaf.addressable_shards), (path, want)
    # The rule applies verbatim except where whole heads do not divide `tensor` (replicated there).
    rule = sh.rule_for(path)
    if spec != rule:
      assert "tensor" in rule and mesh.shape["tensor"] > 1 and (
          cfg.num_key_value_heads % mesh.shape["tensor"] and (".k_proj" in path or ".v_proj" in path)), path


# ---- mesh and rules -----------------------------------------------------------------------------------

def test_mesh_from_config():
  assert sh.make_mesh((2, 2, 2)).shape == {"data": 2, "fsdp": 2, "tensor": 2}
  assert sh.make_mesh({"data": 2, "tensor": 2}).shape == {"data": 2, "fsdp": 2, "tensor": 2}
  assert sh.make_mesh("data=-1,fsdp=1,tensor=4").shape == {"data": 2, "fsdp": 1, "tensor": 4}
  assert sh.make_mesh(None).shape == {"data": 1, "fsdp": 8, "tensor": 1}
  with pytest.raises(sh.ShardingError, match="needs 12 devices"):
    sh.make_mesh((3, 2, 2))


def test_every_param_has_its_rule_sharding(family, mesh):
  cfg, _, _ = family
  _, params = sh.init_params_sharded(cfg, mesh, seed=1)
  assert_rule_shardings(params, mesh, cfg)
  # Sharded init creates the same values as the single-device init.
  tree_close(params, nnx.split(init_decoder(cfg, seed=1))[1])


# ---- forward and gradients ----------------------------------------------------------------------------

def mean_loss(graphdef, params, b):
  from compassplay_jax.rewards.losses import per_sequence_loss
  return jnp.mean(per_sequence_loss(graphdef, params, b["tokens"], b["loss_mask"], b["attention_mask"]))


def test_forward_and_gradients_match_single_device(family, mesh):
  cfg, graphdef, params = family
  b = batch(cfg.vocab_size)
  fn = lambda p, b: jax.value_and_grad(lambda p: mean_loss(graphdef, p, b))(p)
  logits_fn = lambda p, b: nnx.merge(graphdef, p)(b["tokens"], attention_mask=b["attention_mask"])
  want_loss, want_grads = jax.jit(fn)(params, b)
  want_logits = jax.jit(logits_fn)(params, b)

  sparams = sh.shard_params(params, mesh, cfg.head_dim)
  assert_rule_shardings(sparams, mesh, cfg)
  p_sh, b_sh = sh.tree_shardings(params, mesh, cfg.head_dim), sh.batch_tree_shardings(b, mesh)
  sb = sh.shard_batch(b, mesh)
  loss, grads = jax.jit(fn, in_shardings=(p_sh, b_sh), out_shardings=(sh.replicated(mesh), p_sh))(sparams, sb)
  logits = jax.jit(logits_fn, in_shardings=(p_sh, b_sh),
                   out_shardings=jax.sharding.NamedSharding(mesh, sh.logical_spec("batch", "length", "vocab")))(
                       sparams, sb)
  close(loss, want_loss)
  close(logits, want_logits)
  tree_close(grads, want_grads)
  assert_rule_shardings(grads, mesh, cfg)
