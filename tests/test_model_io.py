"""Checkpoint I/O: round trip through transformers, real 7B shapes without weights, and bad input."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from compassplay_jax import load_model  # noqa: E402
from compassplay_jax.models import hf_io  # noqa: E402
from compassplay_jax.models.config import ConfigError, ModelConfig  # noqa: E402
from compassplay_jax.models.loading import load_hf_model  # noqa: E402
from compassplay_jax.models.safetensors_io import CheckpointError, write_safetensors  # noqa: E402
from tests.hf_fixtures import left_padded_batch, save_tiny_hf_model, torch_logits  # noqa: E402


def test_round_trip_save_then_transformers_loads(tmp_path):
  directory, hf_model = save_tiny_hf_model(tmp_path, "qwen2", tied=False)
  model = load_hf_model(directory)
  out = tmp_path / "saved"
  hf_io.save_hf(model, model.config, out)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  ids, mask = left_padded_batch(hf_model.config.vocab_size)
  ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
  theirs = torch_logits(reloaded, ids, mask)
  m = mask.astype(bool)
  assert np.max(np.abs(ours[m] - theirs[m])) <= 1e-4
  # And back again into ours: identical parameters.
  again = load_hf_model(out)
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sharded_checkpoint_with_index(tmp_path):
  directory, hf_model = save_tiny_hf_model(tmp_path, "llama")
  sharded = tmp_path / "sharded"
  hf_model.save_pretrained(sharded, max_shard_size="20KB")
  assert (sharded / "model.safetensors.index.json").exists()
  a = load_hf_model(directory)
  b = load_hf_model(sharded)
  for x, y in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_transformers5_and_classic_config_forms_agree():
  classic = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
             "num_hidden_layers": 1, "num_attention_heads": 2, "rope_theta": 5e5,
             "rope_scaling": {"type": "linear", "factor": 4.0}}
  v5 = {k: v for k, v in classic.items() if k not in ("rope_theta", "rope_scaling")}
  v5["rope_parameters"] = {"rope_type": "linear", "rope_theta": 5e5, "factor": 4.0}
  a, b = ModelConfig.from_hf_dict(classic), ModelConfig.from_hf_dict(v5)
  assert a == b and a.rope_type == "linear" and a.rope_theta == 5e5 and a.rope["factor"] == 4.0


# Published hyper-parameters (config.json on the Hugging Face hub) of the paper's two 7B models.
QWEN25_CODER_7B = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064, "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}
# DeepSeek-Prover-V2-7B is a Llama-architecture 7B (DeepSeek-Prover-V1.5 lineage). The rope scaling entry
# exercises the config path; the parameter count does not depend on it.
DEEPSEEK_PROVER_V2_7B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 102400, "hidden_size": 4096,
    "intermediate_size": 11008, "num_hidden_layers": 30, "num_attention_heads": 32, "num_key_value_heads": 32,
    "max_position_embeddings": 65536, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_scaling": {"type": "linear", "factor": 16.0},
}


@pytest.mark.parametrize("hf_config", [QWEN25_CODER_7B, DEEPSEEK_PROVER_V2_7B], ids=["qwen2.5-coder-7b", "prover-v2-7b"])
def test_real_7b_shapes_have_transformers_parameter_count(tmp_path, hf_config):
  (tmp_path / "config.json").write_text(json.dumps(hf_config))
  cfg = ModelConfig.from_hf_dir(tmp_path)
  _, abstract = hf_io.abstract_model(cfg)
  ours = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(abstract))
  config = transformers.AutoConfig.from_pretrained(tmp_path)
  with torch.device("meta"):
    theirs = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())
  assert ours == theirs


# ---- bad input: one clear error naming the file and the key ------------------------------------

@pytest.fixture
def tiny_checkpoint(tmp_path):
  directory, _ = save_tiny_hf_model(tmp_path, "llama")
  return directory


def test_missing_config_json(tmp_path):
  with pytest.raises(ConfigError, match=r"config\.json: not found"):
    load_hf_model(tmp_path)


def test_unknown_model_type(tiny_checkpoint):
  path = tiny_checkpoint / "config.json"
  cfg = json.loads(path.read_text())
  cfg["model_type"] = "mamba"
  path.write_text(json.dumps(cfg))
  with pytest.raises(ConfigError, match=r"config\.json: model_type 'mamba' is not supported"):
    load_hf_model(tiny_checkpoint)


def _rewrite_tensors(directory, change):
  from compassplay_jax.models.safetensors_io import SafetensorsFile
  f = SafetensorsFile(directory / "model.safetensors")
  tensors = {name: np.array(f.get(name)) for name in f.names()}
  change(tensors)
  del f
  write_safetensors(directory / "model.safetensors", tensors)


def test_missing_tensor(tiny_checkpoint):
  _rewrite_tensors(tiny_checkpoint, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
    load_hf_model(tiny_checkpoint)


def test_extra_tensor(tiny_checkpoint):
  _rewrite_tensors(tiny_checkpoint, lambda t: t.update({"model.layers.0.mystery.weight": np.zeros(3, np.float32)}))
  with pytest.raises(CheckpointError, match=r"model\.safetensors: unexpected tensor 'model\.layers\.0\.mystery\.weight'"):
    load_hf_model(tiny_checkpoint)


def test_wrong_shape(tiny_checkpoint):
  def shrink(t):
    t["model.layers.0.self_attn.q_proj.weight"] = t["model.layers.0.self_attn.q_proj.weight"][:-1]
  _rewrite_tensors(tiny_checkpoint, shrink)
  with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.self_attn\.q_proj\.weight' has shape \(31, 32\), "
                                            r"expected \(32, 32\)"):
    load_hf_model(tiny_checkpoint)


def test_truncated_safetensors(tiny_checkpoint):
  path = tiny_checkpoint / "model.safetensors"
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])
  with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated safetensors file \(tensor '"):
    load_hf_model(tiny_checkpoint)


def test_missing_path_is_clear():
  with pytest.raises(FileNotFoundError, match="no such checkpoint directory or GGUF file"):
    load_model("/nonexistent/checkpoint")


def test_tokenizer_from_checkpoint_directory(tiny_checkpoint, smollm2):
  # A checkpoint directory with tokenizer files: AutoTokenizer reads them, pad falls back to eos.
  _, tok = smollm2
  tok.save_pretrained(tiny_checkpoint)
  tokenizer_config = json.loads((tiny_checkpoint / "tokenizer_config.json").read_text())
  tokenizer_config.pop("pad_token", None)
  (tiny_checkpoint / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
  _, loaded = load_model(tiny_checkpoint)
  assert loaded.encode("def f(x): return x") == tok.encode("def f(x): return x")
  assert loaded.pad_token_id is not None and loaded.eos_token_id == tok.eos_token_id
  assert "<|im_start|>assistant" in loaded.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                               add_generation_prompt=True)
