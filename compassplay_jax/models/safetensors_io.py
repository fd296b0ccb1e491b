"""Safetensors checkpoints read through the `safetensors` library, tensor by tensor and slice by slice.

`safe_open` memory-maps each file; `get_slice(name)[index]` reads only the bytes of one device's
slice, so a sharded load never holds a whole tensor (let alone the checkpoint) in one host buffer.
bfloat16 comes back as ml_dtypes.bfloat16. Corrupt or truncated files raise CheckpointError naming the
file (and, when the data is cut short, the first tensor that lies past its end). Writing stays ours:
it copies each jax array to the host only when its bytes are written.
"""
from __future__ import annotations

import json
import pathlib
import struct

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open

from compassplay_jax.core.errors import UserError

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


class CheckpointError(UserError, ValueError):
  """A checkpoint file that is missing, corrupt, truncated or does not match the model."""


class SafetensorsFile:
  """One .safetensors file: `names()`, `shape(name)`, `get(name)` (whole) and `read(name, index, transpose)`."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    if not self.path.is_file():
      raise CheckpointError(f"{self.path}: not found")
    try:
      self._file = safe_open(str(self.path), framework="numpy")
    except SafetensorError as e:
      raise CheckpointError(_diagnose(self.path, e)) from None
    self.metadata = self._file.metadata() or {}
    self._shapes = {name: tuple(self._file.get_slice(name).get_shape()) for name in self._file.keys()}

  def names(self) -> list[str]:
    return list(self._shapes)

  def shape(self, name: str) -> tuple[int, ...]:
    return self._shapes[name]

  def get(self, name: str) -> np.ndarray:
    return self._file.get_tensor(name)

  def read(self, name: str, index: tuple = (), transpose: bool = False) -> np.ndarray:
    """The slice `index` (a tuple of slices, as jax.make_array_from_callback passes) of the tensor,
    or of its transpose: only those bytes are read from the file."""
    ndim = len(self._shapes[name])
    index = tuple(index) + (slice(None),) * (ndim - len(index))
    if transpose:
      return self._file.get_slice(name)[index[::-1]].T
    return self._file.get_slice(name)[index]


def _diagnose(path: pathlib.Path, error: Exception) -> str:
  """A one-line reason for a file the library refused: truncation (naming the first cut-off tensor),
  a corrupt header, or the library's own message."""
  size = path.stat().st_size
  with open(path, "rb") as f:
    raw_len = f.read(8)
    if len(raw_len) < 8:
      return f"{path}: truncated safetensors file (no header)"
    (header_len,) = struct.unpack("<Q", raw_len)
    if header_len > size - 8:
      return f"{path}: truncated safetensors file (header claims {header_len} bytes)"
    try:
      header = json.loads(f.read(header_len))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      return f"{path}: corrupt safetensors header ({e})"
  header.pop("__metadata__", None)
  for name, entry in header.items():
    end = 8 + header_len + entry.get("data_offsets", [0, 0])[1]
    if end > size:
      return f"{path}: truncated safetensors file (tensor {name!r} ends at byte {end}, file has {size})"
  return f"{path}: not a readable safetensors file ({error})"


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
