"""`python -m compassplay_jax.cli.data fetch` against a fake Hub and a fake GitHub on 127.0.0.1.

The server serves small files in each source's published layout: GitHub raw files at
/gh/<owner>/<repo>/<commit>/<path>, Hub dataset files at /datasets/<repo>/resolve/<revision>/<path>
(the routes and headers huggingface_hub reads). The fetch runs as users run it, in a subprocess; the
served files are not the real ones, so most tests run the command with the pins of sources.py replaced
by the served files' sha256 (PIN_DRIVER), and one runs it with the real pins to see them refuse.
"""
import base64
import dataclasses
import hashlib
import json
import os
import pathlib
import pickle
import subprocess
import sys
import zlib

import pytest

from compassplay_jax.data import sources
from compassplay_jax.evals import benchmarks
from tests.fake_hub import FakeHub

REPO = pathlib.Path(__file__).resolve().parents[1]


def _jsonl(rows):
  return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _lcb_private(tests):
  return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def _lcb_row(qid, date, starter=""):
  kind = "functional" if starter else "stdin"
  public = [{"input": f"{qid}-pub", "output": "1", "testtype": kind}]
  private = [{"input": f"{qid}-priv{i}", "output": str(i), "testtype": kind} for i in range(2)]
  return {"question_id": qid, "question_title": qid, "question_content": f"Problem {qid}", "platform": "atcoder",
          "contest_date": date, "starter_code": starter, "difficulty": "easy",
          "public_test_cases": json.dumps(public), "private_test_cases": _lcb_private(private), "metadata": "{}"}


def _math_row(uid, n):
  return {"problem": f"What is {n}+{n}?", "solution": f"It is $\\boxed{{{2 * n}}}$.", "answer": str(2 * n),
          "subject": "Algebra", "level": 1 + n % 5, "unique_id": uid}


LCB_EXECUTION_ROWS = REPO / "tests" / "fixtures" / "eval" / "lcb_execution" / "test.jsonl"


def lcb_execution_parquet() -> bytes:
  """The hand-made LiveCodeBench-Execution rows as the Hub publishes them: a parquet file with
  execution-v2's columns and types (question_id int64, problem_id list<int64>, contest_date timestamp[us])."""
  pa = pytest.importorskip("pyarrow", reason="the fetch converts a parquet file with pyarrow (test extras)")
  import datetime
  import io
  import pyarrow.parquet as pq
  rows = [json.loads(l) for l in LCB_EXECUTION_ROWS.read_text().splitlines()]
  schema = pa.schema([("question_id", pa.int64()), ("id", pa.string()), ("function_name", pa.string()),
                      ("code", pa.string()), ("input", pa.string()), ("output", pa.string()),
                      ("numsteps", pa.int64()), ("problem_id", pa.list_(pa.int64())), ("contest_id", pa.string()),
                      ("contest_date", pa.timestamp("us")), ("difficulty", pa.string())])
  for row in rows:
    row["contest_date"] = datetime.datetime.fromisoformat(row["contest_date"])
  buffer = io.BytesIO()
  pq.write_table(pa.Table.from_pylist(rows, schema=schema), buffer)
  return buffer.getvalue()


def lfs_pointer(data: bytes) -> bytes:
  return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
          f"size {len(data)}\n").encode()


