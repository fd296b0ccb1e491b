"""The premise at the trainer's step: does the cosine rank candidates by what the trainer's real update
does to the reference loss? (issue 50 item 5; docs/experiments.md, "The premise at the trainer's step")

  python experiments/premise_real_update.py --seed=0 --out=runs/premise_real/seed0 --max-minutes=12
  python experiments/premise_real_update.py --seed=1 --out=runs/premise_real/seed1 --max-minutes=12
  python experiments/premise_real_update.py --analyse runs/premise_real/seed0 runs/premise_real/seed1

A real configs/coding.py:demo run (selfplay/session.Session), its steps driven stage by stage exactly as
selfplay/step.run_step runs them (plan -> propose -> verify -> score -> rows -> commit -> advantages ->
update), with real updates: the params and the AdamW state move from step to step as in a run. At each
step, before the update:

- the candidates measured are the in-band ones: valid, 0 < solve rate < 1, with a cosine (the ones the
  step's cosine reward pays);
- a candidate's rows are its proposer rows (one per decoded segment of its proposal). Its solver rows
  would come later: the coding setting's solver batch is drawn from the buffers as they were before
  the step's proposals (CodingSetting.plan), so no row of this step is a solver row on a task built
  from a candidate of this step;
- update(R) is step.update_params(engine, θ, opt_state, setting.train_batches(with_advantages(R)), k_update,
  session.update_options) from copies of the step's θ and optimizer state (the train step donates
  them), with the step's own update key: AdamW at the config's learning rate on the RL loss, the whole
  batch, the advantages recomputed by with_advantages for R (TRR++ over (group, role), as the trainer
  would for that batch);
- L_ref(θ) is the mean loss over the setting's packed reference set (Engine.mean_loss, as
  Session.reference_loss), the loss whose gradient is g_ref;
- utility_i = L_ref(update(all rows − candidate i's rows)) − L_ref(update(all rows)): positive when the
  candidate's rows help the step lower the reference loss (leave-one-out);
- the noise floor: update(all rows) run twice; |difference| of the two L_ref.

The session then continues from update(all rows), as the trainer does. Proxies per candidate, at the
step's θ: the step's cosine, ⟨g, g_ref⟩ and −‖g‖ (alignment.candidate_cosines on Candidate.solution),
1 − solve rate, novelty 1 − Jaccard, and the advantage of the candidate's proposer row(s) in the full
batch. Analysis: Spearman rho of the utility against each proxy, pooled over the steps of a seed (and
over both seeds), with a paired percentile bootstrap over candidates (reports/proxy.py).

Writes OUT/steps.json after every candidate and step (the run stops at --steps or once --max-minutes have passed at the
end of a step). --analyse DIR... prints and writes the table (--table) from the saved steps.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "experiments"):
  if str(path) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(path))

import proxy_vs_utility as pvu  # noqa: E402
from compassplay_jax.reports import proxy  # noqa: E402

STEPS = "steps.json"
PROXIES = ("cosine", "inner product", "-‖g‖", "1 - solve rate", "novelty 1 - Jaccard", "proposer advantage")


def _reference_loss(engine, params, held) -> float:
  from compassplay_jax.infra import distributed
  return float(distributed.to_host(engine.mean_loss(params, held["tokens"], held["loss_mask"],
                                                    held["attention_mask"])))


def candidate_spans(slots, segments) -> list[tuple[int, int]]:
  """[start, end) of each candidate's proposer rows in the setting's rows: CodingSetting.rows appends,
  per (type, index) slot in the candidates' order, one proposer row per decoded segment."""
  spans, pos = [], 0
  for t, j in slots:
    n = len(segments[t][j])
    spans.append((pos, pos + n))
    pos += n
  return spans


