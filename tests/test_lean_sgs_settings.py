"""SGS's settings in the Lean paper config (issue 27 item 3): the values, the docs table that cites
their source lines, the fresh optimizer per step with its warmup, the whole-proof reward length and
SGS's strict proof extraction."""
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.runtime import config_base
from compassplay_jax.infra import sharding as sh
from compassplay_jax.domains.lean.extraction import extract_proof_body
from compassplay_jax.runtime.engine import Engine, EngineSettings
from compassplay_jax.models.config import ConfigError, ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rl import optim
from compassplay_jax.rl import train_step as train_lib
from compassplay_jax.selfplay import step
from compassplay_jax.selfplay.rollout import Row

REPO = pathlib.Path(__file__).resolve().parents[1]
MODEL = ModelConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
PAD = 0


def _paper():
  sys.path.insert(0, str(REPO / "configs"))
  try:
    import lean  # configs/lean.py
  finally:
    sys.path.pop(0)
  return lean.get_config()


def _docs_rows():
  """(setting, `key = value` cells) of docs/lean.md's SGS settings table."""
  text = (REPO / "docs" / "lean.md").read_text()
  lines = text[text.index("### SGS's settings and their sources"):].splitlines()
  first = next(i for i, l in enumerate(lines) if l.startswith("|"))
  table = lines[first:first + next(i for i, l in enumerate(lines[first:]) if not l.startswith("|"))]
  rows = []
  for line in table[2:]:
    cells = [c.strip() for c in line.strip("|").split("|")]
    rows.append((cells[0], re.findall(r"`([a-z_]+\.[a-z_0-9]+) = ([^`]+)`", cells[2]), cells[3]))
  return rows


def test_paper_config_takes_sgs_values():
  config = _paper()
  assert config.lean.timeout_s == 500.0  # SGS's run: PipelineConfig.verifier_timeout
  assert config.train.fresh_optimizer and config.train.warmup_steps == 0 and config.train.schedule == "constant"
  assert config.lean.conjecture_length_penalty and config.lean.overlong_penalty
  assert config.lean.strict_extraction
  # g(x̃) and g_ref over the whole proof: prompt + every token the prover may write.
  assert config_base.reward_sequence_len(config) == config.sampling.max_prompt_tokens + 8192
  config_base.check_config(config)


def test_docs_table_states_the_paper_config_and_cites_a_source_line():
  config = _paper()
  rows = _docs_rows()
  assert len(rows) >= 15
  checked = set()
  for setting, pairs, source in rows:
    assert pairs, f"docs/lean.md SGS table: row {setting!r} names no config value"
    assert re.search(r"(:\d+|App\. |§)", source), f"docs/lean.md SGS table: row {setting!r} cites no line"
    for dotted, literal in pairs:
      block, field = dotted.split(".")
      want = eval(literal, {})  # a Python literal written in the docs
      have = config[block][field]
      assert have == want, f"docs/lean.md says {dotted} = {literal}, configs/lean.py has {have!r}"
      checked.add(dotted)
  assert {"lean.timeout_s", "train.fresh_optimizer", "train.warmup_steps", "lean.conjecture_length_penalty",
          "lean.strict_extraction", "reward.max_completion_tokens"} <= checked


def test_fresh_optimizer_only_with_a_constant_schedule():
  config = _paper()
  config.train.schedule = "cosine"
  with pytest.raises(ConfigError, match="config.train.fresh_optimizer restarts the schedule every step"):
    config_base.check_config(config)


