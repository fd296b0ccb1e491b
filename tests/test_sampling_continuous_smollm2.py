"""Continuous batching with the embedded SmolLM2-135M-Instruct: greedy equals transformers' greedy
generate token for token for more requests than slots, with per-request budgets, eos and stop strings
(one spanning tokens), and texts cut like the static sampler's."""
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.models.tokenizer import eos_token_ids
from compassplay_jax.sampling import SamplingConfig, build_prompt
from compassplay_jax.sampling.continuous import ContinuousEngine
from compassplay_jax.sampling.rollout_engine import Request
from compassplay_jax.sampling.prompts import encode_prompts
from tests.test_sampling_smollm2 import _spanning_stop

torch = pytest.importorskip("torch")

# The tests that build transformers' copy of our SmolLM2 weights (conftest.smollm2_torch_copy) run on one
# xdist worker: the copy and torch are made once, not once per worker.
pytestmark = pytest.mark.xdist_group("smollm2_torch_copy")

QUESTIONS = ["Write a Python function that adds two numbers.", "What is the capital of France?",
             "Name three colours.", "Explain what a list is in Python.", "Say hi."]
BUDGETS = [28, 20, 9, 24, 14]


def _hf_greedy(hf_model, ids, budget, eos):
  ids = torch.tensor([ids])
  out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=budget,
                          top_k=None, top_p=None, eos_token_id=list(eos), pad_token_id=eos[0])
  return out[0, ids.shape[1]:].numpy()


@pytest.mark.slow
def test_greedy_equals_transformers_with_budgets_eos_and_stop_strings(smollm2, smollm2_torch_copy):
  model, tok = smollm2
  hf_model = smollm2_torch_copy
  graphdef, params = nnx.split(model)
  eos = eos_token_ids(tok)
  prompts = [build_prompt(tok, q) for q in QUESTIONS]
  ids = encode_prompts(tok, prompts)
  want = [_hf_greedy(hf_model, x, b, eos) for x, b in zip(ids, BUDGETS)]
  # Request 0 stops at a string spanning tokens, request 3 at one that never occurs; others use
  # the config's (none): mixed stop conditions in one call.
  stop = _spanning_stop(tok, want[0])
  stops = [(stop,), None, None, ("</never>",), None]
  requests = [Request(p, max_new_tokens=b, stop_strings=s) for p, b, s in zip(prompts, BUDGETS, stops)]
  config = SamplingConfig(temperature=0.0, max_new_tokens=32, bucket_lengths=(32, 64))
  res = ContinuousEngine(graphdef, tok, params, slots=2, chunk_tokens=4).generate(requests, config, 0)

  cut = next(t for t in range(1, len(want[0]) + 1) if stop in tok.decode(want[0][:t].tolist()))
  np.testing.assert_array_equal(res.tokens[0], want[0][:cut])
  assert res.finish_reasons[0] == "stop" and len(res.logprobs[0]) == cut
  full = tok.decode(want[0].tolist(), skip_special_tokens=True)
  assert res.texts[0] == full[:full.index(stop) + len(stop)]
  for i in range(1, len(requests)):
    np.testing.assert_array_equal(res.tokens[i], want[i])
    reason = "eos" if want[i][-1] in eos else "length"
    assert res.finish_reasons[i] == reason and (reason == "eos" or len(want[i]) == BUDGETS[i])
    assert res.texts[i] == tok.decode(want[i].tolist(), skip_special_tokens=True)
  assert "eos" in res.finish_reasons and "length" in res.finish_reasons