def run(args) -> dict:
  import jax
  import jax.numpy as jnp
  from compassplay_jax.runtime import config_base
  from compassplay_jax.rewards.proposer_rewards import in_band
  from compassplay_jax.selfplay import alignment
  from compassplay_jax.selfplay import step as step_lib
  from compassplay_jax.selfplay.rollout import reward_config
  from compassplay_jax.selfplay.session import Session
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  if (out / STEPS).exists():
    raise SystemExit(f"error: {out / STEPS} exists; pass another --out (or --analyse it)")
  config = pvu.build_config(args.config, args.set, args.seed)
  record = {"config": args.config, "set": args.set, "seed": args.seed, "learning_rate": float(config.train.learning_rate),
            "steps": []}
  t_start = time.time()
  with Session.create(config, tempfile.mkdtemp(prefix="premise_session_")) as session:
    engine, setting, options = session.engine, session.setting, session.update_options
    reward_cfg, pad_id = reward_config(config.reward), session.tokenizer.pad_token_id
    max_len = config_base.reward_sequence_len(config)
    held = pvu._place(engine, setting.reference, pad_id)
    for step in range(1, args.steps + 1):
      t0 = time.time()
      params, opt_state = session.params, session.opt_state
      session.key, key = jax.random.split(session.key)  # as Session.step
      k_propose, k_verify, k_rows, k_update = jax.random.split(key, 4)  # as step.run_step
      times = step_lib.PhaseTimes(setting.PHASES + ("update",))
      plan = setting.plan(step)
      proposals = setting.propose(engine, params, plan, k_propose, times)
      verified = setting.verify(engine, params, plan, proposals, k_verify, times)
      scores = step_lib.score(engine, params, verified.candidates, verified.references, setting.scoring(), times)
      rows, _ = setting.rows(engine, params, plan, proposals, verified, scores, k_rows, times)
      setting.commit(plan, proposals, verified, scores)
      spans = candidate_spans(verified.record.slots, proposals.segments)
      assert all(r.role == "proposer" for r in rows[:spans[-1][1]]) and all(
          r.role == "solver" for r in rows[spans[-1][1]:]), "rows are not proposer rows then solver rows"
      full = step_lib.with_advantages(rows, options.max_len)
      band = [i for i, c in enumerate(verified.candidates)
              if c.valid and in_band(c.solve_rate, reward_cfg) and scores.cosine[i] is not None]
      before = _reference_loss(engine, params, held)
      engine.release_rollout_memory()  # as run_step before its update
      stats = {"inner_products": [], "sq_norms": [], "cosines": []}
      if band:
        opts = setting.scoring()
        g_ref = alignment.reference_gradient(engine, params, setting.reference, pad_id)
        stats = alignment.candidate_cosines(engine, params, g_ref, [verified.candidates[i].solution[0] for i in band],
                                            [verified.candidates[i].solution[1] for i in band], pad_id,
                                            max_len=max_len, fixed_rows=opts.fixed_rows, buckets=opts.buckets)
        del g_ref

      def after(subset, donate=False):
        p, o = (params, opt_state) if donate else (jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, opt_state))
        batch = step_lib.with_advantages(subset, options.max_len)
        p, o, _ = step_lib.update_params(engine, p, o, setting.train_batches(batch, step), k_update, options,
                                         ref_params=session.ref_params)
        return _reference_loss(engine, p, held), p, o

      # update(all rows) first, from copies: every candidate's utility is saved as it is measured (a
      # process killed mid-step, e.g. for memory on a shared machine, keeps what it measured).
      full_loss = after(rows)[0]
      cands = []
      entry = {"step": step, "rows": len(rows), "proposer_rows": spans[-1][1], "candidates": len(verified.candidates),
               "valid": int(sum(c.valid for c in verified.candidates)), "in_band": len(band),
               "loss_before": before, "loss_full": full_loss, "loss_full_repeat": None, "measured": cands}
      record["steps"].append(entry)
      for k, i in enumerate(band):
        c, (a, b) = verified.candidates[i], spans[i]
        loss, p, o = after(rows[:a] + rows[b:])
        del p, o
        cands.append({"index": i, "group": c.group, "solve_rate": float(c.solve_rate), "jaccard": float(c.jaccard),
                      "formatted": bool(c.formatted), "eligible": bool(scores.eligible[i]),
                      "step_cosine": float(scores.cosine[i]), "reward": float(scores.reward[i]),
                      "cosine": float(stats["cosines"][k]), "inner_product": float(stats["inner_products"][k]),
                      "sq_norm": float(stats["sq_norms"][k]), "rows": b - a,
                      "advantages": [float(r.advantage) for r in full[a:b]],
                      "loss_without": loss, "utility": loss - full_loss})
        entry.update(wall_s=time.time() - t0, load_1min=os.getloadavg()[0])
        pvu._write_json(out / STEPS, record)
        print(f"[premise] seed {args.seed} step {step}: candidate {i} ({b - a} rows) L_ref without it {loss:.7f} "
              f"({time.time() - t0:.0f} s)", flush=True)
      # The same update again, now on the step's own buffers (donated): the noise floor, and the
      # params and optimizer state the session continues from, as the trainer does.
      repeat, new_params, new_opt = after(rows, donate=True)
      session.params, session.opt_state, session.step_count = new_params, new_opt, step
      entry.update(loss_full_repeat=repeat, wall_s=time.time() - t0, load_1min=os.getloadavg()[0])
      pvu._write_json(out / STEPS, record)
      print(f"[premise] seed {args.seed} step {step}: {len(band)} in band of {len(verified.candidates)}, {len(rows)} rows; "
            f"L_ref {before:.6f} -> {full_loss:.6f} (repeat {repeat}); {time.time() - t0:.0f} s (load {pvu._load()})",
            flush=True)
      if time.time() - t_start > 60 * args.max_minutes:
        break
  record["wall_s"] = time.time() - t_start
  pvu._write_json(out / STEPS, record)
  return record


# ---- analysis ---------------------------------------------------------------------------------------

