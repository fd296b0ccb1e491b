"""The coding setting (AZR-style deduction / abduction / induction over Python programs), registered
as "coding": its Setting is setting.CodingSelfPlay, its block config.coding (config.py), its metrics
metrics.py; the task and sandbox library it uses is domains/coding."""
from compassplay_jax import settings
from compassplay_jax.settings.coding import config as coding_config


def build(config, tokenizer, sampler=None):
  """The coding setting with its own sandbox pool (closed by its close())."""
  from compassplay_jax.settings.coding.setting import CodingSelfPlay
  from compassplay_jax.verifiers.sandbox import SandboxLimits, SandboxPool
  pool = SandboxPool(num_workers=config.sandbox.num_workers or None,
                     limits=SandboxLimits(timeout_s=config.sandbox.timeout_s))
  try:
    return CodingSelfPlay(config, tokenizer, pool, sampler=sampler)
  except BaseException:
    pool.close()
    raise


SPEC = settings.register(settings.SettingSpec(
    name="coding", config_block=coding_config.block, build=build, validate=coding_config.validate,
    data_files=coding_config.data_files, readers=coding_config.READERS, summary=coding_config.summary,
    reference_set=lambda setting: setting.reference_set()))