def upstream_files() -> dict[str, bytes]:
  """Server path -> bytes, for every input of every set, in the upstream formats. PRM800K's files are
  git-lfs files, as upstream: a pointer on the raw host, the content on the media host."""
  gh, hubp = "gh", "datasets"
  files = {}

  def github(repo_rev, path, data):
    if repo_rev == sources.PRM800K:
      files[f"media/{repo_rev[0]}/{repo_rev[1]}/{path}"] = data
      data = lfs_pointer(data)
    files[f"{gh}/{repo_rev[0]}/{repo_rev[1]}/{path}"] = data

  def hub(repo_rev, path, data):
    files[f"{hubp}/{repo_rev[0]}/resolve/{repo_rev[1]}/{path}"] = data

  github(sources.PRM800K, sources.PRM_TRAIN, _jsonl(
      [_math_row(f"train/algebra/{i}.json", i) for i in range(5)] + [_math_row("test/algebra/77.json", 77)]))
  github(sources.PRM800K, sources.PRM_TEST, _jsonl([_math_row(f"test/algebra/{i}.json", i) for i in range(3)]))
  github(sources.GSM8K, "grade_school_math/data/test.jsonl",
         _jsonl([{"question": "2+2?", "answer": "Add.\n#### 4"}, {"question": "1,000+600?", "answer": "#### 1,600"}]))
  math_eval = {
      "amc23": [{"id": 0, "question": "q", "answer": 27.0}],
      "minerva_math": [{"problem": "p", "solution": "so $\\boxed{3}$", "idx": 0}],
      "olympiadbench": [{"id": 1, "question": "q", "final_answer": ["$2$"]}],
      "aime24": [{"id": 60, "problem": "p", "answer": "204"}],
      "aime25": [{"id": "I-1", "problem": "p", "answer": "70"}]}
  for name, rows in math_eval.items():
    github(sources.AZR, f"{sources.AZR_MATH_EVAL}/{name}/test.jsonl", _jsonl(rows))
  github(sources.CRUXEVAL, "data/cruxeval.jsonl",
         _jsonl([{"code": "def f(x):\n    return x + 1", "input": "1", "output": "2", "id": "sample_0"}]))
  github(sources.AZR, "data/7b_coder_seed_io.jsonl",
         _jsonl([{"snippet": "def f(a):\n    return a", "input": "1", "output": "1", "imports": []}]))
  github(sources.AZR, "data/7b_coder_code_f_seed_io.jsonl", _jsonl(
      [{"snippet": "def f(a):\n    return a", "inputs": ["1", "2"], "outputs": ["1", "2"], "message": "id",
        "imports": []}]))
  github(sources.DEEPSEEK_PROVER, "datasets/minif2f.jsonl", _jsonl(
      [{"name": "mathd_1", "split": "test", "informal_prefix": "", "header": "import Mathlib\n",
        "formal_statement": "theorem mathd_1 : (1 : ℕ) + 1 = 2 := by\n", "goal": ""}]))
  lcb = {f: [] for f in sources.LCB_FILES}
  lcb["test3.jsonl"] = [_lcb_row("old", "2024-07-28T00:00:00")]
  lcb["test4.jsonl"] = [_lcb_row("in_aug", "2024-08-03T00:00:00")]
  lcb["test5.jsonl"] = [_lcb_row("in_jan", "2025-01-31T12:00:00", starter="class Solution:\n    def f(self): pass"),
                        _lcb_row("new", "2025-02-01T00:00:00")]
  for name, rows in lcb.items():
    hub(sources.LIVECODEBENCH, name, _jsonl(rows) if rows else _jsonl([_lcb_row(f"x_{name}", "2023-06-01")]))
  hub(sources.LCB_EXECUTION, sources.LCB_EXECUTION_FILE, lcb_execution_parquet())
  github(sources.SGS, sources.D3K_FILE, json.dumps({"iterations": [], "target_statements": {
      f"id{i}": {"id": f"id{i}", "header": "import Mathlib\n", "theorem": f"theorem d3k_{i} : (1 : ℕ) + {i} = {i} + 1 := by",
                 "tag": "statement", "source": "d_3k", "proofs": []} for i in range(3)}}).encode())
  workbook = [{"id": f"lean_workbook_{i}", "split": "lean_workbook",
               "formal_statement": f"theorem lean_workbook_{i} : (1 : ℕ) + {i} = {i} + 1 := by", "status": "open"}
              for i in range(1010)]
  hub(sources.LEAN_WORKBOOK, "lean_workbook.json", json.dumps(workbook).encode())
  return files


@pytest.fixture
def fake_server():
  with FakeHub() as server:
    server.files = upstream_files()
    yield server


