"""TensorBoard scalar event files, written directly (no tensorboardX, no TensorFlow).

An event file is a sequence of TFRecords, each one serialized `Event` protobuf
(tensorboard/compat/proto/event.proto, summary.proto): the first carries `file_version`, the others a
`Summary` with one `simple_value` per tag. Scalars are all we log, so the few fields are encoded by hand.
Why not tensorboardX: importing it imports torch wherever torch is installed (Colab, GPU clusters, the
test environment), 1.7 s at every run's start (docs/testing.md, "Process start-up").
"""
from __future__ import annotations

import os
import pathlib
import socket
import struct
import time


def _crc32c_table() -> list[int]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
    table.append(crc)
  return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  """TFRecord's checksum: CRC32C rotated right by 15 bits plus a constant."""
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tf_record(data: bytes) -> bytes:
  """One TFRecord: length, its masked CRC, the data, the data's masked CRC."""
  length = struct.pack("<Q", len(data))
  return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def _varint(value: int) -> bytes:
  out = bytearray()
  value &= (1 << 64) - 1  # int64 fields: negative values as two's complement, ten bytes
  while True:
    byte, value = value & 0x7F, value >> 7
    out.append(byte | (0x80 if value else 0))
    if not value:
      return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
  return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def scalar_event(wall_time: float, step: int, values: dict[str, float]) -> bytes:
  """A serialized Event {wall_time, step, summary {value {tag, simple_value}}...}."""
  summary = b"".join(
      _length_delimited(1, _length_delimited(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
      for tag, value in values.items())
  return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step) + _length_delimited(5, summary)


def version_event(wall_time: float) -> bytes:
  """The first Event of every file: {wall_time, file_version: "brain.Event:2"}."""
  return b"\x09" + struct.pack("<d", wall_time) + _length_delimited(3, b"brain.Event:2")


class EventFileWriter:
  """Appends scalar events to one new `events.out.tfevents.<time>.<host>.<pid>` file in `logdir`."""

  def __init__(self, logdir: str | pathlib.Path):
    logdir = pathlib.Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    # The pid keeps two writers of one second on one host apart (TensorBoard reads every file).
    self.path = logdir / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}"
    self._file = open(self.path, "ab")
    self._file.write(tf_record(version_event(now)))
    self._file.flush()

  def add_scalars(self, step: int, values: dict[str, float]) -> None:
    if values:
      self._file.write(tf_record(scalar_event(time.time(), step, values)))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()
