"""gguf_metadata.read_metadata against the `gguf` package's own reader (the oracle), on the embedded
SmolLM2 file and on damaged copies of its header."""
import pytest

from compassplay_jax.models import gguf_metadata
from compassplay_jax.models.safetensors_io import CheckpointError


@pytest.fixture(scope="module")
def embedded():
  from compassplay_jax.models.gguf_io import embedded_gguf_path
  try:
    return embedded_gguf_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))


@pytest.fixture(scope="module")
def gguf_reading(embedded):
  """The `gguf` package's GGUFReader of the embedded file (seconds: read once for the module)."""
  gguf = pytest.importorskip("gguf")
  return gguf.GGUFReader(str(embedded))


def test_every_key_equals_the_gguf_packages_reading(embedded, gguf_reading):
  want = {k: f.contents() for k, f in gguf_reading.fields.items() if not k.startswith("GGUF.")}
  got = gguf_metadata.read_metadata(embedded)
  assert list(got) == list(want)  # same keys, in file order
  for key in want:
    assert got[key] == want[key], key
  assert len(got["tokenizer.ggml.tokens"]) == 49152 and got["general.architecture"] == "llama"
  assert isinstance(got["tokenizer.ggml.token_type"][0], int)


def test_damaged_files_fail_with_one_line_naming_the_file(embedded, tmp_path):
  header = embedded.read_bytes()[:200_000]
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(header[:5000])  # inside the token list
  with pytest.raises(CheckpointError, match=r"cut\.gguf: GGUF metadata ends early \(at byte 5000\)"):
    gguf_metadata.read_metadata(cut)
  other = tmp_path / "other.gguf"
  other.write_bytes(b"PK\x03\x04" + header[4:100])
  with pytest.raises(CheckpointError, match=r"other\.gguf: not a GGUF file"):
    gguf_metadata.read_metadata(other)
  bad_type = tmp_path / "bad_type.gguf"
  # The first pair's value type (after its key: u64 length + bytes) set to 99.
  key_len = int.from_bytes(header[24:32], "little")
  at = 32 + key_len
  bad_type.write_bytes(header[:at] + (99).to_bytes(4, "little") + header[at + 4:])
  with pytest.raises(CheckpointError, match=r"bad_type\.gguf: unknown GGUF value type 99"):
    gguf_metadata.read_metadata(bad_type)


def test_tensor_table_equals_the_gguf_packages_reading(embedded, gguf_reading):
  want = [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), t.data_offset)
          for t in gguf_reading.tensors]
  _, tensors = gguf_metadata.read_header(embedded)
  assert [(t.name, t.dims, t.ggml_type, t.offset) for t in tensors] == want
  assert len(want) == 272


def test_a_file_cut_inside_its_tensors_names_the_tensor(embedded, tmp_path, monkeypatch):
  import gguf

  from compassplay_jax.models.gguf_io import load_gguf_model
  _, tensors = gguf_metadata.read_header(embedded)
  cut = tmp_path / "cut.gguf"
  with open(embedded, "rb") as src:
    cut.write_bytes(src.read(tensors[-1].offset + 8))  # the last tensor's first bytes only
  dequantized = []
  real_dequantize = gguf.quants.dequantize
  monkeypatch.setattr(gguf.quants, "dequantize", lambda *a: dequantized.append(1) or real_dequantize(*a))
  with pytest.raises(CheckpointError, match=rf"cut\.gguf: tensor {tensors[-1].name!r} ends past the end of the file"):
    load_gguf_model(cut)
  assert not dequantized  # every extent is checked before the first tensor is dequantized