# Runs the fetch command with sources.py's pins replaced: argv[1] is a JSON file {"<repo>/<path>": sha256}
# for upstream files ("" = no pin); copied outputs take their upstream file's new pin.
PIN_DRIVER = """
import dataclasses, json, sys
from compassplay_jax.data import sources
from compassplay_jax.cli import data as cli
pins = json.load(open(sys.argv[1]))
for name, d in list(sources.DATASETS.items()):
  new = {u.sha256: pins.get(f"{u.repo}/{u.path}", "") for u in d.inputs}
  inputs = tuple(dataclasses.replace(u, sha256=pins.get(f"{u.repo}/{u.path}", "")) for u in d.inputs)
  outputs = {o: new[sha] for o, sha in d.output_sha256.items()}
  sources.DATASETS[name] = dataclasses.replace(d, inputs=inputs, output_sha256=outputs)
sys.exit(cli.main(sys.argv[2:]))
"""


def served_pins(server) -> dict[str, str]:
  """The sha256 of each served upstream file (the content, for git-lfs files), keyed "<repo>/<path>"; a
  file unpinned in sources.py (Lean Workbook's) stays unpinned (checked against the Hub's content hash)."""
  pins = {}
  for dataset in sources.DATASETS.values():
    for u in dataset.inputs:
      if not u.sha256:
        continue
      if u.kind == sources.HF_DATASET:
        key = f"datasets/{u.repo}/resolve/{u.revision}/{u.path}"
      else:
        key = f"{'media' if u.repo == sources.PRM800K[0] else 'gh'}/{u.repo}/{u.revision}/{u.path}"
      if key in server.files:  # (a test may have taken a file off the server)
        pins[f"{u.repo}/{u.path}"] = hashlib.sha256(server.files[key]).hexdigest()
  return pins


def _fetch(server, data_dir, tmp_path, *args, real_pins=False):
  url = server.url
  env = dict(os.environ, HF_ENDPOINT=url, COMPASSPLAY_GITHUB_RAW=f"{url}/gh", COMPASSPLAY_GITHUB_MEDIA=f"{url}/media",
             HF_HOME=str(tmp_path / "hf_home"),
             COMPASSPLAY_DATA=str(data_dir), HF_HUB_DISABLE_TELEMETRY="1")
  for name in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
    env.pop(name, None)
  if real_pins:
    command = [sys.executable, "-m", "compassplay_jax.cli.data"]
  else:
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps(served_pins(server)))
    command = [sys.executable, "-c", PIN_DRIVER, str(pins)]
  return subprocess.run([*command, "fetch", "--no-progress", *args],
                        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)


