"""Multi-host runs: jax.distributed initialisation, each host's share of a batch, process-0 writes.

Every process runs the same program (SPMD). Call `initialize()` first, before anything touches a JAX
device; then `sharding.make_mesh()` spans the devices of all processes. Each process loads only the
batch rows `process_rows` names and `global_batch` assembles the global array. Collectives (fetching
metrics) run on every process; only process 0 writes files.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Callable, Mapping

import jax
import numpy as np

from compassplay_jax.core.errors import UserError

ENV_PREFIX = "COMPASSPLAY_"


class DistributedError(UserError, ValueError):
  """A distributed configuration that cannot be used."""


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """How to join a multi-process run. All None (the default) means a single process.

  auto=True lets jax.distributed.initialize() detect the cluster itself (Cloud TPU pods, SLURM,
  Open MPI, Kubernetes); otherwise coordinator_address, num_processes and process_id are explicit.
  """
  coordinator_address: str | None = None  # "host:port" of process 0
  num_processes: int | None = None
  process_id: int | None = None
  local_device_ids: tuple[int, ...] | None = None  # GPUs this process drives (one process per GPU)
  initialization_timeout: int = 300
  auto: bool = False

  @classmethod
  def from_env(cls, environ: Mapping[str, str] | None = None) -> "DistributedConfig":
    """From COMPASSPLAY_COORDINATOR_ADDRESS, _NUM_PROCESSES, _PROCESS_ID, _LOCAL_DEVICE_IDS ("0,1"),
    _DISTRIBUTED_TIMEOUT, and COMPASSPLAY_DISTRIBUTED=auto."""
    env = os.environ if environ is None else environ

    def get(name, convert=str):
      raw = env.get(ENV_PREFIX + name)
      if raw in (None, ""):
        return None
      try:
        return convert(raw)
      except ValueError:
        raise DistributedError(f"{ENV_PREFIX}{name}={raw!r} is not valid") from None

    mode = (get("DISTRIBUTED") or "").lower()
    if mode not in ("", "auto", "off"):
      raise DistributedError(f"{ENV_PREFIX}DISTRIBUTED={mode!r} is not valid (use 'auto' or 'off')")
    ids = get("LOCAL_DEVICE_IDS", lambda s: tuple(int(v) for v in s.split(",")))
    return cls(coordinator_address=get("COORDINATOR_ADDRESS"), num_processes=get("NUM_PROCESSES", int),
               process_id=get("PROCESS_ID", int), local_device_ids=ids,
               initialization_timeout=get("DISTRIBUTED_TIMEOUT", int) or 300, auto=mode == "auto")

  @property
  def enabled(self) -> bool:
    return self.auto or self.coordinator_address is not None

  def validate(self) -> None:
    if self.auto or not self.enabled:
      return
    if self.num_processes is None or self.process_id is None:
      raise DistributedError(f"coordinator_address={self.coordinator_address!r} needs num_processes and process_id")
    if not 0 <= self.process_id < self.num_processes:
      raise DistributedError(f"process_id={self.process_id} is outside [0, {self.num_processes})")


def initialize(config: DistributedConfig | Mapping[str, Any] | None = None) -> bool:
  """Joins the multi-process run that `config` (default: the environment) describes.

  Returns True when jax.distributed was initialised, False for a single process. Idempotent.
  """
  if config is None:
    config = DistributedConfig.from_env()
  elif hasattr(config, "to_dict"):  # ml_collections.ConfigDict
    config = DistributedConfig(**config.to_dict())
  elif isinstance(config, Mapping):
    config = DistributedConfig(**config)
  config.validate()
  if not config.enabled:
    return False
  if jax.distributed.is_initialized():
    return True
  kwargs = {"initialization_timeout": config.initialization_timeout}
  if not config.auto:
    kwargs.update(coordinator_address=config.coordinator_address, num_processes=config.num_processes,
                  process_id=config.process_id)
    if config.local_device_ids is not None:
      kwargs["local_device_ids"] = list(config.local_device_ids)
  jax.distributed.initialize(**kwargs)
  return True


def is_main_process() -> bool:
  return jax.process_index() == 0


def main_process_only(fn: Callable) -> Callable:
  """Decorator: runs `fn` on process 0, returns None on the others (never put collectives inside)."""
  def wrapper(*args, **kwargs):
    return fn(*args, **kwargs) if is_main_process() else None
  wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
  return wrapper


# ---- batches --------------------------------------------------------------------------------------

def process_rows(global_batch_size: int, mesh, process_index: int | None = None) -> np.ndarray:
  """Indices of the global batch rows whose data this process's devices hold (what it must load)."""
  from compassplay_jax.infra import sharding as sharding_lib
  if global_batch_size % sharding_lib.batch_divisor(mesh):
    raise DistributedError(f"global batch {global_batch_size} is not divisible by data*fsdp="
                           f"{sharding_lib.batch_divisor(mesh)}")
  process_index = jax.process_index() if process_index is None else process_index
  index_map = sharding_lib.batch_sharding(mesh, 1).devices_indices_map((global_batch_size,))
  rows = set()
  for device, (index,) in index_map.items():
    if device.process_index == process_index:
      rows.update(range(*index.indices(global_batch_size)))
  return np.array(sorted(rows), dtype=np.int64)


