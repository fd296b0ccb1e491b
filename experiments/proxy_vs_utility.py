"""The paper's first-order premise, measured: does the cosine rank candidates by the reference-loss drop
that one real step on them gives?

  python experiments/proxy_vs_utility.py --out=runs/proxy      # configs/coding.py:demo, 64 candidates
  python experiments/proxy_vs_utility.py --reuse --out=docs/figures/proxy   # re-analyse the committed caches

1. collect: real demo-scale self-play steps (selfplay/step.run_step with update=None, so the params stay
   at θ: real sampling, real sandbox, the step's own cosines) until --candidates valid candidates with a
   verified solution (Candidate.solution: solver prompt + the first correct sample, or the gold answer
   when none is; it stands for g(x̃)) are collected -> OUT/candidates.json;
2. measure: at θ, L_ref = the mean reference loss whose gradient is g_ref (Engine.mean_loss over the
   setting's packed reference set, as Session.reference_loss); per candidate g_ref's inner product,
   cosine and ‖g‖² (alignment.candidate_cosines) and, per step size lr, the reference loss after ONE
   plain SGD step θ' = θ − lr·∇L_x̃(θ) on that candidate's solution row alone (L_x̃: its token-mean
   cross-entropy on the solution tokens, the loss g(x̃) is the gradient of; Engine.soar_trained_heldout_loss
   with one row and one step): drop = L_ref(θ) − L_ref(θ') -> OUT/measurements.json;
3. analyse: Spearman rho of drop vs cosine, vs ⟨g, g_ref⟩ and vs 1 − solve rate with a paired bootstrap
   interval (reports/proxy.py), for all valid candidates and for the in-band ones (0 < s < 1, those a
   cosine reward pays); the first-order prediction lr·⟨g, g_ref⟩ against the drop at every lr
   -> OUT/table.md, OUT/results.json, OUT/proxy_scatter.png.

A stage whose file is in OUT is skipped with --reuse (a partial collection continues from its last step,
with the task buffers it had). Prints progress and, with the table, the load average. See
docs/experiments.md, "Does the cosine track the loss drop of a real step?".
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
  sys.path.insert(0, str(REPO))

from compassplay_jax.reports import proxy  # noqa: E402

CANDIDATES, MEASUREMENTS, RESULTS = "candidates.json", "measurements.json", "results.json"


def _load() -> str:
  return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _range(record: dict) -> str:
  loads = record.get("load_1min") or [math.nan]
  return f"{min(loads):.1f}–{max(loads):.1f}"


def _write_json(path: pathlib.Path, payload, indent: int | None = 1) -> None:
  """Atomic: a crash leaves the previous file, never half of one."""
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(json.dumps(payload, indent=indent, ensure_ascii=False))
  os.replace(tmp, path)


# ---- device work: the loss drop of one SGD step per candidate ---------------------------------------

def _place(engine, packed, pad_id: int):
  host = {k: np.asarray(getattr(packed, k)) for k in ("tokens", "loss_mask", "attention_mask")}
  return engine.put_batch(engine.pad_rows(host, {"tokens": pad_id}))


def loss_drops(engine, params, reference, solutions, lrs, *, pad_id: int, max_len: int, progress=None) -> dict:
  """At `params`: L_ref (the mean reference loss), each candidate's cosine / inner product / ‖g‖² with
  g_ref, and per lr the reference loss after one SGD step θ − lr·∇L_x̃ on that candidate's row alone.

  reference: a PackedBatch (alignment.pack_reference); solutions: [(prompt ids, completion ids)].
  Returns {"before", "ref_sq_norm", "cosines", "inner_products", "sq_norms", "after" (N, L), "drops" (N, L)};
  nothing is written to `params`."""
  import jax
  from compassplay_jax.infra import distributed
  from compassplay_jax.selfplay import alignment
  from compassplay_jax.selfplay.sequences import TRAIN_BUCKETS, pack
  held = _place(engine, reference, pad_id)
  before = float(distributed.to_host(engine.mean_loss(params, held["tokens"], held["loss_mask"],
                                                      held["attention_mask"])))
  g_ref = alignment.reference_gradient(engine, params, reference, pad_id)
  stats = alignment.candidate_cosines(engine, params, g_ref, [s[0] for s in solutions], [s[1] for s in solutions],
                                      pad_id, max_len=max_len)
  ref_sq = sum(float(np.sum(np.square(np.asarray(distributed.to_host(x), np.float64))))
               for x in jax.tree.leaves(g_ref))
  after = np.zeros((len(solutions), len(lrs)), np.float64)
  for i, (prompt, completion) in enumerate(solutions):
    row = _place(engine, pack([prompt], [completion], pad_id, max_len=max_len, buckets=TRAIN_BUCKETS), pad_id)
    for j, lr in enumerate(lrs):
      after[i, j] = float(distributed.to_host(engine.soar_trained_heldout_loss(params, row, held, steps=1,
                                                                               learning_rate=float(lr))))
    if progress:
      progress(i, after[i])
  return {"before": before, "ref_sq_norm": ref_sq, "cosines": np.asarray(stats["cosines"], np.float64),
          "inner_products": np.asarray(stats["inner_products"], np.float64),
          "sq_norms": np.asarray(stats["sq_norms"], np.float64), "after": after, "drops": before - after}


# ---- stage 1: collect candidates from real demo steps --------------------------------------------

def build_config(spec: str, sets: list[str], seed: int):
  from compassplay_jax.cli import sweep
  try:
    config = sweep.load_config(spec)
    for text in sets:
      key, sep, value = text.partition("=")
      if not sep or not key.strip():
        raise sweep.SweepError(f"--set {text!r}: want KEY=VALUE (a dotted config key)")
      sweep.apply_override(config, key.strip(), value)
  except sweep.SweepError as e:
    raise SystemExit(f"error: {e}") from None
  if config.setting != "coding":
    raise SystemExit(f"error: --config {spec}: a coding config is needed (its setting is {config.setting!r})")
  if config.reward.reference != "external":
    raise SystemExit(f"error: --config {spec}: reward.reference={config.reward.reference!r}; this experiment "
                     "measures the external reference set's loss")
  config.reward.name = "compassplay_cos"  # a cosine reward: the setting loads the reference set, cosines computed
  config.seed = seed
  return config


def collect(args, session, cache: pathlib.Path) -> dict:
  """Runs steps at the session's params (update=None) until args.candidates valid candidates with a
  solution are in `cache`; saved after every step."""
  import jax
  from compassplay_jax.rewards.proposer_rewards import in_band
  from compassplay_jax.selfplay import step as step_lib
  from compassplay_jax.selfplay.rollout import reward_config
  state = json.loads(cache.read_text()) if cache.exists() else {"config": args.config, "set": args.set,
                                                               "seed": args.seed, "steps": 0, "candidates": [],
                                                               "wall_s": 0.0}
  if state["steps"]:
    session.setting.load_state_dict(state["buffers"])
    print(f"[proxy] continuing the collection after step {state['steps']} ({len(state['candidates'])} candidates)",
          flush=True)
  reward_cfg = reward_config(session.config.reward)
  tok = session.tokenizer
  while len(state["candidates"]) < args.candidates:
    step = state["steps"] + 1
    if step > args.max_steps:
      raise SystemExit(f"error: {len(state['candidates'])} of {args.candidates} candidates after --max-steps="
                       f"{args.max_steps} steps; raise it")
    t0 = time.time()
    key = jax.random.fold_in(jax.random.key(session.config.seed), step)
    result = step_lib.run_step(session.setting, session.engine, session.params, None, step, key, update=None)
    for i, (c, cos) in enumerate(zip(result.candidates, result.scores.cosine)):
      if not (c.valid and c.solution is not None):
        continue
      prompt, completion = (np.asarray(x, np.int64).tolist() for x in c.solution)
      state["candidates"].append({
          "step": step, "index": i, "group": c.group, "solve_rate": float(c.solve_rate),
          "in_band": bool(in_band(c.solve_rate, reward_cfg)), "jaccard": float(c.jaccard),
          "step_cosine": None if cos is None else float(cos), "prompt_ids": prompt, "completion_ids": completion,
          "completion_text": tok.decode(completion)})
    state["steps"], state["buffers"] = step, session.setting.state_dict()
    state["wall_s"] += time.time() - t0
    state.setdefault("load_1min", []).append(os.getloadavg()[0])  # the machine is shared: times need the load
    _write_json(cache, state, indent=None)  # token ids: one line, not one line per id
    valid = sum(c.valid for c in result.candidates)
    print(f"[proxy] step {step}: {valid} of {len(result.candidates)} valid, "
          f"{len(state['candidates'])}/{args.candidates} collected, {time.time() - t0:.0f} s "
          f"(load {_load()})", flush=True)
  return state


# ---- stage 2: measure ----------------------------------------------------------------------------

PER_CANDIDATE = ("cosines", "inner_products", "sq_norms", "after", "drops")


def measure(session, candidates: list[dict], lrs: list[float], path: pathlib.Path, chunk: int = 8) -> dict:
  """loss_drops for the candidates `path` does not hold yet, `chunk` at a time, saved after each chunk
  (identical solutions, e.g. copies of a seed task, are measured once)."""
  from compassplay_jax.runtime import config_base
  m = json.loads(path.read_text()) if path.exists() else {"lrs": lrs, "wall_s": 0.0, **{k: [] for k in PER_CANDIDATE}}
  pad_id, max_len = session.tokenizer.pad_token_id, config_base.reward_sequence_len(session.config)
  solutions = [(np.asarray(c["prompt_ids"], np.int32), np.asarray(c["completion_ids"], np.int32)) for c in candidates]
  reference = session.setting.reference
  while len(m["drops"]) < len(solutions):
    t0, done = time.time(), len(m["drops"])
    todo = solutions[done:done + chunk]
    seen = {_key(s): i for i, s in enumerate(solutions[:done])}
    fresh = [s for s in dict.fromkeys(map(_key, todo)) if s not in seen]
    def progress(i, after):
      print(f"[proxy]   candidate {done + i + 1}: L_ref after one step {', '.join(f'{a:.6f}' for a in after)} "
            f"({time.time() - t0:.0f} s)", flush=True)

    out = loss_drops(session.engine, session.params, reference, [solutions[_index(solutions, k)] for k in fresh],
                     lrs, pad_id=pad_id, max_len=max_len, progress=progress) if fresh else None
    for s in todo:
      k = _key(s)
      for name in PER_CANDIDATE:
        value = (m[name][seen[k]] if k in seen else np.asarray(out[name][fresh.index(k)]).tolist())
        m[name].append(value)
      seen.setdefault(k, len(m["drops"]) - 1)
    if out is not None:
      if "before" in m and abs(m["before"] - out["before"]) > 1e-6:
        raise SystemExit(f"error: L_ref(θ) {out['before']} differs from the cached {m['before']}: not the same θ")
      m["before"], m["ref_sq_norm"] = out["before"], out["ref_sq_norm"]
    m["wall_s"] += time.time() - t0
    m.setdefault("load_1min", []).append(os.getloadavg()[0])
    _write_json(path, m)
    print(f"[proxy] measured {len(m['drops'])}/{len(solutions)} candidates ({len(fresh)} distinct new), "
          f"{time.time() - t0:.0f} s (load {_load()})", flush=True)
  if "zero_step_drops" not in m:  # the noise floor: a zero step through the same program (θ' = θ)
    m["zero_step_drops"] = loss_drops(session.engine, session.params, reference, solutions[:3], [0.0],
                                      pad_id=pad_id, max_len=max_len)["drops"][:, 0].tolist()
    _write_json(path, m)
  return m


def _key(solution) -> tuple:
  return tuple(int(x) for x in solution[0]), tuple(int(x) for x in solution[1])


def _index(solutions, key) -> int:
  return next(i for i, s in enumerate(solutions) if _key(s) == key)


# ---- stage 3: analyse ------------------------------------------------------------------------------

def analyse(candidates: list[dict], m: dict, resamples: int, seed: int) -> dict:
  lrs = m["lrs"]
  drops = np.asarray(m["drops"], np.float64)
  cos, ip, norm = np.asarray(m["cosines"]), np.asarray(m["inner_products"]), np.sqrt(np.asarray(m["sq_norms"]))
  difficulty = 1.0 - np.asarray([c["solve_rate"] for c in candidates])
  band = np.asarray([c["in_band"] for c in candidates], bool)
  step_cos = np.asarray([np.nan if c["step_cosine"] is None else c["step_cosine"] for c in candidates])
  keys = [(tuple(c["prompt_ids"]), tuple(c["completion_ids"])) for c in candidates]
  distinct = np.asarray([keys.index(k) == i for i, k in enumerate(keys)], bool)  # first of identical solutions
  subsets = {"all valid": np.ones(len(candidates), bool), "distinct": distinct, "distinct, in band": distinct & band}
  rows = {}
  for name, keep in subsets.items():
    proxies = {"cosine": cos[keep], "inner product": ip[keep], "1 - solve rate": difficulty[keep],
               "control: -‖g‖": -norm[keep]}  # the curvature term lr²/2·gᵀHg grows with ‖g‖²
    rows[name] = proxy.proxy_rows(drops[keep], lrs, proxies, resamples=resamples, seed=seed)
  rates = np.asarray([c["solve_rate"] for c in candidates])
  classes = {"s = 0 (gold answer)": rates == 0, "0 < s < 1 (in band)": band, "s = 1": rates == 1}
  groups = [{"class": name, "n": int(keep.sum()), "distinct": int((keep & distinct).sum()),
             "mean_cosine": float(cos[keep].mean()), "median_norm": float(np.median(norm[keep])),
             "mean_drop": [float(x) for x in drops[keep].mean(axis=0)]} for name, keep in classes.items() if keep.any()]
  return {"rows": rows, "groups": groups, "first_order": [proxy.first_order(drops[:, j], ip, lr) for j, lr in enumerate(lrs)],
          "n": len(candidates), "n_in_band": int(band.sum()), "n_distinct": int(distinct.sum()),
          "step_cosine_max_abs_diff": float(np.nanmax(np.abs(step_cos - cos))) if np.isfinite(step_cos).any() else None,
          "spearman_cosine_vs_inner_product": proxy.spearman(cos, ip),
          "spearman_cosine_vs_difficulty": proxy.spearman(cos, difficulty)}


def markdown(analysis: dict, m: dict, header: str) -> str:
  lines = [header, "", "| candidates | step size | proxy | n | Spearman rho (drop, proxy) | 95% bootstrap interval |",
           "|---|---|---|---|---|---|"]
  for name, rows in analysis["rows"].items():
    lines += proxy.markdown_rows(rows, name)
  lines += ["", "First-order prediction lr·⟨g, g_ref⟩ against the measured drop (all valid candidates; step "
            "norm = lr·‖g‖):", "",
            "| step size | median step norm | n | Pearson r | Spearman rho | slope through 0 | median drop / prediction | "
            "max \\|drop − prediction\\| / max \\|prediction\\| | sign of prediction right | drop > 0 |",
            "|---|---|---|---|---|---|---|---|---|---|"]
  norm = float(np.median(np.sqrt(np.asarray(m["sq_norms"]))))
  for f in analysis["first_order"]:
    lines.append(f"| {f['lr']:g} | {f['lr'] * norm:.2g} | {f['n']} | {f['pearson']:+.3f} | {f['spearman']:+.3f} | "
                 f"{f['slope']:.3f} | {f['median_ratio']:.3f} | {f['max_rel_error']:.3f} | {f['sign_agrees']:.0%} | "
                 f"{f['positive']:.0%} |")
  lines += ["", "By solve rate (g(x̃) is taken on the first correct sample, or on the gold answer when none is):", "",
            "| candidates | n | distinct | mean cosine | median ‖g‖ | "
            + " | ".join(f"mean drop at {lr:g}" for lr in m["lrs"]) + " |", "|---|---|---|---|---|" + "---|" * len(m["lrs"])]
  for g in analysis["groups"]:
    lines.append(f"| {g['class']} | {g['n']} | {g['distinct']} | {g['mean_cosine']:+.4f} | {g['median_norm']:.1f} | "
                 + " | ".join(f"{d:+.2e}" for d in g["mean_drop"]) + " |")
  drops, cos, norms = np.asarray(m["drops"]), np.asarray(m["cosines"]), np.sqrt(np.asarray(m["sq_norms"]))
  lines += ["",
            f"- L_ref(θ) = {m['before']:.6f}, ‖g_ref‖ = {math.sqrt(m['ref_sq_norm']):.4g}; cosines in "
            f"[{cos.min():+.3f}, {cos.max():+.3f}] (median |cos| {np.median(np.abs(cos)):.3f}); ‖g‖ in "
            f"[{norms.min():.1f}, {norms.max():.1f}]",
            "- drops: " + "; ".join(f"at {lr:g} median {np.median(drops[:, j]):+.3g}, range "
                                     f"[{drops[:, j].min():+.3g}, {drops[:, j].max():+.3g}]" for j, lr in enumerate(m["lrs"])),
            f"- noise floor (a zero step through the same program): drops {', '.join(f'{x:.1e}' for x in m['zero_step_drops'])}",
            f"- Spearman(cosine, inner product) = {analysis['spearman_cosine_vs_inner_product']:+.2f}; "
            f"Spearman(cosine, 1 − s) = {analysis['spearman_cosine_vs_difficulty']:+.2f}; the step's own cosines "
            f"against these: max |difference| {analysis['step_cosine_max_abs_diff']:.1e}"]
  return "\n".join(lines) + "\n"


def scatter(candidates: list[dict], m: dict, path: pathlib.Path) -> None:
  """Rows: step sizes; columns: drop vs cosine, vs inner product, vs 1 − s, vs the first-order prediction."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  lrs, drops = m["lrs"], np.asarray(m["drops"])
  ip = np.asarray(m["inner_products"])
  band = np.asarray([c["in_band"] for c in candidates], bool)
  xs = {"cosine": np.asarray(m["cosines"]), "<g, g_ref>": ip,
        "1 - solve rate": 1.0 - np.asarray([c["solve_rate"] for c in candidates])}
  fig, axes = plt.subplots(len(lrs), 4, figsize=(13, 2.8 * len(lrs)), squeeze=False)
  for j, lr in enumerate(lrs):
    y = drops[:, j]
    panels = list(xs.items()) + [("first-order prediction lr·<g, g_ref>", lr * ip)]
    for k, (label, x) in enumerate(panels):
      ax = axes[j, k]
      ax.scatter(x[~band], y[~band], s=14, c="tab:gray", label="valid, s ∈ {0, 1}")
      ax.scatter(x[band], y[band], s=14, c="tab:blue", label="in band, 0 < s < 1")
      ax.axhline(0, lw=0.5, c="k")
      if k == 3:
        lo, hi = min(x.min(), y.min()), max(x.max(), y.max())
        ax.plot([lo, hi], [lo, hi], lw=0.8, c="tab:red", label="drop = prediction")
      ax.set_title(f"SGD lr {lr:g}: Spearman {proxy.spearman(x, y):+.2f} (all {len(y)})", fontsize=9)
      ax.ticklabel_format(style="sci", scilimits=(-2, 3), useMathText=True)
      ax.yaxis.get_offset_text().set_fontsize(7)
      ax.xaxis.get_offset_text().set_fontsize(7)
      ax.set_xlabel(label, fontsize=9)
      if k == 0:
        ax.set_ylabel("L_ref drop after one SGD step", fontsize=8)
      ax.tick_params(labelsize=7)
  axes[0, 3].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=72)
  plt.close(fig)


