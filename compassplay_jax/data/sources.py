"""Every public data set the configs and the evaluation read: where it comes from, pinned, and its license.

A set is fetched from files in public GitHub repositories (raw files at a commit) or Hugging Face
dataset repositories (at a commit, through huggingface_hub), then converted to the layout the
loaders read (docs/data.md lists the sets, their sources and output files).

Pins. Every upstream file is read at a commit and carries the sha256 of its published bytes
(`Upstream.sha256`), checked on every download. Every output file whose bytes are known here carries
its sha256 too (`DataSet.output_sha256`), checked on every fetch and before a run reads it
(compassplay_jax/selfplay/data_files.py). Each value's comment says what it covers and where it was read.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from compassplay_jax.data import convert

GITHUB = "github"
HF_DATASET = "hf_dataset"


@dataclasses.dataclass(frozen=True)
class Upstream:
  """One published file: a GitHub repo or a Hub dataset repo, a revision and a path inside it, and the
  sha256 of the file's bytes at that revision ("" only where no copy could be read: then the fetch
  checks the download against the content hash the Hub names for the file at the pinned commit)."""
  kind: str  # GITHUB | HF_DATASET
  repo: str
  revision: str
  path: str
  sha256: str = ""

  @property
  def key(self) -> str:
    return f"{self.kind}:{self.repo}@{self.revision}/{self.path}"


@dataclasses.dataclass(frozen=True)
class DataSet:
  name: str
  description: str
  license: str  # SPDX id of the upstream data's license
  inputs: tuple[Upstream, ...]
  outputs: tuple[str, ...]  # files written under the data directory (relpaths)
  convert: convert.Converter  # {upstream path: local file} -> {output relpath: text or bytes}
  # sha256 of output files whose bytes are known here (byte-for-byte copies: the upstream file's pin).
  # Outputs not listed are converted from pinned inputs; the manifest records what the fetch wrote.
  output_sha256: Mapping[str, str] = dataclasses.field(default_factory=dict)
  requires: tuple[str, ...] = ()  # python packages its converter needs beyond the run-time ones
  # Non-empty: the set is fetched only when named (not by --all), and this is printed when it is.
  opt_in: str = ""

# Pinned revisions. GitHub: commits of the upstream repositories. Hub: dataset repo commits.
AZR = ("LeapLabTHU/Absolute-Zero-Reasoner", "41ed983cdf541cfcd2f963f33c055d50074f3c90")  # `paper` branch
PRM800K = ("openai/prm800k", "00811d6de065642a6967b9017d4cee59550c0ef4")
GSM8K = ("openai/grade-school-math", "b52325ad96ea38979fdc222e881ff5d105f95295")
CRUXEVAL = ("facebookresearch/cruxeval", "c7c787365a9a448f4a07058fb57b19fee7d4c471")
DEEPSEEK_PROVER = ("deepseek-ai/DeepSeek-Prover-V1.5", "2c4ba9119eef74d0d611f494261b2c5bae98c69a")
LEAN_WORKBOOK = ("internlm/Lean-Workbook", "4db66c03298bb5a20b5b1e1923d8f42051a4851f")
# test<N>.jsonl holds the problems release vN added: v3 was published 2024-08-12, v4 runs to 2024-09,
# v5 to 2025-01, so the 2024-08 .. 2025-01 window is in test3..test5 (2.4 GB; test .. test2 are older).
# The commit is "add v6", the first with a v6 file; test3..test5 are unchanged since their releases.
LIVECODEBENCH = ("livecodebench/code_generation_lite", "503416f80ac447d31f252d8434023786ce45dd0c")
LCB_FILES = ("test3.jsonl", "test4.jsonl", "test5.jsonl")
# LiveCodeBench-Execution v2 (479 rows): "Update README.md", the commit after the two "Upload dataset"
# commits that wrote data/test-00000-of-00001.parquet (unchanged since). AZR's in-training validation
# read the first release, livecodebench/execution (the same 479 rows, fewer columns); its vendored
# lcb_runner reads this one (lcb_runner/benchmarks/code_execution.py:60).
LCB_EXECUTION = ("livecodebench/execution-v2", "e3bbac6d5da0043c4a0b4e4f4b678f1f6497cc86")
LCB_EXECUTION_FILE = "data/test-00000-of-00001.parquet"

# SGS's target set D3k (3,323 Lean 4 statements filtered from Goedel-Pset-v1), the copy its run scripts
# read (scripts/standard_sgs.py:75, prover_dataset_path="data/D_3k_prover_dataset.json").
SGS = ("LukeBailey181/sgs", "64d2de468a0ddf222d5836248bea1d239a253f49")
D3K_FILE = "data/D_3k_prover_dataset.json"

AZR_MATH_EVAL = "evaluation/math_eval/eval/data"
PRM_TRAIN, PRM_TEST = "prm800k/math_splits/train.jsonl", "prm800k/math_splits/test.jsonl"


# sha256 of the upstream files at the pinned commits.
# GitHub: computed here from `git show <commit>:<path>` of each repository at the pinned commit; for
# PRM800K's git-lfs files, the oid their pointer names at that commit (= sha256 of the content).
SHA256 = {
    (PRM800K[0], PRM_TRAIN): "90d96daeac3fe343ebb1e22ce93dd99690f75983e957f88de42f87cffe1e8076",  # lfs pointer
    (PRM800K[0], PRM_TEST): "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",  # lfs pointer
    (GSM8K[0], "grade_school_math/data/test.jsonl"):
        "a894d6e44162580c754e1809816bcb52a952cc163aaeade510b9664fe37823d4",
    (CRUXEVAL[0], "data/cruxeval.jsonl"): "8368b81047dc5014e4caf5a2f97604eff7644e0ecd7415e3ceeb184bbc2e0c96",
    (AZR[0], f"{AZR_MATH_EVAL}/amc23/test.jsonl"): "43707e1ca784602d8479de24ee8ce36609dbebc46dd152b0b12a46611aa898a4",
    (AZR[0], f"{AZR_MATH_EVAL}/minerva_math/test.jsonl"):
        "0e656b430d3a0a1dab6aa853f453ba3805e28e2cabe4fc72486a897cc09d8ba2",
    (AZR[0], f"{AZR_MATH_EVAL}/olympiadbench/test.jsonl"):
        "bb8c1e38a16ea9eacb77530315a674d883f267fbff79183effc53681b4fcc416",
    (AZR[0], f"{AZR_MATH_EVAL}/aime24/test.jsonl"): "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac",
    (AZR[0], f"{AZR_MATH_EVAL}/aime25/test.jsonl"): "20c1ca392758d96bd1e28af15d9f30df5660257927cacc9eac7301c29f677d1a",
    (AZR[0], "data/7b_coder_seed_io.jsonl"): "33b9608e76737785fa159b94dabe6dfdbc6389a8c55e082ab54e52d9031c717f",
    (AZR[0], "data/7b_coder_code_f_seed_io.jsonl"): "ce609e87fe330f90cfa9f167ac050b4df8bd1bf9d4ab135d90b9a0f5d48f4b84",
    (DEEPSEEK_PROVER[0], "datasets/minif2f.jsonl"): "d6654c88476ff14db19d57dea25bd955a240525fb52171e460f89d98f83d7dd5",
    (SGS[0], D3K_FILE): "1c2a89d8347280f4cf11ae71fca5f0274f9b8efa4f9b1d18b6eaddf62d0c8f42",
    # Hub: the sha256 the Hub's file pages show (its git-lfs/xet pointer). test5: the file's page in
    # livecodebench/code_generation_lite ("feat: release_v5"); test3, test4: their pages in a verbatim
    # duplicate of that repository (jasonsheihX/code_generation_lite), which shows the same test5 value.
    (LIVECODEBENCH[0], "test3.jsonl"): "28ed26cc83363ce3f1fe2d5fad9f8393077beb1907b167a31bd3b32f80801b79",
    (LIVECODEBENCH[0], "test4.jsonl"): "d711138ddaebfcf5f8ec6a4283ee677298c0f5c5d374a235af92aaf0584510da",
    (LIVECODEBENCH[0], "test5.jsonl"): "7f77571c2a6df0c2a72a3277650309f67e01e0008e18117e624633df53f81214",
    # internlm/Lean-Workbook lean_workbook.json and livecodebench/execution-v2's parquet file: no copy or
    # page of them could be read where these pins were written, so they have none; their downloads are
    # checked against the content hash the Hub names for them at the pinned commit (the pointer in that
    # commit's tree).
}


def _github(repo_rev, path) -> Upstream:
  return Upstream(GITHUB, repo_rev[0], repo_rev[1], path, SHA256.get((repo_rev[0], path), ""))


def _hub(repo_rev, path) -> Upstream:
  return Upstream(HF_DATASET, repo_rev[0], repo_rev[1], path, SHA256.get((repo_rev[0], path), ""))


def _copied(*pairs: tuple[Upstream, str]) -> dict[str, str]:
  """output_sha256 of outputs kept byte for byte as published: their upstream file's sha256."""
  return {output: upstream.sha256 for upstream, output in pairs}


