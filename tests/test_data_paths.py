"""The data directory setting, the start-up data check, and that the package names no development paths."""
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from compassplay_jax.selfplay import data_files as data_checks
from compassplay_jax.data import paths, sources
from compassplay_jax.domains.coding.reference_set import resolve_path
from compassplay_jax.evals import benchmarks
from tests import xla_env
from tests.conftest import SHARED_DATA
from tests.main_in_process import run_main_output

REPO = pathlib.Path(__file__).resolve().parents[1]


def _config(arg):
  sys.path.insert(0, str(REPO / "configs"))
  try:
    module = __import__(arg.split(":")[0])
  finally:
    sys.path.pop(0)
  return module.get_config(arg.split(":")[1] if ":" in arg else "")


def test_no_development_paths_in_package_or_configs():
  hits = []
  for root in ("compassplay_jax", "configs"):
    for path in (REPO / root).rglob("*"):
      if path.is_file() and path.suffix in (".py", ".md", ".txt", ".json", ".jsonl", ".cfg", ".toml"):
        text = path.read_text(errors="replace")
        hits += [f"{path.relative_to(REPO)}:{n}" for n, line in enumerate(text.splitlines(), 1)
                 if "../shared" in line or "shared/notes" in line]
  assert hits == []


def test_data_dir_precedence(tmp_path, monkeypatch):
  monkeypatch.delenv(paths.ENV, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  assert paths.data_dir("") == tmp_path / "cache" / "compassplay" / "data"
  monkeypatch.setenv(paths.ENV, str(tmp_path / "env"))
  assert paths.data_dir("") == tmp_path / "env"
  assert paths.data_dir(str(tmp_path / "cfg")) == tmp_path / "cfg"
  assert paths.resolve("data:math/train.jsonl") == tmp_path / "env" / "math" / "train.jsonl"
  assert resolve_path("data:math/train.jsonl") == tmp_path / "env" / "math" / "train.jsonl"
  assert paths.resolve("/abs/file.jsonl") == pathlib.Path("/abs/file.jsonl")


def test_every_data_path_in_the_configs_has_a_fetch_source():
  for arg in ("coding", "coding:demo", "lean", "lean:demo"):
    config = _config(arg)
    config.eval.every_steps = 1
    config.eval.benchmarks = "all"
    for field, rel in data_checks.needed_files(config):
      dataset = sources.dataset_for(rel)
      assert dataset is not None and rel in dataset.outputs, (arg, field, rel)
  for spec in benchmarks.BENCHMARKS.values():
    assert sources.dataset_for(spec.relpath) is not None, spec.name


def test_paper_coding_config_names_the_fetch_command_for_each_missing_file(tmp_path):
  config = _config("coding")
  config.data_dir = str(tmp_path / "empty")
  with pytest.raises(paths.DataMissingError) as e:
    data_checks.check_config(config)
  message = str(e.value)
  assert "\n" not in message
  expected = {"azr_seed/7b_coder_seed_io.jsonl": "azr_seed", "azr_seed/7b_coder_code_f_seed_io.jsonl": "azr_seed",
              "math/train.jsonl": "math", "cruxeval/cruxeval.jsonl": "cruxeval",
              "lcb_execution/test.jsonl": "lcb_execution", "math500/test.jsonl": "math500",
              "amc23/test.jsonl": "amc23", "gsm8k/test.jsonl": "gsm8k", "minerva_math/test.jsonl": "minerva_math",
              "olympiadbench/test.jsonl": "olympiadbench"}
  for rel, name in expected.items():
    pattern = re.escape(rel) + r" \([^;]+; python -m compassplay_jax\.cli\.data fetch " + name + " --dir "
    assert re.search(pattern, message), (rel, message)
  # Files that exist are not reported.
  (tmp_path / "empty" / "math").mkdir(parents=True)
  (tmp_path / "empty" / "math" / "train.jsonl").write_text("{}\n")
  with pytest.raises(paths.DataMissingError) as e:
    data_checks.check_config(config)
  assert "math/train.jsonl" not in str(e.value) and "cruxeval/cruxeval.jsonl" in str(e.value)


def _fresh_clone(dest: pathlib.Path) -> pathlib.Path:
  """The working tree's files as a clone has them (tracked and new, not ignored), with nothing beside it."""
  listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                          capture_output=True, check=True).stdout.decode().split("\0")
  for rel in filter(None, listed):
    source = REPO / rel
    if source.is_file():
      (dest / rel).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(source, dest / rel)
  return dest


