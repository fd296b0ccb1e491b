"""The notebook's install cell (experiments/colab_ablation.ipynb): no built-in repository URL; on Colab it
asks for one, and clones the one it is given."""
import pathlib
import subprocess
import sys
import types

import nbformat
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "experiments" / "colab_ablation.ipynb"


def _install_cell() -> str:
  nb = nbformat.read(NOTEBOOK, as_version=4)
  return next(c.source for c in nb.cells if c.cell_type == "code" and "REPOSITORY" in c.source)


def test_the_notebook_names_no_repository_url():
  text = NOTEBOOK.read_text()
  assert "github.com/compassplay" not in text
  assert '\nREPOSITORY = ""\n' in _install_cell()


def _run_on_fake_colab(source: str, cwd: pathlib.Path, monkeypatch, calls: list):
  monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
  monkeypatch.chdir(cwd)
  monkeypatch.setattr(subprocess, "run", lambda args, **kw: calls.append(list(args)))
  exec(compile(source, "install_cell", "exec"), {})  # pylint: disable=exec-used


def test_on_colab_an_unset_repository_stops_with_one_line(tmp_path, monkeypatch):
  calls = []
  with pytest.raises(ValueError, match=r"^set REPOSITORY in the install cell to the git URL"):
    _run_on_fake_colab(_install_cell(), tmp_path, monkeypatch, calls)
  assert calls == []


def test_on_colab_the_set_repository_is_cloned_and_installed(tmp_path, monkeypatch):
  source = _install_cell().replace('\nREPOSITORY = ""\n', '\nREPOSITORY = "https://example.org/me/cp.git"\n')
  (tmp_path / "compassplay-jax").mkdir()  # where the clone would land (subprocess.run is recorded, not run)
  calls = []
  try:
    _run_on_fake_colab(source, tmp_path, monkeypatch, calls)
  finally:
    sys.path[:] = [p for p in sys.path if p != str(tmp_path / "compassplay-jax")]
  assert calls == [["bash", "scripts/install.sh"]]  # the directory exists: no second clone
  (tmp_path / "compassplay-jax").rmdir()
  calls.clear()
  monkeypatch.chdir(tmp_path)
  with pytest.raises(FileNotFoundError):  # the recorded clone made no directory to enter
    _run_on_fake_colab(source, tmp_path, monkeypatch, calls)
  assert calls == [["git", "clone", "--depth=1", "https://example.org/me/cp.git", "compassplay-jax"]]
