"""Packing rows for the train step: both layouts agree with a naive per-row reading."""
import jax.numpy as jnp
import numpy as np

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rl.losses import token_logprobs
from compassplay_jax.selfplay.sequences import pack

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]
COMPLETIONS = [[20, 21], [22], [23, 24, 25, 26]]
LOGPROBS = [[-0.5, -1.0], [-2.0], [-0.1, -0.2, -0.3, -0.4]]


def test_layouts_mark_the_same_tokens():
  full = pack(PROMPTS, COMPLETIONS, 0, LOGPROBS, row_multiple=4)
  window = pack(PROMPTS, COMPLETIONS, 0, LOGPROBS, row_multiple=4, completion_window=True)
  assert full.tokens.shape[0] == window.tokens.shape[0] == 4
  offset = window.tokens.shape[1] - window.loss_mask.shape[1]
  for r, (p, c, lp) in enumerate(zip(PROMPTS, COMPLETIONS, LOGPROBS)):
    for layout, start in ((full, 0), (window, offset)):
      cols = np.flatnonzero(layout.loss_mask[r]) + start
      assert layout.tokens[r, cols].tolist() == c
      np.testing.assert_allclose(layout.old_logprobs[r][layout.loss_mask[r] > 0], lp)
      real = layout.tokens[r][layout.attention_mask[r] > 0].tolist()
      assert real == p + c
  assert not window.loss_mask[:, 0].any()  # column 0 of the window only predicts
  assert not full.loss_mask[3].any() and not window.attention_mask[3].any()  # padding row


def test_window_logprobs_equal_full_sequence_logprobs():
  """The model's log-probs of completion tokens are the same in both layouts (positions included)."""
  model = init_decoder(ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                   num_key_value_heads=1))
  full = pack(PROMPTS, COMPLETIONS, 0)
  window = pack(PROMPTS, COMPLETIONS, 0, completion_window=True)
  lp_full = token_logprobs(model(jnp.asarray(full.tokens), attention_mask=jnp.asarray(full.attention_mask)),
                           jnp.asarray(full.tokens))
  start = window.tokens.shape[1] - window.loss_mask.shape[1]
  logits = model(jnp.asarray(window.tokens), attention_mask=jnp.asarray(window.attention_mask), logits_from=start)
  lp_window = token_logprobs(logits, jnp.asarray(window.tokens[:, start:]))
  for r in range(len(PROMPTS)):
    a = np.asarray(lp_full[r])[full.loss_mask[r] > 0]
    b = np.asarray(lp_window[r])[window.loss_mask[r] > 0]
    np.testing.assert_allclose(a, b, atol=1e-5)
