"""Which benchmark fills which column of the paper's two accuracy tables (and of the figures' two means).

Benchmark names are those of compassplay_jax/evals/benchmarks.py (the `eval/<name>` metrics and the
eval/step_*/results.json entries); a benchmark in neither table goes to the report's `accuracy_other`.
Each table's mean column is computed by the report from these columns alone, so it is the paper's mean
whatever `domain` the registry gives a benchmark.
"""
from __future__ import annotations

import dataclasses

# Benchmark name -> column header, in the paper's column order.
IN_DOMAIN_COLUMNS = {
    "livecodebench_execution": "LCB",  # LiveCodeBench-Execution, as AZR validates (docs/paper_settings.md §6)
    "cruxeval_i": "CRUXEval-I",
    "cruxeval_o": "CRUXEval-O",
}
OUT_OF_DOMAIN_COLUMNS = {
    "math500": "MATH500",
    "amc23": "AMC23",
    "gsm8k": "GSM8K",
    "minerva_math": "Minerva",
    "olympiadbench": "OlympiadBench",
}


@dataclasses.dataclass(frozen=True)
class PaperTable:
  name: str  # the report's file stem
  title: str
  columns: dict[str, str]  # benchmark name -> column header
  mean_key: str  # the key of its mean column (also a panel of the figures)


PAPER_TABLES = (
    PaperTable("accuracy_in_domain", "In-domain accuracy (%)", IN_DOMAIN_COLUMNS, "in_domain_mean"),
    PaperTable("accuracy_out_of_domain", "Out-of-domain accuracy (%)", OUT_OF_DOMAIN_COLUMNS, "out_of_domain_mean"),
)
MEANS = {t.mean_key: t.columns for t in PAPER_TABLES}  # mean key -> the benchmarks it averages
MEAN_LABELS = {"in_domain_mean": "in-domain mean", "out_of_domain_mean": "out-of-domain mean"}
PAPER_BENCHMARKS = {name for t in PAPER_TABLES for name in t.columns}


def step_means(accuracies: dict[str, float]) -> dict[str, float]:
  """The two means of one evaluation: each the mean of its table's benchmarks evaluated there (a mean is
  absent when none of them was)."""
  out = {}
  for key, columns in MEANS.items():
    members = [accuracies[name] for name in columns if accuracies.get(name) is not None]
    if members:
      out[key] = sum(members) / len(members)
  return out
