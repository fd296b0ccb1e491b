"""Coding self-play (AZR-style: deduction / abduction / induction over Python programs).

  python -m compassplay_jax.main --config=configs/coding.py           # the paper: Qwen2.5-Coder-7B
  python -m compassplay_jax.main --config=configs/coding.py:demo      # SmolLM2-135M on a laptop CPU
  python -m compassplay_jax.main --config=configs/coding.py:tiny      # random tiny model (tests)
  ... --config.reward.name=difficulty --config.steps=100               # any field from the command line

Values marked AZR come from Absolute Zero Reasoner's code and scripts (../shared/notes/azr-coding-selfplay.md
§5.4, cited by section); values marked paper from CompassPlay's design card.
"""
from compassplay_jax import config_base


def get_config(arg: str = ""):
  variant = arg or "paper"
  config = config_base.base_config("coding", variant)

  # ---- the paper's setting ------------------------------------------------------------------
  config.model.path = ""  # A Hugging Face directory of Qwen2.5-Coder-7B (weights are never downloaded).
  config.model.dtype = "bfloat16"  # AZR: bf16 (§5.3)
  config.model.param_dtype = "float32"  # fp32 master weights
  config.model.remat = True  # AZR: gradient checkpointing (§5.3)
  config.steps = 500  # AZR paper trains <= 500 steps (§5.4, §12)

  c = config.coding
  c.task_types = "abduction,deduction,induction"  # AZR's three task types (§1)
  c.proposals_per_type = 64  # AZR: data.train_batch_size = 64 per (task, role) (§5.4)
  c.solver_tasks_per_type = 64  # AZR (§5.4)
  c.num_references = 6  # AZR: K = io_n = 6 (§5.4)
  c.induction_inputs = 10  # AZR: num_inputs = 10, 5 shown / 5 hidden (§5.4)
  c.solve_samples = 8  # AZR: azr.reward.n_samples = 8 (§5.4)
  c.buffer_cap = 16384  # AZR: max_programs = 16384, keeps the oldest (§5.4)
  c.seed_dir = "../shared/data/azr_seed"  # AZR's released seed buffers; "" = identity-program bootstrap
  c.seed_limit = 256  # AZR: 256 seed triplets for 7B coder (§5.4)
  c.prompt_style = "plain"  # AZR: the R1 template as plain text, ending "Assistant: <think>" (§1.1)

  s = config.sampling
  s.temperature = 1.0  # AZR: T = 1.0, top_p = 1, top_k = -1 (§5.4)
  s.top_p = 1.0
  s.top_k = 0
  s.max_new_tokens = 8096  # AZR: max response length 8096 (§5.4)
  s.max_prompt_tokens = 6144  # AZR (§5.4)

  r = config.reward
  r.name = "compassplay_cos"  # paper: gradient alignment with the external reference
  r.reference_path = "../shared/data/math/train.jsonl"  # paper: 32 MATH-train gold solutions
  r.reference_size = 32  # paper

  t = config.train
  t.learning_rate = 1e-6  # AZR: AdamW lr 1e-6 constant (§5.3)
  t.weight_decay = 0.01  # AZR / veRL default (§5.3)
  t.grad_clip = 1.0  # AZR (§5.3)
  t.entropy_coef = 0.001  # AZR paper branch (§5.3)
  t.micro_batch_size = 16  # AZR: ppo_micro_batch_size_per_gpu = 16 (§5.3)

  config.checkpoint.every_steps = 10  # AZR: save_freq = 10 (§5.4)
  config.eval.every_steps = 10  # AZR: test_freq = 10 (§5.4)
  config.eval.benchmarks = "cruxeval_i,cruxeval_o,livecodebench,math500,amc23,gsm8k,minerva_math,olympiadbench"

  # ---- variants ------------------------------------------------------------------------------
  if variant == "demo":
    _demo(config)
  elif variant == "tiny":
    _tiny(config)
  elif variant != "paper":
    raise ValueError(f"configs/coding.py: unknown variant {variant!r} (known: paper, demo, tiny)")
  return config


def _demo(config):
  """SmolLM2-135M on 2 CPU cores: a few real self-play steps in well under 15 minutes."""
  config.model.path = "smollm2-135m"
  config.model.dtype = "float32"
  config.model.remat = False
  config.steps = 3
  c = config.coding
  c.task_types = "deduction,abduction"
  c.proposals_per_type = 3
  c.solver_tasks_per_type = 3
  c.num_references = 2
  c.induction_inputs = 4
  c.solve_samples = 4
  c.seed_dir = ""  # identity-program bootstrap, as AZR does without seed files
  c.prompt_style = "chat"
  # A 135M model rarely writes AZR's whole format; scaffolds let it fill in the program, the input
  # and the answer (measured: without them no demo proposal was valid).
  c.proposer_prefix = "<think>\nA short function with one argument.\n</think>\n<answer>\n```python\ndef f("
  c.input_scaffold = "\n```input\n"
  c.solver_prefix = "<think>\nLet me trace the code.\n</think>\n<answer>\n```{block}\n"
  s = config.sampling
  s.max_new_tokens = 160
  s.max_prompt_tokens = 1024
  config.reward.reference_path = "builtin:math_mini"  # the small committed MATH-style set
  config.reward.reference_size = 8
  config.train.learning_rate = 1e-5
  # Rows per forward/backward. Measured: one fwd+bwd of SmolLM2 on 4 rows of 768 tokens compiles to
  # 14 GB of temporaries on CPU (mostly per-layer (rows, heads, T, T) attention), remat or not; one
  # row at a time keeps a 2-core, 16-24 GB machine well inside its memory.
  config.train.micro_batch_size = 1
  config.reward.micro_batch_size = 1
  config.checkpoint.every_steps = 1
  config.eval.every_steps = 0  # evaluation off in the demo (run compassplay_jax.evaluate separately)
  config.sandbox.num_workers = 2


def _tiny(config):
  """A random tiny model with the embedded tokenizer: end-to-end tests in seconds."""
  _demo(config)
  config.model.path = "tiny"
  config.steps = 2
  c = config.coding
  c.proposals_per_type = 2
  c.solver_tasks_per_type = 2
  c.solve_samples = 2
  config.sampling.max_new_tokens = 24
  config.sampling.max_prompt_tokens = 1024
  config.reward.reference_size = 2
  config.train.learning_rate = 1e-3
