"""The sweep command: grid, checks of its input, printed commands, and a real tiny sweep that is
killed, resumed without repeating a step, and reported on (numbers checked by hand from metrics.jsonl)."""
import json
import pathlib
import statistics
import sys

import pytest

from compassplay_jax.cli import sweep
from compassplay_jax.cli import report

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = f"{REPO}/configs/coding.py:tiny"


def test_cells_are_rewards_by_grid_values_by_seeds():
  cells = sweep.make_cells(["difficulty", "compassplay_cos"], [0, 1], {"steps": "3"},
                           {"train.learning_rate": ["1e-3", "1e-4"]})
  assert [(c.reward, c.overrides["train.learning_rate"], c.seed) for c in cells] == [
      (r, lr, s) for r in ["difficulty", "compassplay_cos"] for lr in ["1e-3", "1e-4"] for s in [0, 1]]
  assert cells[0].arm == "difficulty,train.learning_rate=1e-3"
  assert cells[0].dir == "difficulty__train.learning_rate=1e-3/seed_0"
  assert all(c.overrides["steps"] == "3" for c in cells)


@pytest.mark.parametrize("args, message", [
    (["--rewards=difficulty,nope"], "error: --rewards: unknown reward 'nope' (known: "),
    (["--rewards=difficulty", "--set", "train.lr=1"],
     "error: --set train.lr: unknown config key (config.train has no field 'lr')"),
    (["--rewards=difficulty", "--set", "train.learning_rate=fast"],
     "error: --set train.learning_rate=fast: not a float"),
    (["--rewards=difficulty", "--set", "steps=2.5"], "error: --set steps=2.5: not a int"),
    (["--rewards=difficulty", "--set", "seed=3"], "error: --set seed: use --seeds for it"),
    (["--rewards=difficulty", "--grid", "nothing.here=1,2"], "error: --grid nothing.here: unknown config key"),
    (["--rewards=difficulty", "--seeds=0,x"], "error: --seeds '0,x': want a comma list of integers"),
])
def test_bad_input_is_one_line_naming_it(tmp_path, capsys, args, message):
  code = sweep.main([f"--config={TINY}", f"--root={tmp_path}", "--print-commands", *args])
  err = capsys.readouterr().err.strip()
  assert code == 2 and err.startswith(message) and "\n" not in err
  assert not (tmp_path / "sweep.json").exists()


def test_missing_config_file(tmp_path, capsys):
  assert sweep.main(["--config=configs/nope.py", "--rewards=difficulty", f"--root={tmp_path}"]) == 2
  assert "error: --config: no such file" in capsys.readouterr().err


def test_print_commands_lists_unfinished_cells_and_writes_sweep_file(tmp_path, capsys):
  root = tmp_path / "sw"
  # difficulty/seed_1 is complete (its last committed checkpoint is the config's last step, 2); a
  # half-written checkpoint folder does not count.
  (root / "difficulty" / "seed_1" / "checkpoints" / "2").mkdir(parents=True)
  (root / "difficulty" / "seed_0" / "checkpoints" / "1").mkdir(parents=True)
  (root / "difficulty" / "seed_0" / "checkpoints" / "2.orbax-checkpoint-tmp-7").mkdir()
  code = sweep.main([f"--config={TINY}", "--rewards=difficulty,compassplay_cos", "--seeds=0,1", f"--root={root}",
                     "--set", "sampling.max_new_tokens=16", "--print-commands", "--python=python"])
  assert code == 0
  lines = capsys.readouterr().out.strip().splitlines()
  expected = [f"python -m compassplay_jax.main --config={TINY} --workdir={root}/{arm}/seed_{seed} "
              f"--config.reward.name={arm} --config.seed={seed} --config.sampling.max_new_tokens=16"
              for arm, seed in [("difficulty", 0), ("compassplay_cos", 0), ("compassplay_cos", 1)]]
  assert lines == expected
  cells = json.loads((root / "sweep.json").read_text())["cells"]
  assert [(c["arm"], c["seed"], c["dir"]) for c in cells] == [
      ("difficulty", 0, "difficulty/seed_0"), ("difficulty", 1, "difficulty/seed_1"),
      ("compassplay_cos", 0, "compassplay_cos/seed_0"), ("compassplay_cos", 1, "compassplay_cos/seed_1")]


