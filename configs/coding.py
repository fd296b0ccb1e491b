"""Coding self-play (AZR-style: deduction / abduction / induction over Python programs).

  python -m compassplay_jax.main --config=configs/coding.py           # the paper: Qwen2.5-Coder-7B
  python -m compassplay_jax.main --config=configs/coding.py:demo      # SmolLM2-135M on a laptop CPU
  python -m compassplay_jax.main --config=configs/coding.py:tiny      # random tiny model (tests)
  ... --config.reward.name=difficulty --config.steps=100               # any field from the command line

Values marked AZR come from Absolute Zero Reasoner's code and scripts (`paper` branch); the section marks
(§5.4 ...) point to docs/paper_settings.md, which gives each value's public source. Values marked paper
come from CompassPlay's design card.
"""
from compassplay_jax.runtime import config_base


def get_config(arg: str = ""):
  variant = arg or "paper"
  config = config_base.base_config("coding", variant)

  # ---- the paper's setting ------------------------------------------------------------------
  config.model.path = ""  # Qwen2.5-Coder-7B: the Hub id "Qwen/Qwen2.5-Coder-7B" or a local checkpoint directory.
  config.model.dtype = "bfloat16"  # AZR: bf16 (§5.3)
  config.model.param_dtype = "float32"  # fp32 master weights
  config.model.remat = True  # AZR: gradient checkpointing (§5.3)
  # Query-blocked attention: at 6144 + 8096 tokens plain attention's fp32 scores alone are ~23 GB per
  # row and layer; blocks of 1024 queries bound them (docs/sharding.md, "Per-function report").
  config.model.attention_query_chunk = 1024
  # The train step's and g_ref's blocks as one lax.scan: remat then keeps one layer's activations
  # whatever the compiler's schedule (docs/sharding.md; XLA:CPU: azr-coding's train step 96 -> 46 GiB).
  config.model.scan_layers = True
  config.steps = 200  # paper: 200 training steps (design card; AZR itself reports <= 500, §12)

  c = config.coding
  c.task_types = "abduction,deduction,induction"  # AZR's three task types (§1)
  c.proposals_per_type = 64  # AZR: data.train_batch_size = 64 per (task, role) (§5.4)
  c.solver_tasks_per_type = 64  # AZR (§5.4)
  c.num_references = 6  # AZR: K = io_n = 6 (§5.4)
  c.induction_inputs = 10  # AZR: num_inputs = 10, 5 shown / 5 hidden (§5.4)
  c.solve_samples = 8  # AZR: azr.reward.n_samples = 8 (§5.4)
  c.buffer_cap = 16384  # AZR: max_programs = 16384, keeps the oldest (§5.4)
  c.seed_dir = "data:azr_seed"  # AZR's released seed buffers (fetch azr_seed); "" = identity-program bootstrap
  c.seed_limit = 256  # AZR: 256 seed triplets for 7B coder (§5.4)
  # AZR: the R1 template as plain text, ending "Assistant: <think>" (§1.1), around AZR's own proposer and
  # solver prompts, verbatim (domains/coding/azr_prompts.py; docs/coding_tasks.md "Prompts").
  c.prompt_style = "plain"

  s = config.sampling
  s.temperature = 1.0  # AZR: T = 1.0, top_p = 1, top_k = -1 (§5.4)
  s.top_p = 1.0
  s.top_k = 0
  s.max_new_tokens = 8096  # AZR: max response length 8096 (§5.4)
  s.max_prompt_tokens = 6144  # AZR (§5.4)

  r = config.reward
  r.name = "compassplay_cos"  # paper: gradient alignment with the external reference
  r.reference_path = "data:math/train.jsonl"  # paper: 32 MATH-train gold solutions (fetch math)
  r.reference_size = 32  # paper

  t = config.train
  t.learning_rate = 1e-6  # AZR: AdamW lr 1e-6 constant (§5.3)
  t.weight_decay = 0.01  # AZR / veRL default (§5.3)
  t.grad_clip = 1.0  # AZR (§5.3)
  t.entropy_coef = 0.001  # AZR paper branch (§5.3)
  # AZR: one AdamW step per RL step on all 384 rows. coder7b.sh L26 passes ppo_mini_batch_size=128, but
  # main_azr_ppo.py L57 overwrites it with train_batch_size x 3 tasks x 2 roles = 384, and ppo_epochs
  # is 1 (azr_ppo_trainer.yaml L37), so the ratio is 1 (§5.3). 3 gives the 3 x 128 split.
  t.ppo_mini_batches = 1
  # AZR's loss as veRL aggregates it: the mean over micro-batches of 16 consecutive rows
  # (coder7b.sh L28 ppo_micro_batch_size_per_gpu=16) of each micro-batch's token mean (AZR's veRL,
  # verl/verl/workers/actor/dp_actor.py L226-228 and L274; core_algos.py L301): each (task, role)
  # group of 64 weighs the same whatever its response lengths (rl/aggregation.py).
  t.loss_aggregation = "verl"
  t.verl_micro_batch_rows = 16
  # Memory (docs/sharding.md, per-function tables): at 14240 tokens the train step does not fit a
  # v5p-8 with FSDP alone (97.4 of 95.7 GiB per chip), so tensor axis 4 and micro-batches of 2 rows
  # (30.1 GiB). Our micro-batches set memory only: the aggregation above is folded into the loss
  # mask's per-token weights, so it does not depend on how we pack or micro-batch.
  if variant == "paper":  # the small variants below keep one device's mesh
    config_base.tensor_parallel_7b(config)
    # Rows packed by length, at most a padded micro-batch's 2 x 14240 tokens per pass: the update's 384
    # rows average ~3,000 tokens, and padding them to the longest costs ~3x the passes (docs/sharding.md).
    config_base.pack_update_rows(config)

  config.checkpoint.every_steps = 10  # AZR: save_freq = 10 (§5.4)
  # paper: its numbers average the 11 greedy evaluations at steps 150-200, the final quarter, every 5
  # steps (design card; docs/experiments.md), and its tables need step 0 (the base model). Before step
  # 150 a sparser curve (every 25) is enough for the figures: 17 evaluations instead of 41 in 200 steps
  # (cost per choice: docs/evaluation.md). AZR's own test_freq is 10 (coder7b.sh L58, §5.4).
  config.eval.every_steps = 25
  config.eval.dense_every_steps = 5
  config.eval.dense_from_step = 150
  config.eval.at_start = True
  # Budgets as AZR sets them: code benchmarks through veRL's validation at the rollout's response length,
  # 8096 (coder7b.sh L22 data.max_response_length); math through its math_eval harness, 16000
  # (evaluation/math_eval/eval_math_nodes.sh L16 max_tokens).
  config.eval.max_new_tokens = 8096
  config.eval.budgets = "math=16000"
  # AZR's checks for its coder model (docs/evaluation.md, "AZR fidelity"): math in its azr_boxed template
  # (evaluation/math_eval/run.sh L32 for AZR-Coder-7B; the template at eval/utils.py L181-185), code
  # answers equal when Python's == says so (python_executor.py L193, templates.py L10-11).
  config.eval.prompt_style = "azr_boxed"
  config.eval.equality = "azr"
  config.eval.benchmarks = ("cruxeval_i,cruxeval_o,livecodebench_execution,"  # AZR validates on LCB-Execution (§6.1)
                           "math500,amc23,gsm8k,minerva_math,olympiadbench")

  # ---- variants ------------------------------------------------------------------------------
  if variant == "demo":
    _demo(config)
  elif variant == "tiny":
    _tiny(config)
  elif variant == "local_demo":
    _local_demo(config)
  elif variant != "paper":
    raise ValueError(f"configs/coding.py: unknown variant {variant!r} (known: paper, demo, tiny, local_demo)")
  return config


