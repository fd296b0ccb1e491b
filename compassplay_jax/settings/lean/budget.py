"""SGS's prompt-plus-generation cap (lean.max_total_tokens): each request's budget, sampling under it,
and the rows it lowered or ended."""
from __future__ import annotations

from compassplay_jax.infra import distributed
from compassplay_jax.sampling.rollout_engine import Request
from compassplay_jax.selfplay import rollout
from compassplay_jax.selfplay.rollout import sampling_config, truncate_prompt


def generation_budget(prompt_tokens: int, max_new_tokens: int, max_total_tokens: int) -> int:
  """One request's new-token budget under a prompt-plus-generation cap (0 = none): SGS's vLLM stops a
  sequence when prompt + generation reaches max_model_len = 8192 (sgs/models/query_local.py:399-408, vLLM
  0.10.1's check_stop: num_tokens >= max_model_len), with max_tokens = 8192 on the generation alone."""
  if not max_total_tokens:
    return max_new_tokens
  return min(max_new_tokens, max_total_tokens - prompt_tokens)


def sample_capped(engine, params, tokenizer, prompts, config, key, *, n_samples: int = 1, max_total_tokens: int = 0,
                  on_finish=None):
  """rollout.sample, each prompt with its own budget generation_budget(its tokens, max_new_tokens,
  max_total_tokens): the prompt (capped at sampling.max_prompt_tokens like rollout.sample caps it) plus its
  generation stays within max_total_tokens. config.validate keeps max_total_tokens above
  max_prompt_tokens, so every prompt gets a budget of at least one token; none is skipped."""
  if not max_total_tokens:
    return rollout.sample(engine, params, tokenizer, prompts, config, key, n_samples=n_samples, on_finish=on_finish)
  shares = distributed.Shares.of(len(prompts))  # as rollout.sample: each host samples its share
  ids = [truncate_prompt(tokenizer, p, config.sampling.max_prompt_tokens) for p in shares.take(list(prompts))]
  max_new = config.sampling.max_new_tokens
  requests = [Request(p, max_new_tokens=generation_budget(len(p), max_new, max_total_tokens)) for p in ids]
  cfg = sampling_config(config, n_samples=n_samples)
  return engine.generate_shared(params, tokenizer, config.sampling, requests, cfg, key, shares, on_finish=on_finish)


def cap_counts(gen, max_new_tokens: int, max_total_tokens: int) -> tuple[int, int]:
  """(rows whose budget the cap set below max_new_tokens, rows the cap ended: finish reason "length" at
  that lower budget), from a GenerationResult's prompt lengths."""
  if gen is None or not max_total_tokens:
    return 0, 0
  capped = cut = 0
  for r, reason in enumerate(gen.finish_reasons):
    budget = generation_budget(len(gen.prompt_tokens[r]), max_new_tokens, max_total_tokens)
    if budget < max_new_tokens:
      capped += 1
      cut += int(reason == "length" and int(gen.lengths[r]) >= budget)
  return capped, cut
