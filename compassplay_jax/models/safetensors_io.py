"""Minimal safetensors reading and writing, tensor by tensor.

We read through a memory map of each file so a tensor (or one device's slice of it) is read on its
own and the checkpoint never sits in one host buffer. bfloat16 is handled through ml_dtypes (which
numpy alone lacks). Corrupt or truncated files raise CheckpointError naming the file and tensor.
"""
from __future__ import annotations

import json
import pathlib
import struct

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


class CheckpointError(ValueError):
  """A checkpoint file that is missing, corrupt, truncated or does not match the model."""


class SafetensorsFile:
  """Lazy view of one .safetensors file: `names()`, `shape(name)`, `get(name)` -> np.memmap view."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    try:
      size = self.path.stat().st_size
      with open(self.path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) < 8:
          raise CheckpointError(f"{self.path}: truncated safetensors file (no header)")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > size - 8:
          raise CheckpointError(f"{self.path}: truncated safetensors file (header claims {header_len} bytes)")
        header = json.loads(f.read(header_len))
    except FileNotFoundError:
      raise CheckpointError(f"{self.path}: not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise CheckpointError(f"{self.path}: corrupt safetensors header ({e})") from None
    self.metadata = header.pop("__metadata__", {}) or {}
    self._entries = header
    self._data_start = 8 + header_len
    for name, entry in header.items():
      if entry.get("dtype") not in _DTYPES:
        raise CheckpointError(f"{self.path}: tensor {name!r} has unsupported dtype {entry.get('dtype')!r}")
      end = entry["data_offsets"][1]
      if self._data_start + end > size:
        raise CheckpointError(f"{self.path}: truncated safetensors file (tensor {name!r} ends at byte "
                              f"{self._data_start + end}, file has {size})")
    self._mmap = None

  def names(self) -> list[str]:
    return list(self._entries)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._entries[name]["shape"])

  def get(self, name: str) -> np.ndarray:
    """A read-only memory-mapped view; slicing it reads only the bytes asked for."""
    if self._mmap is None:
      self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
    entry = self._entries[name]
    start, end = entry["data_offsets"]
    flat = self._mmap[self._data_start + start:self._data_start + end]
    return flat.view(_DTYPES[entry["dtype"]]).reshape(entry["shape"])


def open_checkpoint(directory: str | pathlib.Path) -> dict[str, SafetensorsFile]:
  """Maps tensor name -> file for a single-file or sharded (model.safetensors.index.json) checkpoint."""
  directory = pathlib.Path(directory)
  index_path = directory / "model.safetensors.index.json"
  single = directory / "model.safetensors"
  if index_path.is_file():
    try:
      weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
      raise CheckpointError(f"{index_path}: not a valid safetensors index ({e!r})") from None
    files = {name: SafetensorsFile(directory / name) for name in sorted(set(weight_map.values()))}
    out = {}
    for tensor, file_name in weight_map.items():
      if tensor not in files[file_name].names():
        raise CheckpointError(f"{directory / file_name}: missing tensor {tensor!r} listed in {index_path.name}")
      out[tensor] = files[file_name]
    return out
  if single.is_file():
    f = SafetensorsFile(single)
    return {name: f for name in f.names()}
  raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def write_safetensors(path: str | pathlib.Path, tensors: dict, metadata: dict[str, str] | None = None) -> None:
  """Writes name -> array (numpy or jax; each copied to host only when its bytes are written)."""
  header_entries, offset = {}, 0
  for name, arr in tensors.items():
    dtype = np.dtype(arr.dtype)
    if dtype not in _NAMES:
      raise CheckpointError(f"{path}: cannot save tensor {name!r} of dtype {dtype}")
    nbytes = int(np.prod(arr.shape)) * dtype.itemsize
    header_entries[name] = {"dtype": _NAMES[dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  if metadata:
    header_entries["__metadata__"] = metadata
  header = json.dumps(header_entries, separators=(",", ":")).encode()
  header += b" " * (-len(header) % 8)
  tmp = pathlib.Path(str(path) + ".tmp")
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(header)))
    f.write(header)
    for arr in tensors.values():
      f.write(np.ascontiguousarray(np.asarray(arr)).tobytes())
  tmp.replace(path)  # atomic: a crash never leaves a half-written file under the real name