def _lines(workdir):
  return [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.xdist_group("coding_tiny_runs")
def test_tiny_sweep_killed_resumes_without_repeating_a_step_and_reports(coding_tiny_runs):
  """The shared sweep (tests/shared_runs.py: compassplay_cos,difficulty x seeds 0,1 of coding:tiny, killed
  -9 with its running cell once the first cell committed step 1, run again, and once more)."""
  root, record = coding_tiny_runs.sweep, coding_tiny_runs.sweep_record
  first = root / "compassplay_cos" / "seed_0"
  killed_at = record["killed_at"]
  assert killed_at in (1, 2)

  assert record["resumed_returncode"] == 0, record["resumed_stdout"][-3000:] + record["resumed_stderr"]
  if killed_at == 1:
    assert "compassplay_cos/seed_0: resuming from step 1" in record["resumed_stdout"]
    assert "resumed from step 1" in (first / "sweep.log").read_text()
  cells = [root / arm / f"seed_{s}" for arm in ("compassplay_cos", "difficulty") for s in (0, 1)]
  for cell in cells:
    assert [l["step"] for l in _lines(cell)] == [1, 2], cell  # no lost or repeated step
    assert sweep.last_checkpoint(cell) == 2
    config = json.loads((cell / "config.json").read_text())
    assert (config["reward"]["name"], config["seed"]) == (cell.parent.name, int(cell.name[-1]))

  # complete cells are not rerun
  assert record["again_returncode"] == 0 and record["again_stdout"].count("skipped") == 4

  assert report.main([str(root), "--baseline=difficulty"]) == 0  # the report command, default output folder
  out = root / "report"
  index = (out / "report.md").read_text()
  # What the tiny coding runs support: copy rate and cost; no evaluation (eval off) and no coverage (Lean).
  for name in ("copy_rate_vs_iteration.png", "ablation.md", "ablation.json", "cost.md", "cost.json"):
    assert (out / "coding" / name).stat().st_size > 0, name
  for name in ("accuracy_vs_step", "accuracy_vs_accelerator_hours", "coverage_vs_iteration",
               "coverage_vs_accelerator_hours", "accuracy_in_domain", "accuracy_out_of_domain", "iterations_to_reach"):
    assert f"`{name}`: not supported by these runs: " in index, name

  # Hand computation from metrics.jsonl: one CPU device, so accelerator-seconds = the sum of time/step,
  # across the kill and resume too.
  cost = json.loads((out / "coding" / "cost.json").read_text())
  ablation = json.loads((out / "coding" / "ablation.json").read_text())
  for arm in ("compassplay_cos", "difficulty"):
    runs = [_lines(root / arm / f"seed_{s}") for s in (0, 1)]
    hours = [sum(l["time/step"] for l in lines) / 3600 for lines in runs]
    copy = [lines[-1]["copy_rate"] for lines in runs]
    row = next(r for r in cost["rows"] if r["arm"] == arm)
    assert row["accelerator_hours"]["values"] == pytest.approx(hours, rel=1e-9)
    assert row["accelerator_hours"]["mean"] == pytest.approx(statistics.mean(hours), rel=1e-9)
    assert row["accelerator_hours"]["sd"] == pytest.approx(statistics.stdev(hours), rel=1e-9)
    row = next(r for r in ablation["rows"] if r["arm"] == arm)
    assert row["copy_rate"]["mean"] == pytest.approx(statistics.mean(copy))
    assert row["copy_rate"]["sd"] == pytest.approx(statistics.stdev(copy))
  assert [c["label"] for c in ablation["columns"]] == ["copy rate @ it 2"]


def test_local_run_continues_past_a_failed_cell_and_names_it(tmp_path, capsys, monkeypatch):
  """Cells run in order as subprocesses; a failing cell does not stop the others, the sweep ends with
  one line naming it, and a rerun skips the cells that completed. (A stand-in for the main command:
  it writes the cell's checkpoint folder for its last step, or fails for seed 1 of difficulty.)"""
  script = ("import pathlib, sys; workdir = pathlib.Path(sys.argv[1])\n"
            "print('ran', workdir.parent.name, workdir.name)\n"
            "sys.exit(3) if workdir.parent.name == 'difficulty' and workdir.name == 'seed_1' else "
            "(workdir / 'checkpoints' / '2').mkdir(parents=True)")
  monkeypatch.setattr(sweep.Cell, "command",
                      lambda self, spec, root, python=sys.executable: [python, "-c", script, str(root / self.dir)])
  args = [f"--config={TINY}", "--rewards=compassplay_cos,difficulty", "--seeds=0,1", f"--root={tmp_path}"]
  assert sweep.main(args) == 1
  captured = capsys.readouterr()
  assert captured.out.count("  ran ") == 4  # every cell ran, the failed one did not stop the rest
  assert "[sweep] cell 4/4 difficulty/seed_1: FAILED (exit 3; log " in captured.out
  assert captured.err.strip() == "error: 1 of 4 cells failed: difficulty/seed_1"
  assert "ran difficulty seed_1" in (tmp_path / "difficulty" / "seed_1" / "sweep.log").read_text()

  assert sweep.main(args) == 1
  captured = capsys.readouterr()
  assert captured.out.count("skipped") == 3 and captured.out.count("  ran ") == 1