def _sha(path):
  return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fetch_all_converts_records_and_is_idempotent(fake_server, tmp_path):
  data = tmp_path / "data"
  listed = _fetch(fake_server, data, tmp_path, "--list")
  assert listed.returncode == 0 and "missing" in listed.stdout
  first = _fetch(fake_server, data, tmp_path, "--all")
  assert first.returncode == 0, first.stderr[-3000:]

  # Every declared output exists, is in the manifest, and its sha256 (hashlib) matches the manifest;
  # opt-in sets (D3k: no license stated) are left out of --all, with a line saying so.
  manifest = json.loads((data / "MANIFEST.json").read_text())
  opt_in = [d for d in sources.DATASETS.values() if d.opt_in]
  assert [d.name for d in opt_in] == ["d3k"] and not (data / "d3k").exists()
  assert "d3k: not fetched by --all, only by name (d3k: no license is stated" in first.stdout
  for dataset in (d for d in sources.DATASETS.values() if not d.opt_in):
    for out in dataset.outputs:
      entry = manifest["files"][out]
      assert entry["sha256"] == _sha(data / out) and entry["license"] == dataset.license
      assert {s["revision"] for s in entry["sources"]} == {u.revision for u in dataset.inputs}
      served = {fake_server.files[k] for k in fake_server.files for u in dataset.inputs if k.endswith(u.path)}
      assert {s["sha256"] for s in entry["sources"]} <= {hashlib.sha256(b).hexdigest() for b in served}

  # MATH: the original splits recovered from PRM800K's unique_ids, in MATH's field names.
  train = [json.loads(l) for l in (data / "math/train.jsonl").read_text().splitlines()]
  test = [json.loads(l) for l in (data / "math/test.jsonl").read_text().splitlines()]
  assert [r["unique_id"] for r in train] == [f"train/algebra/{i}.json" for i in range(5)]
  assert sorted(r["unique_id"] for r in test) == sorted([f"test/algebra/{i}.json" for i in range(3)] +
                                                        ["test/algebra/77.json"])
  assert train[1]["level"] == "Level 2" and train[1]["type"] == "Algebra"
  # Sets kept as published are byte-identical to the upstream file (git-lfs content, not its pointer).
  prm, crux = "/".join(sources.PRM800K), "/".join(sources.CRUXEVAL)
  for out, upstream in (("math500/test.jsonl", f"media/{prm}/{sources.PRM_TEST}"),
                        ("cruxeval/cruxeval.jsonl", f"gh/{crux}/data/cruxeval.jsonl")):
    assert (data / out).read_bytes() == fake_server.files[upstream]

  # LiveCodeBench: only the 2024-08 .. 2025-01 window, with the private tests decoded.
  lcb = json.loads((data / "livecodebench/test_2408_2501.json").read_text())
  assert [p["question_id"] for p in lcb] == ["in_aug", "in_jan"]
  assert [t["input"] for t in lcb[0]["tests"]] == ["in_aug-pub", "in_aug-priv0", "in_aug-priv1"]
  items = benchmarks.load_benchmark("livecodebench_generation", data_dir=data)
  assert [len(i.tests) for i in items] == [3, 3]

  # LiveCodeBench-Execution: the parquet rows as JSON lines, column for column (the fixture file itself).
  assert (data / "lcb_execution/test.jsonl").read_bytes() == LCB_EXECUTION_ROWS.read_bytes()
  assert manifest["files"]["lcb_execution/test.jsonl"]["sources"][0]["checked_against"] == "hub content hash"

  # Every benchmark loads through the project's loader from the fetched directory.
  for name in benchmarks.BENCHMARKS:
    assert benchmarks.load_benchmark(name, data_dir=data), name
  assert benchmarks.load_benchmark("gsm8k", data_dir=data)[1].answer == "1600"
  workbook = (data / "leanworkbook/leanworkbook_train_1k.jsonl").read_text().splitlines()
  assert len(workbook) == 1000 and len({json.loads(l)["name"] for l in workbook}) == 1000
  assert sorted(p.name for p in (data / "leanworkbook").iterdir()) == ["leanworkbook_train_1k.jsonl"]
  # Each source is recorded with what its download was checked against.
  assert {s["checked_against"] for e in manifest["files"].values() for s in e["sources"]} == {"pin", "hub content hash"}
  assert manifest["files"]["leanworkbook/leanworkbook_train_1k.jsonl"]["sources"][0]["checked_against"] == "hub content hash"

  # A second run downloads nothing.
  fake_server.requests.clear()
  second = _fetch(fake_server, data, tmp_path, "--all")
  assert second.returncode == 0, second.stderr
  assert fake_server.requests == []
  assert second.stdout.count("up to date") == len(sources.DATASETS) - len(opt_in)
  listed = _fetch(fake_server, data, tmp_path, "--list")
  assert listed.stdout.count(" ok ") == len(sources.DATASETS) - len(opt_in)

  # By name, D3k is fetched as published, with the license note, and loads as the Lean targets.
  fake_server.requests.clear()
  named = _fetch(fake_server, data, tmp_path, "d3k")
  assert named.returncode == 0, named.stderr
  assert "note: d3k: no license is stated" in named.stdout and len(fake_server.requests) == 1
  served = fake_server.files[f"gh/{sources.SGS[0]}/{sources.SGS[1]}/{sources.D3K_FILE}"]
  assert (data / "d3k/D_3k_prover_dataset.json").read_bytes() == served
  from compassplay_jax.domains.lean.targets import load_targets
  assert [t.name for t in load_targets(data / "d3k/D_3k_prover_dataset.json")] == ["id0", "id1", "id2"]


