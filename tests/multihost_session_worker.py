"""One process of a self-play run under jax.distributed (or the single-process reference run), with
the scripted coder (tests/scripted_coder.py), so cosines, rewards and updates run on real candidates.

  python tests/multihost_session_worker.py WORKDIR STEPS [--corrupt]

The environment carries COMPASSPLAY_* (distributed.from_env) and the simulated device count. Runs
Session.step until STEPS (resuming from WORKDIR's checkpoint); after every step that completes it
writes process_<i>.json: the sandbox jobs and sampled requests this process ran so far in this launch
(its share). --corrupt: in the last step (STEPS) only, on process 1, one candidate's solve rate is
moved by one sample after verification (as if one sandbox verdict differed there), so the processes
disagree there; the steps before it run clean (the test resumes step 2 and stops at a corrupted step 3
in one launch). Step 1 packs the update's rows by length (coding:tiny's train.micro_batch_tokens,
step._place_share), later steps train one padded batch (token budget 0, step._local_train_batch), so
both ways of placing a process's rows run across processes. Bad input and disagreement end with one
line, as main does.
"""
import json
import os
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main():
  workdir, steps = pathlib.Path(sys.argv[1]), int(sys.argv[2])
  corrupt = "--corrupt" in sys.argv[3:]
  import dataclasses

  import jax

  from compassplay_jax.infra import distributed, gc_policy
  from compassplay_jax.core.errors import user_error_line
  from compassplay_jax.selfplay.session import Session
  from tests.scripted_coder import SHORT_SEQUENCES, ScriptedCoder
  from tests.test_selfplay import _config

  config = _config("coding:tiny", **{"steps": steps, "sandbox.num_workers": 1,
                                     "compile_cache_dir": os.environ.get("COMPASSPLAY_TEST_COMPILE_CACHE", ""),
                                     **SHORT_SEQUENCES})
  gc_policy.defer_full_collections()  # as the main command does
  counts = {"sandbox_jobs": 0, "sampled_requests": 0}
  try:
    session = Session.create(config, workdir, sampler=ScriptedCoder())
  except Exception as e:  # noqa: BLE001  (the one-line error path of main)
    print(user_error_line(e) or repr(e), file=sys.stderr)
    sys.exit(2)
  pool, setting = session.setting.pool, session.setting
  run_batch = pool.run_batch

  def counting_run_batch(jobs, *args, **kwargs):
    counts["sandbox_jobs"] += len(jobs)
    return run_batch(jobs, *args, **kwargs)
  pool.run_batch = counting_run_batch
  rollout = session.engine.rollout_engine(session.tokenizer, config.sampling)
  generate = rollout.generate

  def counting_generate(requests, *args, **kwargs):
    counts["sampled_requests"] += len(requests)
    return generate(requests, *args, **kwargs)
  rollout.generate = counting_generate
  if corrupt and jax.process_index() == 1:
    verify = setting.verify

    def flipped_verify(*args, **kwargs):
      verified = verify(*args, **kwargs)
      if session.step_count < steps:  # only the last step is corrupted
        return verified
      i = next(i for i, c in enumerate(verified.candidates) if c.valid)
      c = verified.candidates[i]
      verified.candidates[i] = dataclasses.replace(c, solve_rate=c.solve_rate + 1 / config.coding.solve_samples)
      return verified
    setting.verify = flipped_verify
  try:
    while session.step_count < steps:
      if session.step_count >= 1:  # steps after the first: one padded batch (_local_train_batch's path)
        session.update_options = dataclasses.replace(session.update_options, token_budget=0)
      session.step()
      (workdir / f"process_{jax.process_index()}.json").write_text(json.dumps(counts))
  except distributed.DistributedError as e:  # as main: one line, exit 2 (jax's exit barrier syncs hosts)
    print(user_error_line(e), file=sys.stderr, flush=True)
    session.close()
    sys.exit(2)
  session.close()


if __name__ == "__main__":
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
  main()
