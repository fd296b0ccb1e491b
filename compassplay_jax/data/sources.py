"""Every public data set the configs and the evaluation read: where it comes from, pinned, and its license.

A set is fetched from files in public GitHub repositories (raw files at a commit) or Hugging Face
dataset repositories (at a commit, through huggingface_hub), then converted to the layout the
loaders read (docs/data.md lists the sets, their sources and output files).
"""
from __future__ import annotations

import dataclasses

from compassplay_jax.data import convert

GITHUB = "github"
HF_DATASET = "hf_dataset"


@dataclasses.dataclass(frozen=True)
class Upstream:
  """One published file: a GitHub repo or a Hub dataset repo, a revision and a path inside it."""
  kind: str  # GITHUB | HF_DATASET
  repo: str
  revision: str
  path: str

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
  convert: convert.Converter  # {upstream path: local file} -> {output relpath: text}


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

AZR_MATH_EVAL = "evaluation/math_eval/eval/data"
PRM_TRAIN, PRM_TEST = "prm800k/math_splits/train.jsonl", "prm800k/math_splits/test.jsonl"


def _github(repo_rev, path) -> Upstream:
  return Upstream(GITHUB, repo_rev[0], repo_rev[1], path)


def _hub(repo_rev, path) -> Upstream:
  return Upstream(HF_DATASET, repo_rev[0], repo_rev[1], path)


def _azr_math(name: str, description: str) -> DataSet:
  """A math evaluation set as packaged in AZR's math eval (from Qwen2.5-Math's evaluation data)."""
  upstream = f"{AZR_MATH_EVAL}/{name}/test.jsonl"
  return DataSet(name, description, "MIT", (_github(AZR, upstream),), (f"{name}/test.jsonl",),
                 convert.copy_jsonl(upstream, f"{name}/test.jsonl", ()))


DATASETS: dict[str, DataSet] = {d.name: d for d in [
    DataSet("math", "MATH (Hendrycks et al.) train and test splits; the coding setting's reference set is drawn "
            "from train", "MIT", (_github(PRM800K, PRM_TRAIN), _github(PRM800K, PRM_TEST)),
            ("math/train.jsonl", "math/test.jsonl"), convert.convert_math(PRM_TRAIN, PRM_TEST)),
    DataSet("math500", "MATH500, the 500-problem MATH test subset of PRM800K", "MIT",
            (_github(PRM800K, PRM_TEST),), ("math500/test.jsonl",),
            convert.copy_jsonl(PRM_TEST, "math500/test.jsonl", convert.MATH_KEYS)),
    DataSet("gsm8k", "GSM8K test split", "MIT", (_github(GSM8K, "grade_school_math/data/test.jsonl"),),
            ("gsm8k/test.jsonl",),
            convert.copy_jsonl("grade_school_math/data/test.jsonl", "gsm8k/test.jsonl", ("question", "answer"))),
    _azr_math("amc23", "AMC 2023 (40 problems)"),
    _azr_math("minerva_math", "Minerva math (272 problems)"),
    _azr_math("olympiadbench", "OlympiadBench, English text-only math (675 problems)"),
    _azr_math("aime24", "AIME 2024"),
    _azr_math("aime25", "AIME 2025"),
    DataSet("cruxeval", "CRUXEval (800 Python functions with an input and output)", "MIT",
            (_github(CRUXEVAL, "data/cruxeval.jsonl"),), ("cruxeval/cruxeval.jsonl",),
            convert.copy_jsonl("data/cruxeval.jsonl", "cruxeval/cruxeval.jsonl", ("code", "input", "output", "id"))),
    DataSet("livecodebench", "LiveCodeBench code generation, problems dated 2024-08-01 .. 2025-01-31", "CC-BY-4.0",
            tuple(_hub(LIVECODEBENCH, f) for f in LCB_FILES), ("livecodebench/test_2408_2501.json",),
            convert.convert_livecodebench(LCB_FILES, "livecodebench/test_2408_2501.json", "2024-08-01", "2025-02-01")),
    DataSet("azr_seed", "Absolute Zero Reasoner's seed task buffers for Qwen2.5-Coder-7B", "MIT",
            (_github(AZR, "data/7b_coder_seed_io.jsonl"), _github(AZR, "data/7b_coder_code_f_seed_io.jsonl")),
            ("azr_seed/7b_coder_seed_io.jsonl", "azr_seed/7b_coder_code_f_seed_io.jsonl"),
            convert.copy_jsonl_files({"data/7b_coder_seed_io.jsonl": "azr_seed/7b_coder_seed_io.jsonl",
                                      "data/7b_coder_code_f_seed_io.jsonl": "azr_seed/7b_coder_code_f_seed_io.jsonl"},
                                     ("snippet",))),
    DataSet("minif2f", "miniF2F valid and test in Lean 4, as packaged by DeepSeek-Prover-V1.5", "MIT",
            (_github(DEEPSEEK_PROVER, "datasets/minif2f.jsonl"),), ("minif2f/minif2f.jsonl",),
            convert.copy_jsonl("datasets/minif2f.jsonl", "minif2f/minif2f.jsonl",
                               ("name", "split", "formal_statement"))),
    DataSet("leanworkbook", "Lean Workbook statements: a seeded 1,000-statement sample (the Lean setting's "
            "targets) and the upstream test split where present", "Apache-2.0",
            (_hub(LEAN_WORKBOOK, "lean_workbook.json"),), ("leanworkbook/leanworkbook_train_1k.jsonl",),
            convert.convert_lean_workbook("lean_workbook.json", train_size=1000, seed=0)),
]}


def dataset_for(relpath: str) -> DataSet | None:
  """The set that writes `relpath` (a file under the data directory), if any."""
  relpath = relpath.strip("/")
  for dataset in DATASETS.values():
    if relpath in dataset.outputs or any(out.startswith(relpath + "/") for out in dataset.outputs):
      return dataset
  return None
