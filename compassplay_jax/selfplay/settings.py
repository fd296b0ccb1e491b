"""The setting of a run (config.setting): its config check and its self-play object."""
from __future__ import annotations

from compassplay_jax.models.config import ConfigError

SETTINGS = ("coding", "lean")


def validate_setting(config) -> None:
  """The setting's config and data-file checks, before anything is built (one-line errors)."""
  if config.setting not in SETTINGS:
    raise ConfigError(f"config.setting: {config.setting!r} is not one of {SETTINGS}")
  if config.setting == "coding":
    from compassplay_jax.selfplay import coding
    coding.validate_config(config)
  else:
    from compassplay_jax.selfplay import lean
    lean.validate_config(config)


def make_setting(config, tokenizer, sampler=None):
  """The setting's self-play object (a step.Setting; it opens its sandbox or Lean pool). sampler:
  rollout.sample's signature, default rollout.sample (tools and tests pass a scripted one)."""
  validate_setting(config)
  if config.setting == "coding":
    from compassplay_jax.selfplay import coding
    from compassplay_jax.verifiers.sandbox import SandboxLimits, SandboxPool
    pool = SandboxPool(num_workers=config.sandbox.num_workers or None,
                       limits=SandboxLimits(timeout_s=config.sandbox.timeout_s))
    return coding.CodingSelfPlay(config, tokenizer, pool, sampler=sampler)
  from compassplay_jax.selfplay import lean
  return lean.LeanSelfPlay(config, tokenizer, sampler=sampler)