def _azr_math(name: str, description: str) -> DataSet:
  """A math evaluation set as packaged in AZR's math eval (from Qwen2.5-Math's evaluation data)."""
  upstream = _github(AZR, f"{AZR_MATH_EVAL}/{name}/test.jsonl")
  return DataSet(name, description, "MIT", (upstream,), (f"{name}/test.jsonl",),
                 convert.copy_jsonl(upstream.path, f"{name}/test.jsonl", ()), _copied((upstream, f"{name}/test.jsonl")))


_AZR_SEEDS = {"data/7b_coder_seed_io.jsonl": "azr_seed/7b_coder_seed_io.jsonl",
              "data/7b_coder_code_f_seed_io.jsonl": "azr_seed/7b_coder_code_f_seed_io.jsonl"}

DATASETS: dict[str, DataSet] = {d.name: d for d in [
    DataSet("math", "MATH (Hendrycks et al.) train and test splits; the coding setting's reference set is drawn "
            "from train", "MIT", (_github(PRM800K, PRM_TRAIN), _github(PRM800K, PRM_TEST)),
            ("math/train.jsonl", "math/test.jsonl"), convert.convert_math(PRM_TRAIN, PRM_TEST)),
    DataSet("math500", "MATH500, the 500-problem MATH test subset of PRM800K", "MIT",
            (_github(PRM800K, PRM_TEST),), ("math500/test.jsonl",),
            convert.copy_jsonl(PRM_TEST, "math500/test.jsonl", convert.MATH_KEYS),
            _copied((_github(PRM800K, PRM_TEST), "math500/test.jsonl"))),
    DataSet("gsm8k", "GSM8K test split", "MIT", (_github(GSM8K, "grade_school_math/data/test.jsonl"),),
            ("gsm8k/test.jsonl",),
            convert.copy_jsonl("grade_school_math/data/test.jsonl", "gsm8k/test.jsonl", ("question", "answer")),
            _copied((_github(GSM8K, "grade_school_math/data/test.jsonl"), "gsm8k/test.jsonl"))),
    _azr_math("amc23", "AMC 2023 (40 problems)"),
    _azr_math("minerva_math", "Minerva math (272 problems)"),
    _azr_math("olympiadbench", "OlympiadBench, English text-only math (675 problems)"),
    _azr_math("aime24", "AIME 2024"),
    _azr_math("aime25", "AIME 2025"),
    DataSet("cruxeval", "CRUXEval (800 Python functions with an input and output)", "MIT",
            (_github(CRUXEVAL, "data/cruxeval.jsonl"),), ("cruxeval/cruxeval.jsonl",),
            convert.copy_jsonl("data/cruxeval.jsonl", "cruxeval/cruxeval.jsonl", ("code", "input", "output", "id")),
            _copied((_github(CRUXEVAL, "data/cruxeval.jsonl"), "cruxeval/cruxeval.jsonl"))),
    DataSet("livecodebench", "LiveCodeBench code generation, problems dated 2024-08-01 .. 2025-01-31", "CC-BY-4.0",
            tuple(_hub(LIVECODEBENCH, f) for f in LCB_FILES), ("livecodebench/test_2408_2501.json",),
            convert.convert_livecodebench(LCB_FILES, "livecodebench/test_2408_2501.json", "2024-08-01", "2025-02-01")),
    DataSet("lcb_execution", "LiveCodeBench-Execution: 479 Python functions with an input and the output",
            "LicenseRef-cc", (_hub(LCB_EXECUTION, LCB_EXECUTION_FILE),), ("lcb_execution/test.jsonl",),
            convert.parquet_to_jsonl(LCB_EXECUTION_FILE, "lcb_execution/test.jsonl",
                                     ("id", "function_name", "code", "input", "output")),
            requires=("pyarrow",)),
    DataSet("azr_seed", "Absolute Zero Reasoner's seed task buffers for Qwen2.5-Coder-7B", "MIT",
            tuple(_github(AZR, up) for up in _AZR_SEEDS), tuple(_AZR_SEEDS.values()),
            convert.copy_jsonl_files(_AZR_SEEDS, ("snippet",)),
            _copied(*((_github(AZR, up), out) for up, out in _AZR_SEEDS.items()))),
    DataSet("minif2f", "miniF2F valid and test in Lean 4, as packaged by DeepSeek-Prover-V1.5", "MIT",
            (_github(DEEPSEEK_PROVER, "datasets/minif2f.jsonl"),), ("minif2f/minif2f.jsonl",),
            convert.copy_jsonl("datasets/minif2f.jsonl", "minif2f/minif2f.jsonl",
                               ("name", "split", "formal_statement")),
            _copied((_github(DEEPSEEK_PROVER, "datasets/minif2f.jsonl"), "minif2f/minif2f.jsonl"))),
    DataSet("d3k", "SGS's target set D3k: 3,323 Lean 4 statements (the Lean setting's targets)", "NOASSERTION",
            (_github(SGS, D3K_FILE),), ("d3k/D_3k_prover_dataset.json",),
            convert.copy_d3k(D3K_FILE, "d3k/D_3k_prover_dataset.json"),
            _copied((_github(SGS, D3K_FILE), "d3k/D_3k_prover_dataset.json")),
            opt_in="d3k: no license is stated for it (github.com/LukeBailey181/sgs has no license file); it is "
                   "downloaded from its authors' repository for your own use, as SGS's code does at run time, "
                   "and not redistributed (docs/data.md)"),
    DataSet("leanworkbook", "Lean Workbook statements: a seeded 1,000-statement sample", "Apache-2.0",
            (_hub(LEAN_WORKBOOK, "lean_workbook.json"),), ("leanworkbook/leanworkbook_train_1k.jsonl",),
            convert.convert_lean_workbook("lean_workbook.json", train_size=1000, seed=0)),
]}


def output_sha256(relpath: str) -> str:
  """The pinned sha256 of an output file ("" when it is converted from pinned inputs, not pinned itself)."""
  dataset = dataset_for(relpath)
  return dataset.output_sha256.get(relpath.strip("/"), "") if dataset else ""


def dataset_for(relpath: str) -> DataSet | None:
  """The set that writes `relpath` (a file under the data directory), if any."""
  relpath = relpath.strip("/")
  for dataset in DATASETS.values():
    if relpath in dataset.outputs or any(out.startswith(relpath + "/") for out in dataset.outputs):
      return dataset
  return None
