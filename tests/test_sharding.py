"""Sharding: rules and mesh arithmetic here (1 device); the 8-device equality cases in a subprocess.

The main pytest process has already imported jax with one CPU device, so tests/sharding_cases.py
runs in tests/test_eight_devices.py's pytest process with XLA_FLAGS=--xla_force_host_platform_device_count=8
(with the other 8-device cases).
"""
import jax
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from compassplay_jax.infra import sharding as sh
from compassplay_jax.costs.memory_report import PAPER_MODELS
from compassplay_jax.models import hf_io


def abstract_mesh(shape):
  return AbstractMesh(tuple(shape), sh.AXES)


def test_mesh_config_parsing_and_resolution():
  assert sh.MeshConfig.from_any("2,2,2").resolve(8) == (2, 2, 2)
  assert sh.MeshConfig.from_any("data=2,fsdp=-1").resolve(8) == (2, 4, 1)
  assert sh.MeshConfig.from_any({"tensor": 4}).resolve(8) == (1, 2, 4)  # fsdp defaults to "the rest"
  assert sh.MeshConfig.from_any({"data": -1, "fsdp": 1, "tensor": 2}).resolve(16) == (8, 1, 2)
  assert sh.MeshConfig.from_any(None).resolve(4) == (1, 4, 1)
  assert sh.make_mesh(None).shape == {"data": 1, "fsdp": 1, "tensor": 1}


@pytest.mark.parametrize("value,match", [
    ((-1, -1, 1), "at most one axis"), ((3, 1, 1), "needs 3 devices"), ((0, 1, 1), "positive"),
    ({"pipeline": 2}, "unknown mesh axis 'pipeline'"), ((2, 2), "needs 3 sizes"), ((3, -1, 1), "not divisible")])
def test_mesh_config_errors(value, match):
  with pytest.raises(sh.ShardingError, match=match):
    sh.MeshConfig.from_any(value).resolve(8)


@pytest.mark.parametrize("name", sorted(PAPER_MODELS))
def test_every_parameter_of_both_families_has_a_rule(name):
  for cfg in (PAPER_MODELS[name], PAPER_MODELS[name].replace(tie_word_embeddings=True, num_hidden_layers=1)):
    _, state = hf_io.abstract_model(cfg)
    for key_path, leaf in jax.tree_util.tree_leaves_with_path(state):
      path = sh.path_str(key_path)
      assert sh.rule_for(path) is not None, path
      assert len(sh.rule_for(path)) <= len(leaf.shape), path


def test_rules_table_entries():
  assert sh.rule_for("layers.3.self_attn.q_proj.kernel") == P("fsdp", "tensor")
  assert sh.rule_for("layers.3.self_attn.o_proj.kernel") == P("tensor", "fsdp")
  assert sh.rule_for("layers.3.mlp.down_proj.kernel") == P("tensor", "fsdp")
  assert sh.rule_for("lm_head.kernel") == P("fsdp", "tensor")
  assert sh.rule_for("embed_tokens") == P("tensor", "fsdp")
  assert sh.rule_for("norm.scale") == P()
  # Optimizer moments and gradients reuse the parameter's rule (matched at the path's end).
  assert sh.rule_for("0.mu.layers.1.mlp.up_proj.kernel") == P("fsdp", "tensor")
  assert sh.rule_for("layers.0.mlp.up_proj.kernel_extra") is None
  with pytest.raises(sh.ShardingError, match="no partition rule for parameter 'foo.weight'"):
    sh.param_spec("foo.weight", (4, 4), abstract_mesh((1, 1, 1)))


def test_whole_heads_or_replicated_over_tensor():
  qwen = PAPER_MODELS["qwen2.5-coder-7b"]  # 28 heads, 4 kv heads of 128
  kv_out, q_out = qwen.num_key_value_heads * qwen.head_dim, qwen.num_attention_heads * qwen.head_dim
  tp4, tp8 = abstract_mesh((1, 2, 4)), abstract_mesh((1, 1, 8))
  assert sh.param_spec("layers.0.self_attn.k_proj.kernel", (3584, kv_out), tp4, 128) == P("fsdp", "tensor")
  # 4 kv heads and 28 query heads do not split 8 ways: replicated over tensor, never split mid-head.
  assert sh.param_spec("layers.0.self_attn.k_proj.kernel", (3584, kv_out), tp8, 128) == P("fsdp")
  assert sh.param_spec("layers.0.self_attn.q_proj.bias", (q_out,), tp8, 128) == P()
  assert sh.param_spec("layers.0.self_attn.o_proj.kernel", (q_out, 3584), tp8, 128) == P(None, "fsdp")
  # Without the head unit the flat dimension (512) would have split 8 ways, through heads.
  assert sh.param_spec("layers.0.self_attn.k_proj.kernel", (3584, kv_out), tp8) == P("fsdp", "tensor")
  assert sh.param_spec("layers.0.mlp.up_proj.kernel", (3584, 18944), tp8, 128) == P("fsdp", "tensor")


def test_fit_spec_drops_axes_that_do_not_divide():
  mesh = abstract_mesh((2, 2, 4))
  assert sh.fit_spec(P("tensor", "fsdp"), (97, 64), mesh) == P(None, "fsdp")  # odd vocabulary
  assert sh.fit_spec(P(("data", "fsdp")), (6,), mesh) == P("data")
  assert sh.fit_spec(P(("data", "fsdp")), (8, 3), mesh) == P(("data", "fsdp"))


def test_logical_activation_rules():
  assert sh.logical_spec("batch", "length", "vocab") == P(("data", "fsdp"), None, "tensor")
  with pytest.raises(sh.ShardingError, match="unknown logical axis 'time'"):
    sh.logical_spec("batch", "time")

