"""Fields every setting shares, with their defaults; each setting's own block comes from its spec
(compassplay_jax/settings: config.coding, config.lean, a plug-in's).

Config files are code (big_vision style): `get_config(arg)` builds on `base_config` and sets what
its setting and variant need. Every field can be overridden from the command line
(`--config.train.learning_rate=3e-6`); an unknown field is an error.
"""
import dataclasses

import ml_collections

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.rewards.proposer_rewards import REWARD_FNS, SOAR_UTILITY, RewardConfig
from compassplay_jax.rl.train_step import TrainConfig
from compassplay_jax.sampling.config import SamplingConfig
from compassplay_jax.infra.sharding import MeshConfig

# AZR's in-training validation set (docs/paper_settings.md §6.1); pass "all" or a list for the others.
DEFAULT_BENCHMARKS = "cruxeval_i,cruxeval_o,livecodebench_execution"


def dataclass_fields(cls, names=None) -> dict:
  """{field: default} of a config dataclass (all fields, or `names`): the one source of those defaults."""
  defaults = {f.name: f.default for f in dataclasses.fields(cls)}
  return {n: defaults[n] for n in (names or defaults)}


def dataclass_from(cls, block, **extra):
  """cls built from the fields of `block` (a ConfigDict) that cls has, `extra` taking precedence."""
  names = {f.name for f in dataclasses.fields(cls)}
  return cls(**{**{k: v for k, v in dict(block).items() if k in names}, **extra})


def train_sequence_len(config) -> int:
  """Tokens of a trained row: prompt + sampled completion (config.sampling)."""
  return config.sampling.max_prompt_tokens + config.sampling.max_new_tokens


def reward_sequence_len(config) -> int:
  """Tokens of a reward sequence (g_ref's and a candidate's solution): prompt + reward.max_completion_tokens
  (0: sampling.max_new_tokens, the whole completion)."""
  return config.sampling.max_prompt_tokens + (config.reward.max_completion_tokens or config.sampling.max_new_tokens)


RECOMPUTE_LOGPROBS = ("auto", "on", "off")
COMPILE_AHEAD = ("auto", "on", "off")
# compile_ahead "auto": on from this many CPU cores. With 2 the decode loop keeps both busy and a
# background compilation slows generation as much as it saves (docs/demo.md, "Compiling ahead").
COMPILE_AHEAD_MIN_CORES = 8


def compile_ahead(config) -> bool:
  """config.compile_ahead: "auto" = on when this process may use at least COMPILE_AHEAD_MIN_CORES CPU
  cores (cores the run leaves idle compile while it generates); "on" | "off"."""
  value = config.compile_ahead
  if value == "auto":
    import os
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores >= COMPILE_AHEAD_MIN_CORES
  return value == "on"


def recompute_logprobs(config) -> bool:
  """train.recompute_logprobs: "auto" = on when the compute dtype is not float32 (a bf16 KV-cache
  decode and the training forward differ, so the sampler's log-probs would put the first PPO ratio
  off 1) or when sampling.engine is "vllm" (another implementation's numerics); "on" | "off"."""
  value = config.train.recompute_logprobs
  if value == "auto":  # also on with an engine not ours (vLLM: its kernels, its log-prob definition)
    return config.model.dtype != "float32" or config.sampling.get("engine") == "vllm"
  return value == "on"


