"""The Lean 4 conjecture-and-prove setting (SGS-style), registered as "lean": its Setting is
setting.LeanSelfPlay, its block config.lean (config.py), its metrics metrics.py; the statement, seed
pool and coverage library it uses is domains/lean, its checkers verifiers/lean_*."""
from compassplay_jax import settings
from compassplay_jax.settings.lean import config as lean_config


def build(config, tokenizer, sampler=None):
  """The Lean setting with its checker (a local REPL pool or a kimina server; closed by its close())."""
  from compassplay_jax.settings.lean.setting import LeanSelfPlay
  return LeanSelfPlay(config, tokenizer, sampler=sampler)


SPEC = settings.register(settings.SettingSpec(
    name="lean", config_block=lean_config.block, build=build, validate=lean_config.validate,
    data_files=lean_config.data_files, readers=lean_config.READERS, summary_keys=(("coverage", "coverage"),)))
