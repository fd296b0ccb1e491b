"""CheckpointManager: round trip, keep-last-K, save cadence, bad input, failed writes (and Session.close then)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from compassplay_jax.infra.checkpoint import CheckpointError, CheckpointManager


def _state(seed=0):
  k1, k2 = jax.random.split(jax.random.key(seed))
  params = {"dense": {"kernel": jax.random.normal(k1, (3, 4)), "bias": jnp.zeros((4,), jnp.bfloat16)},
            "embed": jax.random.normal(k2, (5, 3))}
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
  opt_state = optimizer.init(params)
  updates, opt_state = optimizer.update(jax.tree.map(jnp.ones_like, params), opt_state, params)
  return optax.apply_updates(params, updates), opt_state


def _assert_bitwise(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def test_round_trip_is_exact(tmp_path):
  params, opt_state = _state()
  key = jax.random.split(jax.random.key(7))[1]
  extra = {"buffers": {"code_i": [{"snippet": "def f(x):\n  return x", "io": [1, 2.5]}]},
           "coverage": [0.0, 0.125], "metrics": [{"step": 1, "loss": 0.1 + 0.2}]}
  with CheckpointManager(tmp_path / "ckpt") as manager:
    assert manager.save(5, params, opt_state, key, extra)
    manager.wait_until_finished()
    assert manager.latest_step() == 5
    step, p, o, k, e = manager.restore(params=params, opt_state=jax.eval_shape(lambda: opt_state))
  assert step == 5 and e == extra
  _assert_bitwise(p, params)
  _assert_bitwise(o, opt_state)
  assert jax.random.key_impl(k) == jax.random.key_impl(key)
  np.testing.assert_array_equal(jax.random.key_data(k), jax.random.key_data(key))
  # A raw uint32 key round-trips as one too.
  with CheckpointManager(tmp_path / "raw") as manager:
    manager.save(1, params, opt_state, jax.random.PRNGKey(3), {})
    raw = manager.restore(params=params, opt_state=opt_state)[3]
  assert raw.dtype == jnp.uint32
  np.testing.assert_array_equal(raw, jax.random.PRNGKey(3))


def test_keeps_last_k_and_saves_every_n(tmp_path):
  params, opt_state = _state()
  key = jax.random.key(0)
  with CheckpointManager(tmp_path, keep=2, save_every=3) as manager:
    saved = [s for s in range(1, 11) if manager.save(s, params, opt_state, key, {"s": s}, force=s == 10)]
    manager.wait_until_finished()
    assert saved == [3, 6, 9, 10]
    assert manager.all_steps() == [9, 10]
    assert manager.restore(9, params=params, opt_state=opt_state)[4] == {"s": 9}
    with pytest.raises(CheckpointError, match=r"no checkpoint for step 3 in .* \(have \[9, 10\]\)"):
      manager.restore(3, params=params, opt_state=opt_state)


def test_missing_directory_is_a_one_line_error(tmp_path):
  missing = tmp_path / "nope"
  with pytest.raises(CheckpointError) as err:
    CheckpointManager(missing, create=False)
  assert str(err.value) == f"checkpoint directory {missing} does not exist"
  assert not missing.exists()
  with CheckpointManager(tmp_path / "empty") as manager, pytest.raises(CheckpointError, match="no checkpoint in"):
    manager.restore()


def test_async_save_keeps_the_extra_json_as_it_was_at_save_time(tmp_path):
  # The run loop mutates its buffers and metrics list right after `save` returns; an async write
  # must still hold the state of the step it was asked to save (else a resume repeats entries).
  params, opt_state = _state()
  key = jax.random.key(3)
  extra = {"metrics": [{"step": 1}], "buffers": {"code_o": [{"snippet": "a"}]}}
  want = {"metrics": [{"step": 1}], "buffers": {"code_o": [{"snippet": "a"}]}}
  with CheckpointManager(tmp_path / "ckpt", async_save=True) as manager:
    assert manager.save(1, params, opt_state, key, extra)
    for i in range(2, 200):  # what the next steps do while the write is in flight
      extra["metrics"].append({"step": i})
      extra["buffers"]["code_o"].append({"snippet": str(i)})
    manager.wait_until_finished()
    _, _, _, _, got = manager.restore(params=params, opt_state=opt_state)
  assert got == want


@pytest.mark.parametrize("async_save", [True, False])
def test_a_write_that_fails_is_one_line_naming_the_step_and_the_last_good_one_stays(tmp_path, async_save):
  """A real write failure (this process's file-size limit: write() fails with EFBIG, as on a full disk)
  while step 2 is written: one CheckpointError naming step 2 and the directory, raised by save or, for a
  background write, by the next wait; step 1 stays restorable and a new manager writes step 2 again."""
  import resource
  params = {"w": jnp.arange(512 * 1024, dtype=jnp.float32)}  # 2 MiB: over the 1 MiB limit below
  optimizer = optax.sgd(0.1)
  opt_state = optimizer.init(params)
  key = jax.random.key(0)
  directory = tmp_path / "ckpt"
  manager = CheckpointManager(directory, async_save=async_save)
  manager.save(1, params, opt_state, key, {"s": 1})
  manager.wait_until_finished()
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
  try:
    with pytest.raises(CheckpointError) as err:
      manager.save(2, jax.tree.map(lambda x: x + 1, params), opt_state, key, {"s": 2})
      manager.wait_until_finished()
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
  message = str(err.value)
  assert "\n" not in message
  assert message.startswith(f"checkpoint of step 2 was not written to {directory}: "), message
  assert "File too large" in message and message.endswith("(the last complete checkpoint: 1)"), message
  with CheckpointManager(directory) as again:  # what a resumed run does
    assert again.all_steps() == [1]
    step, restored, _, _, extra = again.restore(params=params, opt_state=opt_state)
    assert step == 1 and extra == {"s": 1}
    _assert_bitwise(restored, params)
    again.save(2, params, opt_state, key, {"s": 2})
    again.wait_until_finished()
    assert again.all_steps() == [1, 2]


def test_session_close_closes_the_writer_and_the_pool_when_the_last_write_failed():
  """Session.close after a failed checkpoint write: the CheckpointError propagates (main prints it) and
  the metrics writer, the setting's pool (sandbox or Lean processes) and the engine's compile-ahead thread
  are still closed."""
  import types

  from compassplay_jax.selfplay.session import Session
  closed = []

  def failed_wait():
    raise CheckpointError("checkpoint of step 1 was not written to /x: OSError: [Errno 28] No space left on device")
  stand_in = types.SimpleNamespace(
      manager=types.SimpleNamespace(wait_until_finished=failed_wait, close=lambda: closed.append("manager")),
      writer=types.SimpleNamespace(close=lambda: closed.append("writer")),
      setting=types.SimpleNamespace(close=lambda: closed.append("setting")),
      engine=types.SimpleNamespace(ahead=types.SimpleNamespace(close=lambda: closed.append("compile-ahead"))))
  with pytest.raises(CheckpointError, match="checkpoint of step 1 was not written"):
    Session.close(stand_in)
  assert closed == ["manager", "writer", "setting", "compile-ahead"]


def test_an_unfinished_save_is_gone_when_the_manager_is_opened(tmp_path):
  # A crashed save leaves <step>.orbax-checkpoint-tmp. Orbax deletes it on a background thread that
  # its close() does not wait for, so a second manager opened next deleted the same files at the same
  # time and failed on one the other had removed. The constructor now waits: with a large
  # leftover, the old constructor returned long before the delete finished.
  params = {"w": jnp.arange(4.0)}
  with CheckpointManager(tmp_path) as manager:
    manager.save(1, params, params, jax.random.key(0), {})
  leftover = tmp_path / "2.orbax-checkpoint-tmp" / "params.orbax-checkpoint-tmp"
  for shard in range(40):
    (leftover / f"d{shard}").mkdir(parents=True)
    for i in range(100):
      (leftover / f"d{shard}" / f"{i}").write_bytes(b"x")
  for _ in range(2):  # the inspection, then the resumed run
    with CheckpointManager(tmp_path, create=False) as manager:
      assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]
      assert manager.latest_step() == 1


def test_a_read_only_manager_leaves_a_save_in_progress_alone(tmp_path):
  # Evaluation restores checkpoints while the run may be writing the next one: a reader that removed
  # unfinished saves would delete the writer's save in progress.
  params = {"w": jnp.arange(4.0)}
  with CheckpointManager(tmp_path) as manager:
    manager.save(1, params, params, jax.random.key(0), {})
  in_progress = tmp_path / "2.orbax-checkpoint-tmp" / "params.orbax-checkpoint-tmp"
  in_progress.mkdir(parents=True)
  with CheckpointManager(tmp_path, read_only=True) as reader:
    step, restored, _, _, _ = reader.restore(params=params, opt_state=params)
    assert step == 1 and np.array_equal(restored["w"], params["w"])
    with pytest.raises(CheckpointError, match="read-only: step 3 not saved"):
      reader.save(3, params, params, jax.random.key(0), {})
  assert in_progress.is_dir()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2.orbax-checkpoint-tmp"]