def eval_config() -> ml_collections.ConfigDict:
  """The `eval` block that config files embed; docs/evaluation.md describes every field."""
  cfg = ml_collections.ConfigDict()
  cfg.benchmarks = DEFAULT_BENCHMARKS  # Comma string or list; "all" = every registered benchmark.
  cfg.data_dir = ""  # "" = the data directory (config.data_dir / $COMPASSPLAY_DATA; docs/data.md).
  cfg.paths = ""  # Per-benchmark file overrides: "math500=/x/test.jsonl,gsm8k=/y.jsonl".
  cfg.limit = 0  # Items per benchmark; 0 = all.
  cfg.seed = 0  # Seeds the per-benchmark subsample when limit > 0.
  cfg.max_new_tokens = 8096  # AZR's validation response length: every prompt's budget unless `budgets` names it.
  cfg.budgets = ""  # Per-benchmark or per-kind budgets: "math=16000,cruxeval_o=2048" (kinds: math, cruxeval_o, cruxeval_i, lcb).
  cfg.engine = "rollout"  # "rollout": every prompt in one queue of the run's rollout engine | "static": batches of batch_size.
  cfg.batch_size = 32  # Prompts per static-sampler call (engine "static" and plain generate_fn callers).
  cfg.prompt_style = "azr"  # "azr" | "azr_boxed" | "azr_think" | "chat" (see evals/prompts.py).
  # CRUXEval / LCB-Execution equality: "azr" = Python's == as AZR checks (1 == 1.0 == True) | "strict" =
  # type-strict (1 != 1.0 != True); both computed in the sandbox (evals/code_check.py EQUALITIES).
  cfg.equality = "strict"
  cfg.workdir = ""  # Outputs go to <workdir>/eval/step_<N>/; "" = the run's workdir, or nothing written.
  cfg.every_steps = 0  # How often the training loop evaluates; 0 = never (AZR: test_freq=10; configs set theirs).
  cfg.dense_every_steps = 0  # Also every this many steps from dense_from_step on (the stretch a paper averages); 0 = off.
  cfg.dense_from_step = 0
  cfg.at_start = True  # When the run evaluates at all, a fresh run also evaluates the base model (step 0).
  cfg.math_timeout_s = 3.0  # Per item, as AZR's pebble timeout.
  cfg.code_timeout_s = 10.0  # Per CRUXEval job (AZR's executor timeout).
  cfg.lcb_timeout_s = 6.0  # Per LiveCodeBench test.
  cfg.num_workers = 0  # Checker processes; 0 = automatic.
  cfg.progress = True
  return cfg


def _one_of(config, field: str, allowed) -> None:
  """A one-line ConfigError naming config.<field> unless its value is one of `allowed`."""
  from compassplay_jax.models.config import ConfigError
  value = config
  for name in field.split("."):
    value = value[name]
  if value not in allowed:
    raise ConfigError(f"config.{field}: {value!r} is not one of {tuple(allowed)}")