def table_of(measured: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """(utilities, {proxy: values}) of the measured candidates."""
  u = np.asarray([c["utility"] for c in measured], np.float64)
  proxies = {
      "cosine": [c["step_cosine"] for c in measured],
      "inner product": [c["inner_product"] for c in measured],
      "-‖g‖": [-np.sqrt(c["sq_norm"]) for c in measured],
      "1 - solve rate": [1.0 - c["solve_rate"] for c in measured],
      "novelty 1 - Jaccard": [1.0 - c["jaccard"] for c in measured],
      "proposer advantage": [float(np.mean(c["advantages"])) for c in measured]}
  return u, {k: np.asarray(v, np.float64) for k, v in proxies.items()}


def analyse(records: list[dict], resamples: int) -> str:
  pools = [(f"seed {r['seed']}", [c for s in r["steps"] for c in s["measured"]], [r]) for r in records]
  if len(records) > 1:
    pools.append(("pooled", [c for r in records for s in r["steps"] for c in s["measured"]], records))
  lines = ["Spearman rho of the utility against each proxy, [95% percentile bootstrap interval over candidates, "
           f"{resamples} resamples], (two-sided permutation p-value: exact up to n = 8):", "",
           "| run | steps | n | " + " | ".join(f"{p}" for p in PROXIES) + " |",
           "|---|---|---|" + "---|" * len(PROXIES)]
  for name, measured, recs in pools:
    u, proxies = table_of(measured)
    rows = proxy.proxy_rows(u[:, None], [recs[0]["learning_rate"]], proxies, resamples=resamples, seed=0) \
        if len(u) >= 3 else []
    cells = {r["proxy"]: f"{proxy._num(r['rho'], '+.2f')} [{proxy._num(r['low'], '+.2f')}, "
             f"{proxy._num(r['high'], '+.2f')}] (p {proxy._num(proxy.permutation_pvalue(proxies[r['proxy']], u), '.2f')})"
             for r in rows}
    lines.append(f"| {name} | {sum(len(r['steps']) for r in recs)} | {len(u)} | "
                 + " | ".join(cells.get(p, "–") for p in PROXIES) + " |")
  lines += ["", "Per candidate (utility = L_ref(update without its rows) − L_ref(update with all rows)):", "",
            "| run | step | candidate | type | solve rate | cosine | ⟨g, g_ref⟩ | ‖g‖ | Jaccard | proposer advantage | "
            "utility |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in records:
    for s in r["steps"]:
      for c in sorted(s["measured"], key=lambda c: c["step_cosine"]):
        lines.append(f"| seed {r['seed']} | {s['step']} | {c['index']} | {c['group']} | {c['solve_rate']:.4g} | "
                     f"{c['step_cosine']:+.4f} | {c['inner_product']:+.2f} | {np.sqrt(c['sq_norm']):.1f} | "
                     f"{c['jaccard']:.2f} | {np.mean(c['advantages']):+.3f} | {c['utility']:+.2e} |")
  lines += ["", "| run | step | rows | valid / proposals | in band | L_ref before | after the update | "
            "\\|repeat − after\\| | utilities (min / median / max) | utility > 0 | wall s | load |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in records:
    for s in r["steps"]:
      u = np.asarray([c["utility"] for c in s["measured"]])
      rep = "–" if s["loss_full_repeat"] is None else f"{abs(s['loss_full_repeat'] - s['loss_full']):.1e}"
      spread = (f"{u.min():+.1e} / {np.median(u):+.1e} / {u.max():+.1e}" if u.size else "–")
      lines.append(f"| seed {r['seed']} | {s['step']} | {s['rows']} | {s['valid']} / {s['candidates']} | "
                   f"{s['in_band']} | {s['loss_before']:.6f} | {s['loss_full']:.6f} | {rep} | {spread} | "
                   f"{int((u > 0).sum())} of {u.size} | {s['wall_s']:.0f} | {s['load_1min']:.1f} |")
  measured = [c for r in records for s in r["steps"] for c in s["measured"]]
  if measured:
    u, proxies = table_of(measured)
    lines += ["", f"- all {len(u)} measured: |utility| median {np.median(np.abs(u)):.2e}; Spearman(cosine, "
              f"proposer advantage) = {proxy.spearman(proxies['cosine'], proxies['proposer advantage']):+.2f}; "
              f"Spearman(cosine, inner product) = {proxy.spearman(proxies['cosine'], proxies['inner product']):+.2f}; "
              f"max |step cosine − recomputed| = "
              f"{max(abs(c['step_cosine'] - c['cosine']) for c in measured):.1e}; proposer rows per candidate: "
              f"{sorted({c['rows'] for c in measured})}"]
  return "\n".join(lines) + "\n"


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/coding.py:demo", help="a coding config (path[:variant])")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
  parser.add_argument("--seed", type=int, default=0, help="config.seed")
  parser.add_argument("--steps", type=int, default=4, help="at most this many steps")
  parser.add_argument("--max-minutes", type=float, default=12.0, help="no new step after this much wall time")
  parser.add_argument("--out", default="runs/premise_real", help="output directory (steps.json)")
  parser.add_argument("--analyse", nargs="+", metavar="DIR", help="only analyse these output directories")
  parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
  parser.add_argument("--table", default=None, help="also write the analysis to this file")
  return parser.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.analyse:
    records = [json.loads((pathlib.Path(d) / STEPS).read_text()) for d in args.analyse]
  else:
    records = [run(args)]
  text = analyse(records, args.resamples)
  print(text)
  if args.table:
    pathlib.Path(args.table).write_text(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
