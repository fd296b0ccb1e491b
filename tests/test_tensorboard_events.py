"""The metrics writer's TensorBoard event files, read back by TensorBoard's own loader (the oracle).

TensorBoard's pure-Python record reader (used when TensorFlow is absent) checks both CRCs of every
record, and its EventAccumulator is what the TensorBoard UI reads scalars with.
"""
import struct
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

from compassplay_jax.infra import tensorboard_events
from compassplay_jax.infra.metrics import MetricsWriter


def _scalars(logdir):
  acc = event_accumulator.EventAccumulator(str(logdir))
  acc.Reload()
  return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_crc32c_equals_tensorboards():
  rng = np.random.default_rng(0)
  for n in (0, 1, 8, 9, 100, 1000):
    data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    assert tensorboard_events.masked_crc32c(data) == pywrap_tensorflow.masked_crc32c(data), n
  assert tensorboard_events.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_scalars_read_back_by_tensorboard(tmp_path):
  writer = MetricsWriter(tmp_path)
  writer.write(1, {"train/loss": 0.5, "reward/proposer": -0.25, "rows": 12, "ok": True,
                   "skipped/nan": float("nan"), "candidates": [{"x": 1}]})
  writer.write(2, {"train/loss": 0.25, "reward/proposer": 1e-8})
  writer.write(2**40, {"train/loss": -3.0})  # a step past int32: multi-byte varint
  writer.close()
  got = _scalars(tmp_path / "tensorboard")
  f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
  assert got == {"train/loss": [(1, 0.5), (2, 0.25), (2**40, -3.0)],
                 "reward/proposer": [(1, -0.25), (2, f32(1e-8))],
                 "rows": [(1, 12.0)], "ok": [(1, 1.0)]}


def test_a_corrupted_record_is_refused_by_tensorboards_reader(tmp_path):
  writer = tensorboard_events.EventFileWriter(tmp_path)
  writer.add_scalars(3, {"a": 1.0})
  writer.close()
  data = bytearray(writer.path.read_bytes())
  data[-6] ^= 0x01  # inside the last record's payload
  writer.path.write_bytes(bytes(data))
  reader = pywrap_tensorflow.PyRecordReader_New(str(writer.path))
  reader.GetNext()  # the version record is intact
  with pytest.raises(Exception, match="(?i)crc|checksum|corrupt"):
    reader.GetNext()


def test_starting_a_run_does_not_import_torch():
  code = ("import sys, tempfile; from compassplay_jax.infra.metrics import MetricsWriter; "
          "w = MetricsWriter(tempfile.mkdtemp()); w.write(1, {'a': 1.0}); w.close(); "
          "print('torch' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == "False"