def check_config(config) -> None:
  """Start-up checks of the fields every setting shares (ConfigError names the field); the setting's own
  block is its spec's validate (compassplay_jax/settings)."""
  from compassplay_jax.infra import profiling
  from compassplay_jax.models.config import ConfigError
  from compassplay_jax.sampling.factory import ENGINES
  _one_of(config, "reward.name", sorted(REWARD_FNS))
  _one_of(config, "sampling.engine", ENGINES)
  if config.sampling.engine == "vllm":
    _one_of(config, "sampling.vllm_sleep", ("auto", "on", "off"))
  from compassplay_jax.sampling.continuous import KV_LAYOUTS
  from compassplay_jax.sampling.paged_kernels import PAGED_ATTENTIONS
  _one_of(config, "sampling.kv_layout", KV_LAYOUTS)
  _one_of(config, "sampling.paged_attention", PAGED_ATTENTIONS)
  _one_of(config, "train.recompute_logprobs", RECOMPUTE_LOGPROBS)
  if config.train.kl_coef < 0:
    raise ConfigError(f"config.train.kl_coef={config.train.kl_coef} is negative")
  if config.train.fresh_optimizer and config.train.schedule != "constant":
    raise ConfigError(f"config.train.fresh_optimizer restarts the schedule every step: use schedule='constant' "
                      f"(warmup_steps then counts within each step), not {config.train.schedule!r}")
  profiling.parse_steps(config.profile.steps)  # names the field if a step is not a number
  _one_of(config, "compile_ahead", COMPILE_AHEAD)
  from compassplay_jax.rl.aggregation import LOSS_AGGREGATIONS
  _one_of(config, "train.loss_aggregation", LOSS_AGGREGATIONS)
  if config.train.verl_micro_batch_rows < 1:
    raise ConfigError(f"config.train.verl_micro_batch_rows={config.train.verl_micro_batch_rows}: must be >= 1")
  if config.train.ppo_mini_batches < 1:
    raise ConfigError(f"config.train.ppo_mini_batches={config.train.ppo_mini_batches}: must be >= 1")
  if config.reward.name == SOAR_UTILITY:
    r = config.reward
    for name in ("soar_group_size", "soar_inner_steps"):
      if r[name] < 1:
        raise ConfigError(f"config.reward.{name}={r[name]}: must be >= 1 for reward.name=soar_utility")
    if not r.soar_inner_lr > 0:
      raise ConfigError(f"config.reward.soar_inner_lr={r.soar_inner_lr}: must be > 0 for reward.name=soar_utility")
    if r.soar_inner_optimizer not in ("sgd", "adam"):
      raise ConfigError(f"config.reward.soar_inner_optimizer={r.soar_inner_optimizer!r} is not one of ('sgd', 'adam')")
    if r.soar_heldout_size < 0:
      raise ConfigError(f"config.reward.soar_heldout_size={r.soar_heldout_size} is negative")
    if r.soar_signal not in ("accuracy", "nll"):
      raise ConfigError(f"config.reward.soar_signal={r.soar_signal!r} is not one of ('accuracy', 'nll')")
    if r.soar_inner_batch < 0:
      raise ConfigError(f"config.reward.soar_inner_batch={r.soar_inner_batch} is negative (0 = the whole group)")
    if r.soar_signal == "accuracy" and r.soar_answer_tokens < 1:
      raise ConfigError(f"config.reward.soar_answer_tokens={r.soar_answer_tokens}: must be >= 1 for the accuracy signal")


