"""The XLA flags of every test process: the pytest workers (tests/conftest.py) and the processes tests start.

XLA:CPU's MLIR fusion emitters (its default) compile the suite's many small programs far more slowly
than the classic emitters, and at -O0 (JAX_DISABLE_MOST_OPTIMIZATIONS, conftest) their code is slower
too. Measured cold, one process, 2 quiet cores (docs/testing.md): test_sampling + test_rl_train_step
78 -> 41 CPU-s (XLA backend compile 34 -> 14 s, 238 programs); 12 of the 8-device cases 63 -> 36 CPU-s.
Both emitters are XLA's own lowering of the same HLO: the tests' oracles and tolerances are unchanged.
Codegen in one piece (no split across threads; two pytest workers already fill the two cores):
test_sampling + test_rl_train_step + test_step 59 -> 53 CPU-s; no change on 8 devices.
"""
import os

TEST_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")
# For the programs of a deep model (SmolLM2's 30 unrolled layers) the classic emitters are the slower ones:
# `jax.jit(..., compiler_options=DEEP_MODEL_COMPILER_OPTIONS)` compiles one program with XLA's defaults.
DEEP_MODEL_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": True}


def xla_flags(devices: int | None = None, base: str = "") -> str:
  """`base` plus the test flags that `base` does not set (its own values win) and, if given, the simulated
  CPU device count."""
  flags = [f for f in base.split() if not (devices and f.startswith("--xla_force_host_platform_device_count="))]
  named = {f.split("=")[0] for f in flags}
  flags += [f for f in TEST_XLA_FLAGS if f.split("=")[0] not in named]
  if devices:
    flags.append(f"--xla_force_host_platform_device_count={devices}")
  return " ".join(flags)


def cpu_env(devices: int | None = None, **extra) -> dict:
  """os.environ for a child process on CPU with `devices` simulated devices (and `extra` variables)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(devices, os.environ.get("XLA_FLAGS", "")))
  env.update(extra)
  return env