def global_batch(local_batch, mesh, global_batch_size: int):
  """Global arrays, batch dim over (data, fsdp), from this process's rows (`process_rows` order)."""
  from compassplay_jax.infra import sharding as sharding_lib

  def one(x):
    x = np.asarray(x)
    shape = (global_batch_size,) + x.shape[1:]
    return jax.make_array_from_process_local_data(sharding_lib.batch_sharding(mesh, x.ndim), x, shape)
  return jax.tree.map(one, local_batch)


# ---- each process's share of a step's work ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Shares:
  """n items of a step (prompts, candidates, rows) split over the processes in contiguous blocks of
  ceil(n / count): process p samples, verifies and places items [start(p), end(p)). Every process
  computes the same split from n, so sizes need no exchange."""
  n: int
  count: int = 1
  index: int = 0

  @classmethod
  def of(cls, n: int) -> "Shares":
    return cls(int(n), jax.process_count(), jax.process_index())

  @property
  def size(self) -> int:
    """The largest share (the rows every process reserves in a global array)."""
    return -(-self.n // self.count) if self.n else 0

  def bounds(self, process: int) -> tuple[int, int]:
    start = min(process * self.size, self.n)
    return start, min(start + self.size, self.n)

  @property
  def start(self) -> int:
    return self.bounds(self.index)[0]

  @property
  def mine(self) -> range:
    return range(*self.bounds(self.index))

  def take(self, items):
    """This process's items of a global sequence."""
    start, end = self.bounds(self.index)
    return items[start:end]


def allgather_objects(obj) -> list:
  """[obj of process 0, obj of process 1, ...]: a collective (every process calls it, in the same
  order). Objects travel pickled as bytes (our own processes of one program); one process: [obj]."""
  if jax.process_count() == 1:
    return [obj]
  import pickle
  from jax.experimental import multihost_utils
  data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int64))).reshape(-1)
  buffer = np.zeros((exchange_buffer_size(int(sizes.max())),), np.uint8)
  buffer[:data.size] = data
  gathered = np.asarray(multihost_utils.process_allgather(buffer)).reshape(len(sizes), -1)
  return [pickle.loads(gathered[p, :sizes[p]].tobytes()) for p in range(len(sizes))]


def exchange_buffer_size(largest: int) -> int:
  """Bytes an allgather_objects buffer carries when its largest object has `largest` bytes: the next
  power of two, at least 256. Each buffer size is one compiled all-gather, so a run's exchanges (records,
  fingerprints, verdicts, whose sizes change every step) compile a handful of programs, not one per size."""
  return max(256, 1 << (max(largest, 1) - 1).bit_length())


def gather_shares(local: list, shares: Shares) -> list:
  """The global list from each process's share (`local` = this process's items, in order)."""
  if shares.count == 1:
    return list(local)
  if len(local) != len(shares.mine):
    raise ValueError(f"gather_shares: {len(local)} local items for a share of {len(shares.mine)}")
  return [item for part in allgather_objects(list(local)) for item in part]


def shared_map(fn, items: list) -> list:
  """fn over this process's share of `items` (fn returns one result per item), gathered in item order
  on every process: e.g. sandbox or Lean jobs run once, on the host whose share they are in."""
  shares = Shares.of(len(items))
  return gather_shares(fn(shares.take(items)) if len(shares.mine) else [], shares)


def fingerprint(value) -> str:
  """sha256 of a JSON-able value (keys sorted; numpy arrays as lists)."""
  import hashlib
  text = json.dumps(value, sort_keys=True, default=lambda x: np.asarray(x).tolist())
  return hashlib.sha256(text.encode()).hexdigest()


def check_agreement(step: int, fields: Mapping[str, Any]) -> None:
  """Every process must hold the same value of each field (what is global: task buffers, seed pool,
  coverage, candidate records, metrics, checkpoint extras). Fingerprints are exchanged; a field that
  differs stops every process with one line naming the step and the field."""
  if jax.process_count() == 1:
    return
  mine = {name: fingerprint(value) for name, value in fields.items()}
  every = allgather_objects(mine)
  for name in fields:
    prints = [p[name] for p in every]
    if len(set(prints)) > 1:
      who = ", ".join(f"process {i}: {f[:12]}" for i, f in enumerate(prints))
      raise DistributedError(f"step {step}: processes disagree on {name} ({who})")


# ---- metrics and files ----------------------------------------------------------------------------

def to_host(x) -> np.ndarray:
  """A global array's full value on every process (collective when it is sharded across hosts)."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(x)
  if x.is_fully_replicated:
    return np.asarray(x.addressable_data(0))
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def write_text(path: str | pathlib.Path, text: str) -> bool:
  """Writes `text` atomically on process 0 only; True where written."""
  if not is_main_process():
    return False
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(text)
  tmp.replace(path)
  return True


def write_json(path: str | pathlib.Path, obj: Any) -> bool:
  return write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def log_metrics(path: str | pathlib.Path, step: int, metrics: Mapping[str, Any]) -> dict[str, Any] | None:
  """Appends one JSON line {step, metric: value} on process 0. Call on every process (it may gather).

  Returns the record on process 0, None elsewhere.
  """
  record = {"step": int(step)}
  for name, value in metrics.items():
    host = to_host(value)
    record[name] = host.item() if host.ndim == 0 else host.tolist()
  if not is_main_process():
    return None
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")
  return record