def base_config(setting: str, variant: str) -> ml_collections.ConfigDict:
  """The fields every setting shares, with their defaults, and the block of `setting` (a registered name)."""
  from compassplay_jax import settings
  config = ml_collections.ConfigDict()
  config.setting = setting  # a registered setting: "coding" | "lean" | a plug-in (compassplay_jax/settings)
  config.variant = variant
  config.seed = 0
  config.steps = 10
  config.workdir = ""  # --workdir wins; default: runs/<setting>_<variant>
  # JAX's persistent compilation cache: a second run loads compiled programs from here ("" = off).
  config.compile_cache_dir = "~/.cache/compassplay_jax/xla"
  # Programs whose shapes are known early (the optimizer update, a fixed reference set's g_ref, the
  # cosine pass once proposals are validated) compile on a background thread while the step
  # generates (compassplay_jax/infra/compile_ahead.py): "auto" (on from COMPILE_AHEAD_MIN_CORES CPU cores) |
  # "on" | "off" (each program compiles at its first call).
  config.compile_ahead = "auto"
  # Where "data:<relpath>" paths point: "" = $COMPASSPLAY_DATA, else ~/.cache/compassplay/data.
  # Fill it with `python -m compassplay_jax.cli.data fetch --all` (docs/data.md).
  config.data_dir = ""

  config.model = ml_collections.ConfigDict()
  config.model.path = "smollm2-135m"  # HF directory or Hub id (owner/name[@rev]), .gguf, "smollm2-135m", "tiny"
  config.model.dtype = "float32"  # compute dtype
  config.model.param_dtype = "float32"  # master weights
  config.model.remat = False
  # Query-blocked attention (ModelConfig.attention_query_chunk; 0 = plain): bounds the T x T scores of
  # full-sequence passes at long lengths (docs/sharding.md, "Per-function report").
  config.model.attention_query_chunk = dataclass_fields(ModelConfig, ("attention_query_chunk",))["attention_query_chunk"]
  # The blocks of the train step and g_ref as one lax.scan (ModelConfig.scan_layers): with remat,
  # activations of one layer at a time under any compiler (docs/sharding.md, "Per-function report").
  config.model.scan_layers = dataclass_fields(ModelConfig, ("scan_layers",))["scan_layers"]
  # Attention of full-sequence passes (train, g_ref, cosines; ModelConfig.attention_impl, docs/model.md):
  # "auto" = splash on TPU, cuDNN flash attention on GPU, XLA on CPU | "xla" | "cudnn" | "splash".
  config.model.attention_impl = dataclass_fields(ModelConfig, ("attention_impl",))["attention_impl"]
  # The random model of path="tiny" (uses the embedded tokenizer's vocabulary).
  config.model.tiny_hidden_size = 64
  config.model.tiny_layers = 2
  config.model.tiny_heads = 4
  config.model.tiny_kv_heads = 2

  # sharding.MeshConfig's defaults: FSDP over all devices (-1 = all devices the other axes leave),
  # so a 7B run shards params, grads and AdamW state; set tensor for Megatron splits inside a layer.
  config.mesh = ml_collections.ConfigDict(dataclass_fields(MeshConfig))

  # SamplingConfig's defaults: temperature 1, top_p 1, top_k 0 (off), 512 new tokens, static engine
  # micro-batches of 32 rows.
  config.sampling = ml_collections.ConfigDict(dataclass_fields(
      SamplingConfig, ("temperature", "top_p", "top_k", "max_new_tokens", "micro_batch_size")))
  config.sampling.max_prompt_tokens = 2048
  config.sampling.engine = "continuous"  # continuous (batching by slots) | static | vllm (docs/sampling.md)
  # vllm: vLLM's venv Python ("" = $COMPASSPLAY_VLLM_PYTHON or the venv of scripts/install.sh vllm), its
  # sleep mode around the update ("auto": on CUDA), its max_model_len (0 = the model's), more vllm.LLM args.
  config.sampling.vllm_python = ""
  config.sampling.vllm_sleep = "auto"
  config.sampling.vllm_max_model_len = 0
  config.sampling.vllm_options = ml_collections.ConfigDict()
  config.sampling.chunk_tokens = 8  # continuous: decode steps per device call between slot refills
  # continuous: GB per device for decode slots (KV cache + per-step temporaries); 0 = half the device's
  # free memory where jax reports it (GPU/TPU), else 2 GB (CPU) (sampling/batching.py)
  config.sampling.memory_budget_gb = 0.0
  # continuous: "auto" (paged: pages measured 1.7x on the loop workload) | "dense" (a cache row per slot) |
  # "paged" (a page pool; on a mesh split over the batch shards as the slots are); docs/sampling.md
  config.sampling.kv_layout = "auto"
  # paged: the decode attention: "auto" (Pallas paged kernels on GPU / TPU, the pure-JAX gather on CPU) |
  # "gather" | "pallas_gpu" | "pallas_tpu" (sampling/paged_kernels.py)
  config.sampling.paged_attention = "auto"

  config.reward = ml_collections.ConfigDict()
  config.reward.name = "compassplay_cos"  # compassplay_cos | compassplay_cos_novelty | difficulty | novelty_only | soar_utility
  config.reward.method = "fused"  # fused | direct (chunked vmap(grad))
  config.reward.chunk_size = 8  # direct method: candidates per chunk
  config.reward.micro_batch_size = 8  # reference-gradient and fused-pass micro-batch
  config.reward.reference_path = ""
  config.reward.reference_size = 32
  # Draws the reference set (reference_size problems of reference_path) once for every run: not the run
  # seed, so seeds 0, 1, 2 share the same problems (docs/data.md; the run's summary.json states it).
  config.reward.reference_seed = 0
  # What g(x̃) is compared with (coding): "external" = the reference set above, one g_ref for all;
  # "local" = per seed program, the solver's verified solution of the seed task the proposer was
  # conditioned on (Lean's reference; docs/coding_tasks.md "Local reference"). Lean is always local.
  config.reward.reference = "external"
  # Gate values (rewards.proposer_rewards.RewardConfig = AZR's code, docs/paper_settings.md §4.1):
  # bad_format -1 (tags malformed), invalid -1 (invalid proposal), out_of_band -0.5 (solve rate 0 or 1;
  # the paper's equation uses 0).
  config.reward.update(dataclass_fields(RewardConfig, ("bad_format", "invalid", "out_of_band")))
  config.reward.max_completion_tokens = 1024  # candidate solution tokens used for g(x) (0 = sampling.max_new_tokens)
  # SOAR's measured reward (reward.name = soar_utility; rewards/soar.py, docs/rewards.md): valid
  # candidates in proposal order are cut into groups; per group a copy of the solver takes
  # soar_inner_steps inner steps (soar_inner_optimizer, lr soar_inner_lr, soar_inner_batch rows each) on the group's
  # verified tasks, and the group's reward is the copy's held-out gain: greedy accuracy (soar_signal
  # "accuracy", SOAR's reward) or the drop of the gold-solution NLL ("nll"). Held-out: soar_heldout_size
  # problems of soar_heldout_path ("" / 0 = reward.reference_path / reward.reference_size), never one
  # of the reference set's problems.
  config.reward.soar_signal = "accuracy"  # accuracy | nll
  config.reward.soar_group_size = 64  # SOAR: data sets of n = 64 generated pairs
  config.reward.soar_inner_steps = 10  # SOAR: 10 inner (RLOO) steps
  config.reward.soar_inner_batch = 8  # SOAR: batch 8 per inner step (0 = the whole group every step)
  # Adam at 1e-5: measured, plain SGD at 1e-4 moves a copy by ~1e-5 of its weights, far below bf16's step
  # at 7B (docs/rewards.md, "Does the copy move?"); "sgd" with lr 1e-4 is the old behaviour.
  config.reward.soar_inner_optimizer = "adam"  # sgd | adam (optax.adam(soar_inner_lr), a fresh state per group)
  config.reward.soar_inner_lr = 1e-5
  config.reward.soar_answer_tokens = 1024  # accuracy: greedy tokens per held-out answer
  config.reward.soar_heldout_path = ""
  config.reward.soar_heldout_size = 0  # SOAR: 64 reward questions

  # rl.train_step.TrainConfig's defaults (AZR's, docs/paper_settings.md §5.3); schedule: constant | linear | cosine.
  config.train = ml_collections.ConfigDict(dataclass_fields(TrainConfig, (
      "learning_rate", "warmup_steps", "schedule", "weight_decay", "b1", "b2", "grad_clip", "clip_eps_low",
      "clip_eps_high", "entropy_coef", "kl_coef")))
  config.train.micro_batch_size = 8  # rows per forward/backward (TrainConfig's None = the whole batch)
  # 0: rows padded to one shape, micro_batch_size rows per pass. > 0: rows packed by their real length
  # into micro-batches of at most this many tokens (same update, less padding; on any mesh, each
  # process placing its share of every micro-batch). The paper configs: pack_update_rows.
  config.train.micro_batch_tokens = 0
  # A fresh optimizer state (moments, step count, schedule) at the start of every step's update, as
  # SGS builds a new trainer each iteration (configs/lean.py); warmup_steps then count within the step.
  config.train.fresh_optimizer = False
  # Old log-probs of the PPO ratio from the training forward at the update's starting params (veRL's
  # old_log_prob), not the sampler's: "auto" = when the compute dtype is not float32; "on" | "off".
  config.train.recompute_logprobs = "auto"
  # Optimizer steps per coding step: the step's rows, in AZR's (task, role) order, cut into this many
  # contiguous PPO mini-batches, one AdamW step each; from the second the ratio leaves 1 and the clip
  # can bind (docs/training.md "PPO mini-batches"). AZR: 1 (docs/paper_settings.md §5.3). Lean cuts
  # its optimizer steps by lean.train_batch_size instead.
  config.train.ppo_mini_batches = 1
  # How token losses are averaged (rl/aggregation.py): "token_mean" over every trained token of a PPO
  # mini-batch; "verl": veRL's mean over micro-batches of verl_micro_batch_rows consecutive rows of each
  # micro-batch's token mean (what AZR trains with: configs/coding.py). Our own packing and micro-batch
  # sizes change neither.
  config.train.loss_aggregation = "token_mean"
  config.train.verl_micro_batch_rows = 16

  config.sandbox = ml_collections.ConfigDict()
  config.sandbox.num_workers = 0  # 0 = number of CPU cores
  config.sandbox.timeout_s = 10.0  # AZR's executor timeout (docs/paper_settings.md §3)

  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.every_steps = 10
  config.checkpoint.keep = 3
  # Written in the background while the next step runs (Orbax's async save; atomic as before: a crash
  # mid-write resumes from the previous checkpoint). A synchronous save of the demo's 1.6 GB of params and
  # AdamW state blocked the loop 3.6-4.5 s, an async one 0.06-0.10 s (experiments/bench_checkpoint.py,
  # docs/training.md); a 7B run's ~84 GB would stall every save.
  config.checkpoint.async_save = True

  config.eval = eval_config()

  # Device traces (compassplay_jax/infra/profiling.py): the steps to trace ("2", "2,3"; "" = none) and where
  # ("" = <workdir>/profile). Trace a step after the first: step 1 is mostly compilation.
  config.profile = ml_collections.ConfigDict()
  config.profile.steps = ""
  config.profile.dir = ""

  # The setting's own block, config.<setting>: its spec's (compassplay_jax/settings; an unknown name is a
  # one-line error naming the known ones).
  config[setting] = settings.get(setting).config_block()
  return config