def test_fresh_clone_stops_at_start_up_with_the_fetch_command(tmp_path):
  """A copy of the repository with no ../shared beside it, no $COMPASSPLAY_DATA, an empty home: the paper
  config stops before loading a model, naming the fetch command for each missing file."""
  clone = _fresh_clone(tmp_path / "clone" / "compassplay-jax")
  assert not (clone.parent / "shared").exists()
  env = {k: v for k, v in os.environ.items() if k not in (paths.ENV, "XDG_CACHE_HOME", "COMPASSPLAY_SHARED_DATA")}
  env.update(HOME=str(tmp_path / "home"), JAX_PLATFORMS="cpu", PYTHONPATH=str(clone))
  result = subprocess.run([sys.executable, "-m", "compassplay_jax.main", "--config=configs/coding.py",
                           "--config.model.path=Qwen/Qwen2.5-Coder-7B", f"--workdir={tmp_path / 'run'}"],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  default = tmp_path / "home" / ".cache" / "compassplay" / "data"
  assert last.startswith(f"error: data files missing under {default}: ")
  for name in ("azr_seed", "math", "cruxeval", "lcb_execution"):
    assert f"python -m compassplay_jax.cli.data fetch {name})" in last
  assert "Get them all: python -m compassplay_jax.cli.data fetch" in last
  assert not (tmp_path / "home" / ".cache" / "huggingface").exists()  # no model download was attempted


@pytest.mark.parametrize("arg", ["coding", "lean"])
def test_paper_configs_pass_the_data_check_on_the_development_data(arg, capsys):
  """The development copy passes, except its GSM8K file: GSM8K's 2021 release, not the pinned commit's
  corrected file (b52325a fixed problem #455), so the check refuses it until eval.paths names it."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f"development data not found at {SHARED_DATA}")
  config = _config(arg)
  config.data_dir = str(SHARED_DATA)
  lcb_execution = SHARED_DATA / benchmarks.LCB_EXECUTION
  if arg == "coding" and not lcb_execution.exists():  # not in every copy: the fixture stands in
    config.eval.paths = f"livecodebench_execution={REPO / 'tests/fixtures/eval' / benchmarks.LCB_EXECUTION}"
  if arg == "coding":
    gsm8k = SHARED_DATA / "gsm8k" / "test.jsonl"
    with pytest.raises(paths.DataIntegrityError) as e:
      data_checks.prepare_config(config)
    message = str(e.value)
    assert "\n" not in message and message.count(" sha256 expected ") == 1 and str(gsm8k) in message
    assert f"expected {sources.output_sha256('gsm8k/test.jsonl')}" in message
    assert f"got {hashlib.sha256(gsm8k.read_bytes()).hexdigest()}" in message
    config.eval.paths = ",".join(filter(None, [config.eval.paths, f"gsm8k={gsm8k}"]))  # named by path: not checked
  d3k = SHARED_DATA / "d3k" / "D_3k_prover_dataset.json"
  if arg == "lean" and not d3k.exists():  # SGS's targets are fetched by name only; the copy lacks them
    with pytest.raises(paths.DataMissingError, match=r"d3k/D_3k_prover_dataset\.json \(lean\.targets_path; "
                       r"python -m compassplay_jax\.cli\.data fetch d3k"):
      data_checks.prepare_config(config)
    config.lean.targets_path = "data:leanworkbook/leanworkbook_train_1k.jsonl"  # the public stand-in
  data_checks.prepare_config(config)
  unchecked = capsys.readouterr().out
  if arg == "coding":
    assert config.coding.seed_dir == str(SHARED_DATA / "azr_seed")
    assert pathlib.Path(config.reward.reference_path).is_file()
    assert config.eval.data_dir == str(SHARED_DATA)
    # Converted files that no fetch wrote here cannot be checked; the run says which.
    expected = "math/train.jsonl" + (f", {benchmarks.LCB_EXECUTION}" if lcb_execution.exists() else "")
    assert f"not checked: {expected}\n" in unchecked
  else:
    stand_in = SHARED_DATA / "leanworkbook" / "leanworkbook_train_1k.jsonl"
    assert config.lean.targets_path == str(d3k if d3k.exists() else stand_in)
  from compassplay_jax.settings.coding import config as coding
  if arg == "coding":
    coding.validate(config)  # the reference file loads from the resolved path


def test_start_up_refuses_data_files_that_are_not_the_pinned_ones(tmp_path, capsys):
  """Every file the paper coding config reads, present but made up: each pinned one is named in one line
  with its pin and its actual sha256; the converted ones are checked against MANIFEST.json once a fetch
  recorded them, and otherwise reported as unchecked."""
  config = _config("coding")
  config.data_dir = str(tmp_path)
  needed = sorted({rel for _, rel in data_checks.needed_files(config)})
  for rel in needed:
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text(f"not the real {rel}\n")
  with pytest.raises(paths.DataIntegrityError) as e:
    data_checks.prepare_config(config)
  message = str(e.value)
  pinned = [rel for rel in needed if sources.output_sha256(rel)]
  assert "\n" not in message and message.count(" sha256 expected ") == len(pinned) >= 8
  for rel in pinned:
    got = hashlib.sha256((tmp_path / rel).read_bytes()).hexdigest()
    assert f"{tmp_path / rel}: sha256 expected {sources.output_sha256(rel)}" in message and f"got {got}" in message
  # With the pinned files left out of the check (named by path), the converted ones are what is left.
  config.eval.paths = ",".join(f"{n}={tmp_path / b.relpath}" for n, b in benchmarks.BENCHMARKS.items()
                               if sources.output_sha256(b.relpath))
  config.coding.seed_dir = str(tmp_path / "azr_seed")
  data_checks.prepare_config(config)
  assert f"not checked: math/train.jsonl, {benchmarks.LCB_EXECUTION}\n" in capsys.readouterr().out
  # Once a fetch has recorded a converted file, an edit to it is refused, naming the manifest.
  config = _config("coding")
  config.data_dir, config.eval.every_steps, config.eval.dense_every_steps = str(tmp_path), 0, 0
  recorded = hashlib.sha256((tmp_path / "math/train.jsonl").read_bytes()).hexdigest()
  (tmp_path / "MANIFEST.json").write_text(json.dumps({"files": {"math/train.jsonl": {"sha256": recorded}}}))
  (tmp_path / "azr_seed").rename(tmp_path / "azr_seed_unused")
  config.coding.seed_dir = ""
  data_checks.prepare_config(config)  # unchanged: passes
  config = _config("coding")
  config.data_dir, config.eval.every_steps, config.eval.dense_every_steps, config.coding.seed_dir = str(tmp_path), 0, 0, ""
  (tmp_path / "math/train.jsonl").write_text("edited\n")
  with pytest.raises(paths.DataIntegrityError, match=r"math/train\.jsonl: sha256 expected " + recorded +
                     r" \(the sha256 the fetch recorded in MANIFEST\.json\), got "):
    data_checks.prepare_config(config)


def test_missing_benchmark_file_names_its_fetch_command(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"python -m compassplay_jax\.cli\.data fetch gsm8k --dir "):
    benchmarks.load_benchmark("gsm8k", data_dir=tmp_path)


def test_backend_line_counts_the_devices():
  env = xla_env.cpu_env(4)
  out = subprocess.run([sys.executable, "-c", "from compassplay_jax.infra.backend import describe_backend as d; print(d())"],
                       env=env, capture_output=True, text=True, timeout=120)
  assert out.stdout.strip() == "backend cpu: 4 devices (4 x cpu)", out.stderr[-1000:]


def test_evaluate_reads_the_configs_data_dir(tmp_path):
  """`python -m compassplay_jax.cli.evaluate` with eval.data_dir = "" reads config.data_dir, not the default."""
  import json
  import ml_collections
  from compassplay_jax.cli import evaluate as evaluate_cli
  from compassplay_jax.evals import harness
  fixtures = REPO / "tests" / "fixtures" / "eval"
  eval_config = harness.default_eval_config()
  eval_config.update(benchmarks="gsm8k", progress=False, num_workers=1)
  config = ml_collections.ConfigDict({"workdir": str(tmp_path), "data_dir": str(fixtures), "eval": eval_config})
  evaluate_cli.run(config, ["/ck/step_1"], load_generate_fn=lambda cfg, ck: (lambda ps, bs: ["no answer"] * len(ps), None))
  results = json.loads((tmp_path / "eval" / "step_1" / "results.json").read_text())
  expected = len((fixtures / "gsm8k" / "test.jsonl").read_text().splitlines())  # 3; the full set has 1319
  assert results["benchmarks"]["gsm8k"]["total"] == expected


def test_run_prints_backend_and_devices_at_start_up(tmp_path, monkeypatch, capsys):
  """main's entry() in this process (tests/main_in_process.py: no interpreter start and imports); the
  command line itself runs in test_user_errors.py and the sweep's cells (tests/shared_runs.py)."""
  monkeypatch.chdir(tmp_path)
  code, out, err = run_main_output([f"--config={REPO}/configs/coding.py:tiny", "--config.steps=0",
                                    f"--workdir={tmp_path}"], capsys)
  assert code == 0, err[-2000:]
  assert "[compassplay] backend cpu: 1 device (cpu)" in out.splitlines()
  # The run's summary states its reference set: drawn by reward.reference_seed, not the run seed.
  from compassplay_jax.domains.coding import reference_set
  stated = json.loads((tmp_path / "summary.json").read_text())["reference_set"]
  expected = reference_set.load_reference_set("builtin:math_mini", stated["size"], 0)
  assert stated == {"path": "builtin:math_mini", "size": 2, "seed": 0, "fingerprint": reference_set.fingerprint(expected)}


def test_every_fetched_file_has_a_project_loader_to_read_it_back():
  """The fetch reads each converted file back with the loader a run reads it with (data_checks.read_back)."""
  for dataset in sources.DATASETS.values():
    for out in dataset.outputs:
      assert data_checks.reader_for(out) is not None, (dataset.name, out)
