"""A one-device engine for tests that drive a setting or the sampler outside the run loop."""
import jax

from compassplay_jax.infra import sharding as sh
from compassplay_jax.runtime.engine import Engine, EngineSettings


def one_device_engine(graphdef, params, config):
  """The engine Session.create would build for `config`, on a (1, 1, 1) mesh of the first device."""
  mesh = sh.make_mesh((1, 1, 1), jax.devices()[:1])
  return Engine.build(graphdef, params, mesh, EngineSettings.from_config(config))
