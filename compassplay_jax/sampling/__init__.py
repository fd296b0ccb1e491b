"""Sampling: KV-cache generation with log-probs, stop strings, buckets and micro-batches."""
from compassplay_jax.sampling.config import SamplerParams, SamplingConfig
from compassplay_jax.sampling.generate import FINISH_REASONS, GenerationResult, generate, make_generate_fn
from compassplay_jax.sampling.prompts import build_prompt, encode_prompts

__all__ = ["SamplerParams", "SamplingConfig", "GenerationResult", "FINISH_REASONS", "generate",
           "make_generate_fn", "build_prompt", "encode_prompts"]