# ---- the command -------------------------------------------------------------------------------

def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/coding.py:demo", help="a coding config (path[:variant])")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="config override, dotted key (repeatable), e.g. coding.proposals_per_type=8")
  parser.add_argument("--seed", type=int, default=0, help="config.seed: the steps' sampling keys and plans")
  parser.add_argument("--candidates", type=int, default=64, help="valid candidates with a solution to collect")
  parser.add_argument("--max-steps", type=int, default=30, help="give up after this many steps")
  parser.add_argument("--lrs", default="1e-5,1e-4,1e-3", help="SGD step sizes, comma-separated")
  parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
  parser.add_argument("--out", default="runs/proxy_vs_utility", help="output and cache directory")
  parser.add_argument("--reuse", action="store_true", help="use the cached stages found in --out")
  args = parser.parse_args(argv)
  try:
    args.lr_list = [float(x) for x in args.lrs.split(",") if x.strip()]
  except ValueError:
    parser.error(f"--lrs {args.lrs!r}: want comma-separated numbers")
  if not args.lr_list or any(not lr > 0 for lr in args.lr_list):
    parser.error(f"--lrs {args.lrs!r}: want positive step sizes")
  if args.candidates < 3:
    parser.error("--candidates: want at least 3")
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  cache, meas_path = out / CANDIDATES, out / MEASUREMENTS
  for path in (cache, meas_path):
    if path.exists() and not args.reuse:
      raise SystemExit(f"error: {path} exists; pass --reuse to use it, or another --out")
  t_start, load_before = time.time(), os.getloadavg()
  state = json.loads(cache.read_text()) if cache.exists() else None
  made_by = {"config": args.config, "set": args.set, "seed": args.seed}
  if state is not None and {k: state[k] for k in made_by} != made_by:
    raise SystemExit(f"error: {cache} was collected with {({k: state[k] for k in made_by})}; pass the same "
                     "--config/--set/--seed or another --out")
  need_collect = state is None or len(state["candidates"]) < args.candidates
  m = json.loads(meas_path.read_text()) if meas_path.exists() else None
  if m is not None and m["lrs"] != args.lr_list:
    raise SystemExit(f"error: {meas_path} was measured for --lrs {','.join(map(str, m['lrs']))}; pass those "
                     f"or another --out")
  need_measure = m is None or len(m["drops"]) < args.candidates or "zero_step_drops" not in m
  if need_collect or need_measure:
    from compassplay_jax.selfplay.session import Session
    config = build_config(args.config, args.set, args.seed)
    with Session.create(config, tempfile.mkdtemp(prefix="proxy_session_")) as session:
      session.opt_state = None  # never updated here: free the AdamW moments (2 x the params)
      print(f"[proxy] L_ref(θ) = {session.reference_loss():.6f} (load {_load()})", flush=True)
      if need_collect:
        state = collect(args, session, cache)
      m = measure(session, state["candidates"][:args.candidates], args.lr_list, meas_path)
  candidates = state["candidates"][:args.candidates]
  m = {**m, **{k: m[k][:args.candidates] for k in PER_CANDIDATE}}
  analysis = analyse(candidates, m, args.resamples, seed=args.seed)
  load_after = os.getloadavg()
  header = (f"`{args.config}`{''.join(f' --set {s}' for s in args.set)}, seed {args.seed}: {len(candidates)} "
            f"valid candidates ({analysis['n_distinct']} distinct solutions, {analysis['n_in_band']} in band) from {state['steps']} steps at the initial "
            f"params; collection {state['wall_s']:.0f} s (1-min load average {_range(state)}), measurement "
            f"{m['wall_s']:.0f} s (load {_range(m)}); this command {time.time() - t_start:.0f} s, load average "
            f"(1/5/15 min) before "
            f"{'/'.join(f'{x:.2f}' for x in load_before)}, after {'/'.join(f'{x:.2f}' for x in load_after)}")
  table = markdown(analysis, m, header)
  (out / "table.md").write_text(table)
  _write_json(out / RESULTS, {"header": header, **analysis})
  scatter(candidates, m, out / "proxy_scatter.png")
  print(table)
  print(f"[proxy] wrote {out / 'table.md'}, {out / RESULTS}, {out / 'proxy_scatter.png'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