def _rows(seed=0):
  rng = np.random.default_rng(seed)
  return [Row(rng.integers(1, MODEL.vocab_size, p), rng.integers(1, MODEL.vocab_size, c),
              -np.log(MODEL.vocab_size) + rng.uniform(-0.2, 0.2, c).astype(np.float32), 0.0, "conjecture",
              "proposer", advantage=float(rng.normal()))
          for p, c in ((12, 9), (10, 14), (9, 5), (14, 7), (11, 12), (13, 6))]


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def test_fresh_optimizer_restarts_moments_count_and_warmup_every_step():
  """update_params with fresh_optimizer = update_params from optimizer.init at the step's params
  (SGS's new trainer); the warmup counts optimizer steps within the step."""
  graphdef, params = nnx.split(init_decoder(MODEL, seed=0))
  tcfg = train_lib.TrainConfig(learning_rate=1e-3, warmup_steps=2, micro_batch_size=4)
  engine = Engine.build(graphdef, params, sh.make_mesh(None), EngineSettings(train=tcfg))
  rows, key = _rows(), jax.random.key(0)
  chunks = [rows[:3], rows[3:]]  # two optimizer steps per self-play step
  fresh, kept = step.UpdateOptions(PAD, 64, fresh_optimizer=True), step.UpdateOptions(PAD, 64)
  p, o = engine.init_train_state(_copy(params))
  p1, o1, m1 = step.update_params(engine, p, o, chunks, key, fresh)
  assert m1["train/learning_rate"] == pytest.approx((0.0 + 0.5e-3) / 2)  # warmup: 0, then lr/2
  p1_kept, o1_kept, p1_oracle = _copy(p1), _copy(o1), _copy(p1)
  p2, o2, m2 = step.update_params(engine, p1, o1, chunks, key, fresh)
  # Oracle: the same chunks from a state optax builds itself at those params.
  want_p, want_o, _ = step.update_params(engine, p1_oracle, optim.make_adamw(
      optim.make_schedule(1e-3, warmup_steps=2), b1=tcfg.b1, b2=tcfg.b2, eps=tcfg.adam_eps,
      weight_decay=tcfg.weight_decay, grad_clip=tcfg.grad_clip).init(p1_oracle), chunks, key, kept)
  for a, b in zip(jax.tree.leaves((p2, o2)), jax.tree.leaves((want_p, want_o)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(optim.optimizer_step(o2)) == 2 and m2["train/learning_rate"] == m1["train/learning_rate"]
  # Without it the moments, the count and the schedule carry over: a different update.
  p2_kept, o2_kept, m2_kept = step.update_params(engine, p1_kept, o1_kept, chunks, key, kept)
  assert int(optim.optimizer_step(o2_kept)) == 4 and m2_kept["train/learning_rate"] == pytest.approx(1e-3)
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p2_kept), jax.tree.leaves(p2)))


def test_update_options_read_the_flag():
  config = _paper()
  assert step.UpdateOptions.from_config(config, PAD).fresh_optimizer
  config.train.fresh_optimizer = False
  assert not step.UpdateOptions.from_config(config, PAD).fresh_optimizer


HEADER = "import Mathlib\n"
PROOF = f"```lean4\n{HEADER}theorem t (x : ℕ) : x + 0 = x := by\n  simp\n```"


@pytest.mark.parametrize("text, strict_body", [
    (PROOF, "\n  simp"),
    ("  " + PROOF + "\n", "\n  simp"),                                      # SGS strips the text first
    (PROOF + "\nThe proof is complete.", None),                            # must end with the fence
    ("Plan: simp.\n" + PROOF, None),                                       # must start with the block
    (PROOF.replace("theorem t", "lemma aux : True := trivial\ntheorem t"), None),  # two declarations
    (PROOF.replace("  simp", "  have my_lemma : True := trivial\n  simp"), None),   # SGS counts `lemma `
    (PROOF + "\n```lean4\n```", None),                                     # two blocks
])
def test_strict_extraction_is_sgs_rules(text, strict_body):
  """SGS's extract_proof_deepseek_v2_strict (sgs/utils/prompts.py:133-181), rule by rule; the
  non-strict extractor takes the proof body from every case but the last."""
  assert extract_proof_body(text, strict=True) == strict_body
  if "```lean4\n```" not in text:
    assert extract_proof_body(text) is not None
