"""One line saying which JAX backend and devices a run uses (printed at start-up)."""
from __future__ import annotations

import collections

import jax


def describe_backend() -> str:
  """E.g. "backend gpu: 8 devices (8 x NVIDIA H100 80GB HBM3), 1 process" or "backend cpu: 1 device (cpu)"."""
  devices = jax.devices()
  kinds = collections.Counter(d.device_kind for d in devices)
  kinds_text = ", ".join(f"{n} x {kind}" if n > 1 else kind for kind, n in kinds.items())
  processes = jax.process_count()
  plural = "s" if len(devices) != 1 else ""
  hosts = f", {processes} processes" if processes > 1 else ""
  return f"backend {jax.default_backend()}: {len(devices)} device{plural} ({kinds_text}){hosts}"
