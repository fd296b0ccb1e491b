"""experiments/colab_ablation.ipynb: committed without outputs, in sync with its generator, and run top
to bottom (nbclient, a kernel on this Python) on the tiny config for both rewards."""
import importlib.util
import json
import math
import pathlib
import sys

import nbformat
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "experiments" / "colab_ablation.ipynb"
REWARDS = ("compassplay_cos", "difficulty")
STEPS = 2


def _generator():
  spec = importlib.util.spec_from_file_location("make_colab_ablation", REPO / "experiments" / "make_colab_ablation.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_committed_notebook_has_no_outputs_and_matches_its_generator():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert code and all(c.outputs == [] and c.execution_count is None for c in code)
  assert [c for c in code if "parameters" in c.metadata.get("tags", [])], "no cell tagged 'parameters'"
  assert NOTEBOOK.read_text() == nbformat.writes(_generator().build()) + "\n", \
      "regenerate: python experiments/make_colab_ablation.py"


def _kernel_spec(root: pathlib.Path) -> str:
  """A kernel spec running ipykernel on this test's Python (nothing installed for the user)."""
  spec = root / "kernels" / "compassplay-test"
  spec.mkdir(parents=True)
  (spec / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "compassplay test", "language": "python"}))
  return spec.parent.parent


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_notebook_runs_top_to_bottom_on_tiny(tmp_path, monkeypatch):
  from nbclient import NotebookClient
  monkeypatch.setenv("JUPYTER_PATH", str(_kernel_spec(tmp_path / "jupyter")))
  nb = nbformat.read(NOTEBOOK, as_version=4)
  results = tmp_path / "results.json"
  # papermill's convention: the overrides go in a cell right after the one tagged "parameters".
  at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
  injected = nbformat.v4.new_code_cell(
      f"CONFIG = 'configs/coding.py:tiny'\nREWARDS = {REWARDS!r}\nSTEPS = {STEPS}\n"
      f"WORKDIR = {str(tmp_path / 'runs')!r}\nRESULTS_JSON = {str(results)!r}\n")
  injected.metadata["tags"] = ["injected-parameters"]
  nb.cells.insert(at + 1, injected)
  NotebookClient(nb, timeout=400, kernel_name="compassplay-test",
                 resources={"metadata": {"path": str(REPO)}}).execute()

  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2  # the two plot cells drew inline
  series = json.loads(results.read_text())
  assert set(series) == set(REWARDS)
  for reward, s in series.items():
    assert s["steps"] == [1, 2], reward
    assert len(s["reward/proposer"]) == len(s["copy_rate"]) == STEPS
    assert all(-1.0 <= r <= 1.0 for r in s["reward/proposer"]) and all(0.0 <= c <= 1.0 for c in s["copy_rate"])
    assert len(s["reference_loss"]) == STEPS + 1 and all(math.isfinite(l) and l > 0 for l in s["reference_loss"])
    lines = [json.loads(l) for l in (pathlib.Path(s["workdir"]) / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2]
    assert [l["reward/proposer"] for l in lines] == pytest.approx(s["reward/proposer"])
  assert all(math.isnan(c) for c in series["difficulty"]["cos_valid_mean"])  # no g_ref without a cosine reward
