"""Does SOAR's inner loop move the model? (issue 50 item 3; docs/rewards.md, "soar_utility", "Does the
copy move?")

  python experiments/soar_movement.py --out=runs/soar_movement            # the docs' table
  python experiments/soar_movement.py --runs=sgd:1e-4,adam:1e-5 --groups=2 --answer-tokens=64

At the demo scale (configs/coding.py:demo, SmolLM2-135M, reward.name=soar_utility) and the initial
params, for each (inner optimizer, lr) of --runs, soar_measure.measure, the loop's own SOAR
measurement, on --groups groups of the 64 real demo candidates committed in
docs/figures/proxy/candidates.json (valid candidates with verified solutions from real demo steps;
experiments/proxy_vs_utility.py collected them), with SOAR's inner shape (10 steps of batch 8), once
with the NLL signal and once with the accuracy signal (--heldout problems of builtin:math_mini outside
the 4-problem reference set, --answer-tokens greedy tokens each). Per run it prints and writes
(OUT/results.json, OUT/table.md) the metrics the loop logs: the copy's parameter change (L2, RMS
relative to the params' RMS, largest change in bf16 ulps, fraction of weights whose bf16 value
changes), the distinct rewards, the held-out NLL drop, the fraction of held-out greedy answers that
changed and the accuracy gain; and the numbers the 7B arithmetic needs (parameter count, weight RMS,
the inner gradient's global norm at the first step).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import types

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
  sys.path.insert(0, str(REPO))

CANDIDATES = REPO / "docs" / "figures" / "proxy" / "candidates.json"


def _config(args):
  from compassplay_jax.cli import sweep
  config = sweep.load_config("configs/coding.py:demo")
  r = config.reward
  r.name = "soar_utility"
  r.soar_heldout_size = args.heldout
  r.soar_answer_tokens = args.answer_tokens
  return config


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--runs", default="sgd:1e-4,sgd:1e-2,adam:1e-6,adam:1e-5,adam:1e-4",
                 help="comma-separated optimizer:lr pairs")
  p.add_argument("--groups", type=int, default=2, help="groups per run (of --group-size candidates)")
  p.add_argument("--group-size", type=int, default=32)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--heldout", type=int, default=8, help="held-out problems (math_mini has 8 outside the reference set)")
  p.add_argument("--answer-tokens", type=int, default=128)
  p.add_argument("--signals", default="nll,accuracy")
  p.add_argument("--out", default="runs/soar_movement")
  args = p.parse_args(argv)
  t_start, load_before = time.time(), os.getloadavg()

  import jax
  from flax import nnx
  from compassplay_jax.runtime import config_base
  from compassplay_jax.infra import sharding as sh
  from compassplay_jax.runtime.engine import Engine, EngineSettings
  from compassplay_jax.evals import benchmarks, math_check, prompts as eval_prompts
  from compassplay_jax.rewards.proposer_rewards import RewardConfig
  from compassplay_jax.rewards.reference import reference_loss_and_gradient
  from compassplay_jax.selfplay import alignment, soar_measure
  from compassplay_jax.selfplay import step as step_lib
  from compassplay_jax.settings.coding.setting import render
  from compassplay_jax.selfplay.run import build_model
  from compassplay_jax.selfplay.sequences import TRAIN_BUCKETS, pack

  config = _config(args)
  model, tok = build_model(config)
  graphdef, params = nnx.split(model)
  engine = Engine.build(graphdef, params, sh.make_mesh((1, 1, 1), jax.devices()[:1]), EngineSettings.from_config(config))
  pad, max_len = tok.pad_token_id, config_base.reward_sequence_len(config)
  stored = json.loads(CANDIDATES.read_text())["candidates"]
  n = args.groups * args.group_size
  candidates = [step_lib.Candidate(group=c["group"], formatted=True, valid=True, solve_rate=c["solve_rate"],
                                   solution=(np.asarray(c["prompt_ids"], np.int32), np.asarray(c["completion_ids"], np.int32)))
                for c in stored[:n]]

  # What the 7B arithmetic needs: parameter count, weight RMS, the inner gradient's norm at step 0.
  leaves = jax.tree.leaves(params)
  count = sum(x.size for x in leaves)
  weight_rms = float(np.sqrt(sum(float(jax.numpy.sum(jax.numpy.square(x.astype(np.float32)))) for x in leaves) / count))
  packed = pack([c.solution[0] for c in candidates[:args.batch]], [c.solution[1] for c in candidates[:args.batch]],
                pad, max_len=max_len, buckets=TRAIN_BUCKETS)
  _, g = jax.jit(lambda q, t, lm, am: reference_loss_and_gradient(graphdef, q, t, lm, am, 4))(
      params, packed.tokens, packed.loss_mask, packed.attention_mask)
  grad_norm = float(np.sqrt(sum(float(jax.numpy.sum(jax.numpy.square(x))) for x in jax.tree.leaves(g))))
  print(f"[soar] {count:,} params, weight RMS {weight_rms:.4g}, inner gradient norm at step 0 {grad_norm:.4g} "
        f"(batch {args.batch}); load {os.getloadavg()[0]:.1f}", flush=True)

  problems = soar_measure.heldout_problems(config.reward)
  signals = args.signals.split(",")
  checker = None
  if "accuracy" in signals:
    checker = math_check.MathChecker(num_workers=1, timeout_s=config.eval.math_timeout_s)
    answers = soar_measure.HeldoutAnswers(
        prompts=tuple(eval_prompts.build_prompt(
            benchmarks.EvalItem("soar_heldout", str(i), "math", question=q.problem, answer=q.answer),
            config.eval.prompt_style, tok) for i, q in enumerate(problems)),
        answers=tuple(q.answer for q in problems), tokenizer=tok, checker=checker,
        max_new_tokens=args.answer_tokens, batch_size=len(problems))
  heldout = alignment.pack_reference(tok, [render(tok, q.problem, config.coding.prompt_style) for q in problems],
                                     [q.solution for q in problems], max_len=max_len)
  rows = []
  try:
    for run in args.runs.split(","):
      optimizer, lr = run.split(":")
      row = {"optimizer": optimizer, "lr": float(lr)}
      for signal in signals:
        options = types.SimpleNamespace(heldout=heldout, group_size=args.group_size, steps=args.steps,
                                        learning_rate=float(lr), batch_rows=args.batch, optimizer=optimizer,
                                        accuracy=answers if signal == "accuracy" else None)
        t0 = time.time()
        _, m = soar_measure.measure(engine, params, candidates, options, pad_id=pad, max_len=max_len,
                                    reward_cfg=RewardConfig())
        row[signal] = {k.removeprefix("soar/"): v for k, v in m.items()}
        row[signal]["wall_s"] = time.time() - t0
        print(f"[soar] {optimizer} lr {lr} {signal}: " + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row[signal].items()), flush=True)
      rows.append(row)
  finally:
    if checker is not None:
      checker.close()

  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  header = (f"configs/coding.py:demo (SmolLM2-135M, fp32), initial params, {args.groups} groups of {args.group_size} "
            f"real demo candidates, {args.steps} inner steps of batch {args.batch}, {len(problems)} held-out "
            f"math_mini problems, {args.answer_tokens} greedy tokens each; {count:,} params, weight RMS "
            f"{weight_rms:.4g}, inner gradient norm {grad_norm:.4g}; {time.time() - t_start:.0f} s, load "
            f"{load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}")
  lines = [header, "", "| optimizer | lr | ‖Δθ‖₂ | RMS(Δθ)/RMS(θ) | max ‖Δθ‖ (bf16 ulps) | bf16 weights changed "
           "| distinct rewards (NLL) | NLL drop (mean) | answers changed | final answers changed | distinct rewards (acc) | accuracy gains |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    s = r.get("nll") or r.get("accuracy")
    nll, acc = r.get("nll", {}), r.get("accuracy", {})
    lines.append(f"| {r['optimizer']} | {r['lr']:g} | {s['param_change_l2']:.3g} | {s['param_change_rms_rel']:.3g} | "
                 f"{s['param_change_max_ulp']:.3g} | {s['param_bf16_changed']:.3g} | {nll.get('distinct_rewards', '—')} | "
                 f"{nll.get('improvement_mean', float('nan')):.3g} | {acc.get('answers_changed', float('nan')):.3g} | "
                 f"{acc.get('final_answers_changed', float('nan')):.3g} | {acc.get('distinct_rewards', '—')} | "
                 f"{acc.get('group_improvements', '—')} |")
  table = "\n".join(lines) + "\n"
  (out / "table.md").write_text(table)
  (out / "results.json").write_text(json.dumps({"header": header, "params": count, "weight_rms": weight_rms,
                                                "grad_norm": grad_norm, "runs": rows}, indent=1))
  print(table)
  return 0


if __name__ == "__main__":
  sys.exit(main())
