"""Logit parity with transformers' torch models on tiny random configs (the independent oracle)."""
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from compassplay_jax.models.loading import load_hf_model  # noqa: E402
from tests.hf_fixtures import ROPE_CASES, left_padded_batch, save_tiny_hf_model, torch_logits  # noqa: E402


def _max_diff_on_real_tokens(ours, theirs, mask):
  m = mask.astype(bool)
  return float(np.max(np.abs(np.asarray(ours)[m] - theirs[m])))


@pytest.mark.parametrize("model_type,heads,kv_heads,tied", [
    ("qwen2", 4, 2, True),
    ("qwen2", 4, 2, False),
    ("llama", 4, 4, False),   # MHA
    ("llama", 4, 1, True),    # GQA (MQA ratio)
    ("llama", 4, 2, False),   # GQA
])
def test_logits_match_transformers(tmp_path, model_type, heads, kv_heads, tied):
  directory, hf_model = save_tiny_hf_model(tmp_path, model_type, heads=heads, kv_heads=kv_heads, tied=tied)
  model = load_hf_model(directory)
  ids, mask = left_padded_batch(hf_model.config.vocab_size)
  ours = model(jnp.asarray(ids), attention_mask=jnp.asarray(mask))
  assert _max_diff_on_real_tokens(ours, torch_logits(hf_model, ids, mask), mask) <= 1e-4


@pytest.mark.parametrize("rope_type", sorted(ROPE_CASES))
def test_every_rope_scaling_type(tmp_path, rope_type):
  # max_position_embeddings=10 < the longest row (12), so dynamic/longrope take their long branch.
  directory, hf_model = save_tiny_hf_model(tmp_path, "llama", rope=ROPE_CASES[rope_type], max_pos=10)
  model = load_hf_model(directory)
  assert model.config.rope_type == rope_type
  ids, mask = left_padded_batch(hf_model.config.vocab_size)
  ours = model(jnp.asarray(ids), attention_mask=jnp.asarray(mask))
  assert _max_diff_on_real_tokens(ours, torch_logits(hf_model, ids, mask), mask) <= 1e-4


def test_short_sequences_use_unscaled_branch(tmp_path):
  """Dynamic/longrope pick their frequencies from the batch's length: check the short branch too."""
  for rope_type in ("dynamic", "longrope"):
    directory, hf_model = save_tiny_hf_model(tmp_path / rope_type, "llama", rope=ROPE_CASES[rope_type], max_pos=64)
    model = load_hf_model(directory)
    ids, mask = left_padded_batch(hf_model.config.vocab_size, lengths=(4, 6))
    ours = model(jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    assert _max_diff_on_real_tokens(ours, torch_logits(hf_model, ids, mask), mask) <= 1e-4


# bf16 compute: documented tolerance (docs/model.md). Logits of these tiny models are O(1); bf16 has
# an 8-bit mantissa (relative step 2^-8 = 0.004) and errors accumulate over 2 layers.
BF16_TOLERANCE = 0.05


def test_bf16_within_documented_tolerance(tmp_path):
  directory, hf_model = save_tiny_hf_model(tmp_path, "qwen2")
  model = load_hf_model(directory, dtype="bfloat16", param_dtype="bfloat16")
  ids, mask = left_padded_batch(hf_model.config.vocab_size)
  ours = model(jnp.asarray(ids), attention_mask=jnp.asarray(mask))
  assert ours.dtype == jnp.float32
  assert _max_diff_on_real_tokens(ours, torch_logits(hf_model, ids, mask), mask) <= BF16_TOLERANCE
