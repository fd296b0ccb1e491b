"""Coding loop plumbing (issue 13.5): an in-band candidate's cosine reaches its row's advantage and the loss.

The chain is the one step.run_step runs, through the same public functions: the reference
gradient and candidate cosines (selfplay/alignment), the gated proposer reward (proposer_rewards),
one Row per proposal, TRR++ advantages (step.with_advantages) in the packed batch, and the jitted
train step. Each link is
checked against an independent computation: jax.grad of a plain per-sequence loss for the cosine,
the reward gate written out, token-level whitening written in numpy, and the PPO loss at ratio 1.
(tests/test_local_reference_coding.py and tests/selfplay_mesh_cases.py run the whole step with
scripted samplers.)
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.rewards.proposer_rewards import proposer_rewards
from compassplay_jax.rl.train_step import TrainConfig, init_train_state, make_logprob_fn, make_train_step
from compassplay_jax.sampling.prompts import encode_prompts
from compassplay_jax.selfplay import alignment
from compassplay_jax.selfplay.rollout import Row, reward_config
from compassplay_jax.selfplay.step import padded_batch, with_advantages
from tests.engines import one_device_engine
from tests.test_selfplay import tiny_model

REFERENCE = [("What is 2 + 3?", "2 + 3 = 5. The answer is 5."), ("What is 7 * 6?", "7 * 6 = 42. The answer is 42.")]
# (proposal text, solver prompt, verified solution, solve rate, valid)
CANDIDATES = [
    ("def f(x):\n    return x + 1\n", "Deduce f(3) for def f(x): return x + 1", "f(3) = 4", 0.5, True),
    ("def f(s):\n    return s[::-1]\n", "Deduce f('ab') for def f(s): return s[::-1]", "f('ab') = 'ba'", 0.25, True),
    ("def f(n):\n    return n * n\n", "Deduce f(5) for def f(n): return n * n", "f(5) = 25", 1.0, True),
    ("def f(:\n", "Deduce f() for a broken program", "nothing", 0.0, False),
]


def _weighted_nll(params, graphdef, ids, weights):
  """-sum_t weights[t] log p(ids[t+1] | ids[:t+1]) of one right-padded row: causal attention keeps the
  padding after the sequence out of every position the weights select."""
  logits = nnx.merge(graphdef, params)(ids, attention_mask=jnp.ones_like(ids)).astype(jnp.float32)[0, :-1]
  token_logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), ids[0, 1:, None], axis=-1)[:, 0]
  return -jnp.sum(weights * token_logp)


# Compiled once per width (sequences padded to a multiple of WIDTH: one program for most callers);
# op-by-op jax.grad took ~3/4 of the test's time.
_grad_nll = jax.jit(jax.grad(_weighted_nll), static_argnums=1)
WIDTH = 128


def _flat_grad(graphdef, params, prompt_ids, completion_ids):
  """Gradient of the mean NLL of completion_ids after prompt_ids (no padding inside the sequence)."""
  ids = np.concatenate([prompt_ids, completion_ids])
  width = WIDTH * -(-len(ids) // WIDTH)
  padded = np.zeros((1, width), np.int32)
  padded[0, :len(ids)] = ids
  weights = np.zeros((width - 1,), np.float32)
  weights[len(prompt_ids) - 1:len(ids) - 1] = 1.0 / len(completion_ids)
  g = _grad_nll(params, graphdef, jnp.asarray(padded), jnp.asarray(weights))
  return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(g)])


def _token_whiten(rewards, lengths):
  """veRL's masked whitening over one group's tokens (every token of row i carries reward i)."""
  r, w = np.asarray(rewards, np.float64), np.asarray(lengths, np.float64)
  mu = (w * r).sum() / w.sum()
  var = (w * (r - mu) ** 2).sum() / (w.sum() - 1)
  return (r - mu) / np.sqrt(var + 1e-8)


@pytest.fixture(scope="module")
def model():
  return tiny_model()


@pytest.mark.slow
def test_in_band_cosine_reaches_the_advantage_and_the_loss(model):
  config, tok, graphdef, params = model
  eos = tok.eos_token_id
  encode = lambda text: np.asarray(tok.encode(text, add_special_tokens=False) + [eos])
  max_len = 512

  # 1. cosines: g_ref over the reference set, g(x) over each candidate's verified solution.
  ref_prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True) for q, _ in REFERENCE]
  reference = alignment.pack_reference(tok, ref_prompts, [a for _, a in REFERENCE], max_len=max_len)
  engine = one_device_engine(graphdef, params, config)
  g_ref = alignment.reference_gradient(engine, params, reference, tok.pad_token_id)
  solver_prompts = [np.asarray(p) for p in encode_prompts(tok, [c[1] for c in CANDIDATES])]
  solutions = [encode(c[2]) for c in CANDIDATES]
  cos = alignment.candidate_cosines(engine, params, g_ref, solver_prompts, solutions, tok.pad_token_id,
                                    max_len=max_len)["cosines"]
  ref_prompt_ids = encode_prompts(tok, ref_prompts)
  g_ref_oracle = np.mean([_flat_grad(graphdef, params, np.asarray(p), encode(a))
                          for p, (_, a) in zip(ref_prompt_ids, REFERENCE)], axis=0)
  for i in range(len(CANDIDATES)):
    g = _flat_grad(graphdef, params, solver_prompts[i], solutions[i])
    want = g @ g_ref_oracle / (np.linalg.norm(g) * np.linalg.norm(g_ref_oracle))
    assert cos[i] == pytest.approx(want, abs=1e-5)

  # 2. rewards: the cosine for in-band candidates, the gate's values for the rest.
  rates = np.asarray([c[3] for c in CANDIDATES], np.float32)
  valid = np.asarray([c[4] for c in CANDIDATES])
  gate = reward_config(config.reward)
  rewards = np.asarray(proposer_rewards("compassplay_cos", cosines=cos, solve_rates=rates, valid=valid,
                                        config=gate), np.float32)
  np.testing.assert_array_equal(rewards, [cos[0], cos[1], gate.out_of_band, gate.invalid])

  # 3. rows and advantages: one proposer row per candidate, TRR++ over the (type, role) group.
  proposals = [encode(c[0]) for c in CANDIDATES]
  prompt_ids = np.asarray(encode_prompts(tok, ["Propose a deduction task."])[0])
  rows = [Row(prompt_ids, p, np.zeros(len(p), np.float32), float(r), "deduction", "proposer")
          for p, r in zip(proposals, rewards)]
  batch = padded_batch(with_advantages(rows, max_len), tok.pad_token_id, micro_batch_size=2, max_len=max_len)
  lengths = batch["loss_mask"][:len(rows)].sum(-1)
  np.testing.assert_array_equal(lengths, [len(p) for p in proposals])
  advantages = batch["advantages"][:len(rows)]
  np.testing.assert_allclose(advantages, _token_whiten(rewards, lengths), rtol=1e-5, atol=1e-6)
  assert (advantages[0] > advantages[1]) == (cos[0] > cos[1])  # the cosine orders in-band rows
  assert advantages[0] > 0 and advantages[1] > 0 > advantages[2] > advantages[3]

  # 4. the loss: at ratio 1 (old log-probs = the policy's) the PPO gradient is the REINFORCE one,
  #    -sum_b A_b sum_t grad log pi(y_bt) / sum_b L_b; the train step's gradient norm must match it.
  full = make_logprob_fn(graphdef)(params, jnp.asarray(batch["tokens"]), jnp.asarray(batch["attention_mask"]))
  batch["old_logprobs"] = np.asarray(full)[:, -batch["loss_mask"].shape[1]:]
  tcfg = TrainConfig(learning_rate=0.0, micro_batch_size=2)
  p0, opt = init_train_state(jax.tree.map(jnp.copy, params), tcfg)
  _, _, metrics = make_train_step(graphdef, tcfg, donate=False)(p0, opt, batch, jax.random.key(0))
  assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-5)

  # The objective -sum_b A_b sum_t log pi(y_bt) / sum_b L_b = sum_b A_b L_b (mean NLL of row b) / sum_b L_b is
  # linear in the rows' mean NLLs, so its gradient is that sum of their gradients (float64 here).
  g = sum(float(a) * len(proposal) / float(np.sum(lengths)) * _flat_grad(graphdef, params, prompt_ids, proposal)
          for a, proposal in zip(advantages, proposals))
  assert float(metrics["grad_norm"]) == pytest.approx(np.linalg.norm(g), rel=1e-4)