def test_corrupted_file_fails_its_sha256_with_one_line(fake_server, tmp_path):
  data = tmp_path / "data"
  assert _fetch(fake_server, data, tmp_path, "cruxeval").returncode == 0
  target = data / "cruxeval/cruxeval.jsonl"
  target.write_text(target.read_text().replace("return x + 1", "return x + 2"))
  fake_server.requests.clear()
  again = _fetch(fake_server, data, tmp_path, "cruxeval")
  assert again.returncode == 1
  lines = again.stderr.strip().splitlines()
  assert len(lines) == 1 and "sha256" in lines[0] and "cruxeval/cruxeval.jsonl" in lines[0]
  assert "python -m compassplay_jax.cli.data fetch cruxeval" in lines[0]
  assert fake_server.requests == []
  assert "corrupt" in _fetch(fake_server, data, tmp_path, "--list").stdout


def test_lfs_download_that_does_not_match_its_pointer_fails_with_one_line(fake_server, tmp_path):
  key = f"media/{sources.PRM800K[0]}/{sources.PRM800K[1]}/{sources.PRM_TEST}"
  fake_server.files[key] = fake_server.files[key].replace(b"What is", b"What's")
  result = _fetch(fake_server, tmp_path / "data", tmp_path, "math500")
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "sha256" in lines[0] and sources.PRM_TEST in lines[0]
  assert not (tmp_path / "data" / "math500" / "test.jsonl").exists()


def test_unknown_set_and_missing_upstream_are_one_line_errors(fake_server, tmp_path):
  data = tmp_path / "data"
  unknown = _fetch(fake_server, data, tmp_path, "nosuchset")
  assert unknown.returncode == 1 and len(unknown.stderr.strip().splitlines()) == 1
  assert "nosuchset" in unknown.stderr
  fake_server.files = {k: v for k, v in fake_server.files.items() if "cruxeval.jsonl" not in k}
  missing = _fetch(fake_server, data, tmp_path, "cruxeval")
  assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
  assert "404" in missing.stderr and "data/cruxeval.jsonl" in missing.stderr
  assert not (data / "cruxeval/cruxeval.jsonl").exists()


def test_a_file_its_loader_rejects_is_not_written(fake_server, tmp_path):
  data = tmp_path / "data"
  key = next(k for k in fake_server.files if k.endswith("grade_school_math/data/test.jsonl"))
  fake_server.files[key] = _jsonl([{"question": "2+2?", "answer": "4"}])  # no "#### <answer>" line
  result = _fetch(fake_server, data, tmp_path, "gsm8k")
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "gsm8k/test.jsonl" in lines[0] and "####" in lines[0]
  assert list((data / "gsm8k").iterdir()) == [] and not (data / "MANIFEST.json").exists()


def test_the_real_pins_refuse_files_that_are_not_the_pinned_ones(fake_server, tmp_path):
  """With sources.py's own pins, the served (made-up) files are refused: one line naming the file, the
  pinned sha256 and the download's, and nothing is written."""
  data = tmp_path / "data"
  for name, upstream in (("cruxeval", sources.DATASETS["cruxeval"].inputs[0]),
                         ("livecodebench", sources.DATASETS["livecodebench"].inputs[0])):
    result = _fetch(fake_server, data, tmp_path, name, real_pins=True)
    assert result.returncode == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    served = next(b for k, b in fake_server.files.items() if k.endswith(f"{upstream.revision}/{upstream.path}"))
    assert len(lines) == 1 and upstream.path in lines[0], lines
    assert f"expected {upstream.sha256}" in lines[0] and f"got {hashlib.sha256(served).hexdigest()}" in lines[0]
  assert not (data / "MANIFEST.json").exists() and not any(p.is_file() for p in data.rglob("*"))