def _demo(config):
  """SmolLM2-135M on 2 CPU cores: a few real self-play steps in which the cosine pays proposers.

  A candidate is paid by its cosine only when valid and in band (0 < solve rate < 1), so the demo is
  sized for a 135M model to land there (measured, docs/demo.md): simple seed programs it imitates,
  deduction and abduction, short prompts, response scaffolds, several solve samples at T = 1.
  """
  config.model.path = "smollm2-135m"
  config.model.dtype = "float32"
  config.model.remat = False
  config.model.attention_query_chunk = 0  # short sequences: plain attention
  config.model.scan_layers = False
  config.steps = 3
  c = config.coding
  c.task_types = "deduction,abduction"
  c.proposals_per_type = 4
  c.solver_tasks_per_type = 2
  c.num_references = 2
  c.induction_inputs = 4
  c.solve_samples = 16  # AZR's n is 8; a 135M solver is right rarely, so more samples find 0 < s < 1
  c.seed_dir = "builtin:demo_seed"  # eight one-line functions (compassplay_jax/data/demo_seed)
  c.prompt_style = "compact"  # ~120-token prompts instead of AZR's ~480 (settings/coding/compact_prompts.py)
  # A 135M model rarely writes AZR's whole format; scaffolds let it fill in the program, the input
  # and the answer (measured: without them no demo proposal was valid).
  # One-line programs and inputs: the model writes the return expression, then the input.
  c.proposer_prefix = "<think>\nA short function with one argument.\n</think>\n<answer>\n```python\ndef f(x):\n    return "
  c.input_scaffold = "```\n```input\n"
  c.segment_stop = "\n"
  c.solver_prefix = "<think>\nLet me trace the code.\n</think>\n<answer>\n```{block}\n"
  s = config.sampling
  s.temperature = 1.0
  s.top_k = 10  # a 135M model's long tail at T = 1 is mostly prose; top-k keeps answers to values
  s.max_new_tokens = 32  # each decoded segment is one line (segment_stop): expression, input or answer
  s.max_prompt_tokens = 512
  # The demo keeps the plain token mean: its rows are few and scaffolded (one-line segments), and the
  # timings and example output in README.md and docs/demo.md were measured with it.
  config.train.loss_aggregation = "token_mean"
  config.reward.reference_path = "builtin:math_mini"  # the small committed MATH-style set
  config.reward.reference_size = 4
  config.reward.max_completion_tokens = 256
  config.train.learning_rate = 1e-5
  # Rows packed by length, ~1024 tokens per forward/backward: one fwd+bwd of SmolLM2 on 4 rows of
  # 768 tokens compiles to 14 GB of temporaries on CPU (per-layer attention), so keep passes small.
  config.train.micro_batch_tokens = 1024
  config.train.micro_batch_size = 1
  config.reward.micro_batch_size = 4
  config.checkpoint.every_steps = 1
  config.eval.every_steps = 0  # evaluation off in the demo (run compassplay_jax.cli.evaluate separately)
  config.eval.dense_every_steps = 0
  # compassplay_jax.cli.evaluate with these defaults finishes in about a minute on 2 CPU cores (4 CRUXEval-O
  # items, 64 new tokens); SmolLM2 scores 0 there (no <answer> tags; docs/demo.md "Evaluating the demo").
  config.eval.benchmarks = "cruxeval_o"
  config.eval.limit = 4
  config.eval.max_new_tokens = 64
  config.eval.batch_size = 4
  config.sandbox.num_workers = 2


def _local_demo(config):
  """The demo with Lean's local reference (docs/experiments.md, "CPU reproduction of the local-reference
  shortcut"): g_ref per seed = the gradient of the solver's verified solution of the one seed program
  the proposer is shown. Pick the reward with --config.reward.name (compassplay_cos,
  compassplay_cos_novelty, difficulty) or the sweep's --rewards.
  """
  _demo(config)
  config.reward.reference = "local"  # settings/coding/local_reference.py
  config.coding.num_references = 1  # the proposer is conditioned on exactly one seed (Lean's conjecturer)
  config.steps = 30  # long enough to see copies rise under plain cos; ~1 min per step on 2 CPU cores
  config.checkpoint.every_steps = 5


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
  # A few rows of at most 24 new tokens: pages bring nothing here and their per-bucket decode programs
  # only add compiles to every test run (the paged engine has its own tests, the loop's sampling path
  # on pages included: tests/test_paged_engine.py, test_rollout_release.py, test_sampling_rollouts.py).
  config.sampling.kv_layout = "dense"
  config.reward.reference_size = 2
  config.train.learning_rate = 1e-3
