"""Fields shared by configs/coding.py and configs/lean.py, with their defaults.

Config files are code (big_vision style): `get_config(arg)` builds on `base_config` and sets what
its setting and variant need. Every field can be overridden from the command line
(`--config.train.learning_rate=3e-6`); an unknown field is an error.
"""
import ml_collections

from compassplay_jax.evals.harness import default_eval_config


def base_config(setting: str, variant: str) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.setting = setting  # "coding" | "lean"
  config.variant = variant
  config.seed = 0
  config.steps = 10
  config.workdir = ""  # --workdir wins; default: runs/<setting>_<variant>

  config.model = ml_collections.ConfigDict()
  config.model.path = "smollm2-135m"  # HF directory, .gguf file, "smollm2-135m", or "tiny" (random)
  config.model.dtype = "float32"  # compute dtype
  config.model.param_dtype = "float32"  # master weights
  config.model.remat = False
  # The random model of path="tiny" (uses the embedded tokenizer's vocabulary).
  config.model.tiny_hidden_size = 64
  config.model.tiny_layers = 2
  config.model.tiny_heads = 4
  config.model.tiny_kv_heads = 2

  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1  # -1 = all devices not used by the other axes
  config.mesh.fsdp = 1
  config.mesh.tensor = 1

  config.sampling = ml_collections.ConfigDict()
  config.sampling.temperature = 1.0
  config.sampling.top_p = 1.0
  config.sampling.top_k = 0  # 0 = off
  config.sampling.max_new_tokens = 512
  config.sampling.max_prompt_tokens = 2048
  config.sampling.micro_batch_size = 32  # rows generated at once (memory budget)

  config.reward = ml_collections.ConfigDict()
  config.reward.name = "compassplay_cos"  # compassplay_cos | compassplay_cos_novelty | difficulty | novelty_only
  config.reward.method = "fused"  # fused | direct (chunked vmap(grad))
  config.reward.chunk_size = 8  # direct method: candidates per chunk
  config.reward.micro_batch_size = 8  # reference-gradient and fused-pass micro-batch
  config.reward.reference_path = ""
  config.reward.reference_size = 32
  config.reward.bad_format = -1.0  # AZR code: tags malformed (notes §4.1)
  config.reward.invalid = -1.0  # AZR code: invalid or badly formatted proposal (notes §4.1)
  config.reward.out_of_band = -0.5  # AZR code: solve rate 0 or 1 (notes §4.1); the paper's equation uses 0
  config.reward.max_completion_tokens = 1024  # candidate solution tokens used for g(x)

  config.train = ml_collections.ConfigDict()
  config.train.learning_rate = 1e-6
  config.train.warmup_steps = 0
  config.train.schedule = "constant"  # constant | cosine
  config.train.weight_decay = 0.01
  config.train.b1 = 0.9
  config.train.b2 = 0.999
  config.train.grad_clip = 1.0
  config.train.clip_eps_low = 0.2
  config.train.clip_eps_high = 0.2
  config.train.entropy_coef = 0.0
  config.train.kl_coef = 0.0
  config.train.micro_batch_size = 8

  config.sandbox = ml_collections.ConfigDict()
  config.sandbox.num_workers = 0  # 0 = number of CPU cores
  config.sandbox.timeout_s = 10.0  # AZR's executor timeout (notes §3)

  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.every_steps = 10
  config.checkpoint.keep = 3

  config.eval = default_eval_config()
  config.eval.every_steps = 0  # 0 = off

  config.coding = ml_collections.ConfigDict()
  config.coding.task_types = "abduction,deduction,induction"
  config.coding.proposals_per_type = 8
  config.coding.solver_tasks_per_type = 8
  config.coding.num_references = 6
  config.coding.induction_inputs = 10
  config.coding.solve_samples = 8
  config.coding.buffer_cap = 16384
  config.coding.seed_dir = ""
  config.coding.seed_limit = 256
  config.coding.prompt_style = "chat"  # "plain": AZR's R1 text ending in "Assistant: <think>"; "chat": chat template
  # Response scaffolds for small models ("" = off, the AZR format). The proposer's turn starts with
  # proposer_prefix; with input_scaffold the program and its input are decoded as two segments.
  config.coding.proposer_prefix = ""
  config.coding.input_scaffold = ""
  config.coding.solver_prefix = ""  # {block}: output | input | python, by task type

  config.lean = ml_collections.ConfigDict()
  config.lean.command = "lake env repl"
  config.lean.cwd = ""  # a Mathlib project directory
  config.lean.targets_path = "../shared/data/minif2f/minif2f.jsonl"
  config.lean.targets_limit = 0  # 0 = all targets
  config.lean.targets_per_iteration = 0  # 0 = every unsolved target (SGS: the full batch)
  config.lean.proofs_per_problem = 8
  config.lean.num_workers = 2
  config.lean.timeout_s = 60.0
  config.lean.memory_limit_mb = 8192
  config.lean.max_checks_per_process = 200
  config.lean.prefill_proof = False  # start the prover's turn with the statement's code block
  config.lean.solver_band_max = 0.5  # REINFORCE-1/2: train on problems with 0 < s <= 0.5
  return config
