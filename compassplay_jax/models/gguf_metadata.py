"""A GGUF file's metadata (its key/value section) and tensor table, read straight from the header.

The tokenizer needs only the metadata, but `gguf.GGUFReader` also maps every tensor and builds a
numpy view per array element: 3 s for SmolLM2's 49k tokens and 49k merges, paid by every process
that loads the embedded tokenizer (the main job, each sweep cell, each test subprocess). Read here
with `struct` and numpy from a memory map: 0.08 s. Layout (GGUF v2/v3, little-endian): magic "GGUF", u32 version,
u64 tensor count, u64 key/value count, then per pair a string key, a u32 value type and the value;
strings are a u64 byte length and UTF-8 bytes; arrays a u32 element type, a u64 count and the
elements. Then per tensor its name, u32 dimension count, u64 dimensions (innermost first), u32 ggml type
and u64 offset into the data section, which starts at the next multiple of `general.alignment` (32).
https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""
from __future__ import annotations

import dataclasses
import mmap
import pathlib
import struct

import numpy as np

from compassplay_jax.models.safetensors_io import CheckpointError

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# Fixed-size value types: struct format (little-endian).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_DTYPES = {k: np.dtype(v) for k, v in _SCALARS.items()}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  name: str
  dims: tuple[int, ...]  # GGUF's order: innermost (contiguous) dimension first
  ggml_type: int
  offset: int  # absolute byte offset of the data in the file


def read_metadata(path: str | pathlib.Path) -> dict:
  """{key: value} of the file's metadata: str, int, float, bool, or a list of them (as the `gguf`
  package's `field.contents()` gives). A file that is not GGUF or ends early: CheckpointError."""
  return read_header(path)[0]


def read_header(path: str | pathlib.Path) -> tuple[dict, list[TensorInfo]]:
  """(metadata, tensor table) of the file; the tensors' data is not read."""
  path = pathlib.Path(path)
  with open(path, "rb") as f:
    head = f.read(24)
    if len(head) < 24 or head[:4] != _MAGIC:
      raise CheckpointError(f"{path}: not a GGUF file (no 'GGUF' magic at the start)")
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", head, 4)
    if version < 2:
      raise CheckpointError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    # Mapped, not read: the metadata's size is not in the header, and the tensors after it are most of the file.
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
      reader = _Reader(data, 24, path)
      metadata = {reader.string(): reader.value() for _ in range(kv_count)}
      table = []
      for _ in range(tensor_count):
        name = reader.string()
        dims = tuple(reader.scalar("<Q") for _ in range(reader.scalar("<I")))
        table.append((name, dims, reader.scalar("<I"), reader.scalar("<Q")))
      alignment = int(metadata.get("general.alignment", 32))
      start = -(-reader.offset // alignment) * alignment
      return metadata, [TensorInfo(name, dims, kind, start + offset) for name, dims, kind, offset in table]


class _Reader:
  """A cursor over the file's bytes; each read checks that the bytes are there."""

  def __init__(self, data: mmap.mmap, offset: int, path: pathlib.Path):
    self.data, self.offset, self.path = data, offset, path

  def _take(self, size: int) -> int:
    start = self.offset
    if start + size > len(self.data):
      raise CheckpointError(f"{self.path}: GGUF metadata ends early (at byte {len(self.data)})")
    self.offset += size
    return start

  def scalar(self, fmt: str):
    return struct.unpack_from(fmt, self.data, self._take(struct.calcsize(fmt)))[0]

  def string(self) -> str:
    size = self.scalar("<Q")
    start = self._take(size)
    return self.data[start:start + size].decode("utf-8", errors="replace")

  def value(self, kind: int | None = None):
    kind = self.scalar("<I") if kind is None else kind
    if kind == _STRING:
      return self.string()
    if kind == _ARRAY:
      item, count = self.scalar("<I"), self.scalar("<Q")
      if item in _DTYPES:  # a fixed-size array in one read
        start = self._take(count * _DTYPES[item].itemsize)
        return np.frombuffer(self.data, _DTYPES[item], count, start).tolist()  # copied out of the map
      return [self.value(item) for _ in range(count)]
    if kind not in _SCALARS:
      raise CheckpointError(f"{self.path}: unknown GGUF value type {kind}")
    return self.scalar(_SCALARS[kind])