def pack_update_rows(config) -> None:
  """Rows packed by length in the update, at most one padded micro-batch's tokens per pass
  (micro_batch_size x train_sequence_len), so no pass holds more than the micro-batch the memory
  tables measured (docs/sharding.md). The update is the batch's token mean either way
  (tests/test_bucketed_update.py): packing saves the padding only (AZR's veRL trains without padding:
  docs/training.md). In experiments/step_time.py's estimate it takes the paper coding update from 3.0
  to 1.0 min a step on v5p-8, and Lean's from 22.7 to 8.4 (docs/sharding.md).
  Call it after the micro-batch size is final."""
  config.train.micro_batch_tokens = config.train.micro_batch_size * train_sequence_len(config)


def tensor_parallel_7b(config) -> None:
  """Tensor axis 4 and micro-batches of 2 rows: what a 7B paper step needs where FSDP alone does not fit.

  docs/sharding.md's per-function tables: with FSDP over 8 devices and micro-batches of 8 rows, the
  azr-coding train step needs 97.4 GiB per v5p chip (95.7 GiB of HBM), and on 8 devices of 80 GB
  (XLA:CPU's figures) neither setting's fused cosine pass fits, nor azr-coding's train step. With
  tensor 4 and micro-batches of 2 every function of both settings fits both (the coding train step,
  scanned: 33.2 GiB on v5p-8, 45.7 GiB by XLA:CPU; docs/sharding.md table (d)). Micro-batch sizes
  change no result (token-mean update, per-example cosines, mean-over-sequences g_ref): only memory
  and speed.
  """
  config.mesh.tensor = 4
  config.mesh.fsdp = -1  # FSDP over the devices the tensor axis leaves
  config.train.micro_batch_size = 2
  config.reward.micro_batch_size = 2