def test_an_unpinned_hub_file_is_checked_against_the_hubs_content_hash(fake_server, tmp_path):
  """Lean Workbook's file has no pin: its download must match the hash the Hub named for it (the cached
  blob's name). A cached copy altered after the download is refused with one line."""
  data = tmp_path / "data"
  assert _fetch(fake_server, data, tmp_path, "leanworkbook").returncode == 0
  blobs = [p for p in (tmp_path / "hf_home").rglob("blobs/*") if p.is_file()]
  assert len(blobs) == 1 and len(blobs[0].name) == 40  # the fake Hub's ETag: the git blob sha1
  blobs[0].write_bytes(blobs[0].read_bytes().replace(b"lean_workbook_1", b"lean_workbook_X", 1))
  (data / "leanworkbook/leanworkbook_train_1k.jsonl").unlink()
  result = _fetch(fake_server, data, tmp_path, "leanworkbook")
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 1 and len(lines) == 1, result.stderr
  assert "lean_workbook.json" in lines[0] and f"expected {blobs[0].name}" in lines[0]


def test_a_set_whose_converter_needs_a_missing_package_says_so_before_downloading(tmp_path):
  from compassplay_jax.data import fetch
  dataset = dataclasses.replace(sources.DATASETS["lcb_execution"], requires=("compassplay_no_such_package",))
  with pytest.raises(fetch.FetchError, match=r"^lcb_execution: converting it needs the python package\(s\) "
                     r"compassplay_no_such_package \(pip install compassplay_no_such_package\)$"):
    fetch.fetch_dataset(dataset, tmp_path, {"files": {}}, log=lambda _: None)
  assert list(tmp_path.iterdir()) == []


def test_the_d3k_converter_checks_sgs_layout(tmp_path):
  from compassplay_jax.data import convert
  bad = {"list.json": "[]", "empty.json": '{"target_statements": {}}',
         "no_theorem.json": '{"target_statements": {"a": {"header": "import Mathlib"}}}'}
  for name, text in bad.items():
    (tmp_path / name).write_text(text)
    with pytest.raises(convert.ConvertError, match=r"^f: "):
      convert.copy_d3k("f", "d3k/out.json")({"f": tmp_path / name})


def test_the_fetched_d3k_file_is_sgs_target_set(shared_data):
  """Real data (skips unless fetched): the pinned file, 3,323 targets the Lean loader reads."""
  from compassplay_jax.domains.lean.targets import load_targets
  from tests.conftest import shared_file
  path = shared_file("d3k/D_3k_prover_dataset.json")
  assert hashlib.sha256(path.read_bytes()).hexdigest() == sources.output_sha256("d3k/D_3k_prover_dataset.json")
  targets = load_targets(path)
  assert len(targets) == 3323 and all(t.statement.startswith("theorem ") for t in targets)


def test_lean_workbook_converter_reads_a_list_or_json_lines(tmp_path):
  from compassplay_jax.data import convert
  records = [{"id": f"lean_workbook_{i}", "split": "lean_workbook", "formal_statement": f"theorem t{i} : True := by"}
             for i in range(5)]
  as_list, as_lines = tmp_path / "list.json", tmp_path / "lines.json"
  as_list.write_text(json.dumps(records))
  as_lines.write_text(_jsonl(records).decode())
  outputs = [convert.convert_lean_workbook("f", train_size=3, seed=0)({"f": p}) for p in (as_list, as_lines)]
  assert outputs[0] == outputs[1] and list(outputs[0]) == ["leanworkbook/leanworkbook_train_1k.jsonl"]
  chosen = [json.loads(l)["name"] for l in outputs[0]["leanworkbook/leanworkbook_train_1k.jsonl"].splitlines()]
  assert len(set(chosen)) == 3 and set(chosen) <= {r["id"] for r in records}


def test_math_levels_take_math_s_spelling():
  from compassplay_jax.data import convert
  levels = [convert._math_level(v) for v in (3, "3", "Level 4", None, "?")]  # pylint: disable=protected-access
  assert levels == ["Level 3", "Level 3", "Level 4", "Level ?", "Level ?"]
