"""Lean 4 conjecture-and-prove self-play (SGS-style), reward cos x (1 - token-Jaccard(conjecture, seed)).

  python -m compassplay_jax.main --config=configs/lean.py             # the paper: DeepSeek-Prover-V2-7B
  python -m compassplay_jax.main --config=configs/lean.py:80gb        # ... on 8 devices of 80 GB (tensor 4)
  python -m compassplay_jax.main --config=configs/lean.py:demo        # SmolLM2-135M on CPU (needs a Lean REPL)
  python -m compassplay_jax.main --config=configs/lean.py:tiny        # random tiny model (tests, stand-in REPL)

Lean and Mathlib must be installed by the user (docs/lean.md); without them the run stops at
start-up with the setup instruction. Values marked SGS come from "Scaling Self-Play with Self-Guidance"
(arXiv 2604.20209) and its code (github.com/LukeBailey181/sgs, scripts/standard_sgs.py); values marked
paper from CompassPlay's design card. docs/lean.md ("The loop") lists them with their sources.
"""
from compassplay_jax.runtime import config_base


def get_config(arg: str = ""):
  variant = arg or "paper"
  config = config_base.base_config("lean", variant)

  config.model.path = ""  # DeepSeek-Prover-V2-7B: the Hub id "deepseek-ai/DeepSeek-Prover-V2-7B" or a local directory.
  config.model.dtype = "bfloat16"  # SGS: bf16 (§1.3)
  config.model.param_dtype = "float32"
  config.model.remat = True
  # Query-blocked attention: bounds the fp32 T x T scores of 8192-token passes (docs/sharding.md,
  # "Per-function report").
  config.model.attention_query_chunk = 1024
  # The train step's and g_ref's blocks as one lax.scan: remat then keeps one layer's activations
  # whatever the compiler's schedule (docs/sharding.md, "Per-function report").
  config.model.scan_layers = True
  config.steps = 200  # paper: 200 iterations, coverage measured every iteration (design card); SGS ~200 (§1.3)

  l = config.lean
  # SGS's D3k, 3,323 statements (§1.2; python -m compassplay_jax.cli.data fetch d3k, by name: no license is stated).
  # The public stand-in: --config.lean.targets_path=data:leanworkbook/leanworkbook_train_1k.jsonl
  l.targets_path = "data:d3k/D_3k_prover_dataset.json"
  l.targets_per_iteration = 0  # SGS: proofs for every target, solved ones included, each iteration
  l.proofs_per_problem = 8  # SGS: k = 8 for targets and conjectures
  l.solver_band_max = 0.5  # SGS: REINFORCE-1/2, problems with 0 < s <= 0.5
  # Conditioning (domains/lean/schedule.py): "seeds" = every target with a verified proof (the paper:
  # the proposer sees the seed, g_ref = gradient of its verified proof, so cos x novelty is computable
  # for every eligible conjecture); "unsolved" = SGS's TARGET_STATEMENT_ONLY_UNSOLVED; "all" = both.
  l.conditioning = "seeds"
  l.conjectures_per_seed = 1  # SGS: one conjecture per conditioned statement
  l.seeds_per_iteration = 0  # 0 = every scheduled statement
  # "floored_baseline": whitened, baseline max(mean, 0), and every copy of its seed (novelty 0 under a
  # novelty reward, whatever its solve rate) trained down at advantage <= -1 (docs/lean.md §9);
  # "sgs_minmax": SGS's min-max REINFORCE weights (never negative; the difficulty baseline's SGS form).
  l.proposer_advantage = "floored_baseline"
  l.zero_weight_try = True  # SGS: proofs containing `try` get weight 0
  l.overlong_penalty = True  # SGS: DAPO length penalty on kept proofs longer than 0.8 x max_new_tokens
  # SGS: the same penalty on trained conjectures (ModelConfig.dapo_length_penalty=True, sgs/models/model_types.py:60,
  # not overridden for the conjecturer, sgs/utils/experiment_utils.py:168-181; applied at
  # sgs/pipeline/step2_train.py:304-310).
  l.conjecture_length_penalty = True
  # SGS: the prover's extractor is extract_proof_deepseek_v2_strict (sgs/utils/experiment_utils.py:152,
  # sgs/utils/prompts.py:133-181): one ```lean4 block, the whole answer, one declaration.
  l.strict_extraction = True
  # SGS: conjectures deduplicated before proving: one whose extracted string (sgs/utils/prompts.py:184-221)
  # equals a target's `theorem` or an earlier conjecture's is dropped, exact match
  # (sgs/pipeline/step1_data_gen.py:443-452; only the kept ones are proved and trained, :522).
  l.dedup_conjectures = True
  # SGS: prompt + generation <= 8192 tokens: vLLM's max_model_len = max_tokens = 8192 in its generation
  # workers (sgs/models/query_local.py:399-408; max_tokens=8192 at sgs/utils/experiment_utils.py:153, :176).
  l.max_total_tokens = 8192
  l.train_batch_size = 32  # SGS: one epoch over the iteration's rows at batch 32; 0 = one step
  l.epochs_per_iteration = 1
  l.num_workers = 8
  # SGS: PipelineConfig.verifier_timeout = 500 s (sgs/pipeline/config.py:80; scripts/standard_sgs.py keeps it),
  # passed to every check (sgs/pipeline/full_pipeline.py:427, step1_data_gen.py:569, pipeline_pv.py:111).
  # The verifier's own default is 200 s (sgs/verification/prover/lean/verifier.py:32), as the paper states
  # (App. B); the run used 500, and the configs follow the code (docs/paper_settings.md).
  l.timeout_s = 500.0

  s = config.sampling
  s.temperature = 1.0  # SGS: temperature 1.0, top_p 1.0 (§1.3)
  s.top_p = 1.0
  s.max_new_tokens = 8192  # SGS: max_tokens 8192 (§1.3)
  s.max_prompt_tokens = 2048

  r = config.reward
  r.name = "compassplay_cos_novelty"  # paper: cos x (1 - J(conjecture, seed)) with the local reference
  # g(x̃) and g_ref over the whole proof: reward sequences up to max_prompt_tokens + max_new_tokens
  # (0 = the whole completion; longer ones, if any, are counted in lean/reward_truncated).
  r.max_completion_tokens = 0

  t = config.train
  t.learning_rate = 3e-6  # SGS: lr 3e-6, constant (§1.3)
  t.b2 = 0.95  # SGS: Adam beta2 0.95 (§1.3)
  t.weight_decay = 0.0  # SGS uses Adam (no decay)
  t.grad_clip = 1.0  # SGS (§1.3)
  # SGS: a new HF Trainer every iteration that loads only the weights (reset_trainer=True,
  # scripts/standard_sgs.py:58; sgs/training/train_local.py:163,344): fresh Adam moments and step count.
  t.fresh_optimizer = True
  # SGS writes warmup_steps=2 (sgs/utils/experiment_utils.py:200 -> train_local.py:301) with
  # lr_scheduler_type="constant" (train_local.py:300), and transformers' get_scheduler ignores warmup
  # for "constant" (transformers 4.55.2, SGS requirements.txt:23): SGS trains at 3e-6 from its first
  # step. 0 reproduces that; 2 gives the warmup as written (counted within each iteration).
  t.warmup_steps = 0
  t.micro_batch_size = 8

  config.checkpoint.every_steps = 5

  if variant == "demo":
    config.model.path = "smollm2-135m"
    config.model.dtype = "float32"
    config.model.remat = False
    config.model.attention_query_chunk = 0  # short sequences: plain attention
    config.model.scan_layers = False
    config.steps = 3
    l.targets_path = "data:minif2f/minif2f.jsonl"
    l.targets_limit = 8
    l.prefill_proof = True  # a 135M model rarely writes the ```lean4 block itself
    l.strict_extraction = False  # ... nor closes it
    l.proofs_per_problem = 2
    l.num_workers = 2
    s.max_new_tokens = 256
    config.train.learning_rate = 1e-5
    config.checkpoint.every_steps = 1
  elif variant == "tiny":
    config.model.path = "tiny"
    config.sampling.kv_layout = "dense"  # short rows; as configs/coding.py:tiny
    config.model.dtype = "float32"
    config.model.remat = False
    config.model.attention_query_chunk = 0
    config.model.scan_layers = False
    config.steps = 2
    l.targets_path = ""  # tests pass a small target file
    l.targets_limit = 4
    l.prefill_proof = True
    l.strict_extraction = False  # a random model never closes the code block
    l.proofs_per_problem = 4
    l.num_workers = 2
    l.timeout_s = 10.0
    l.train_batch_size = 16
    s.max_new_tokens = 24
    s.max_prompt_tokens = 512
    config.train.learning_rate = 1e-3
    config.checkpoint.every_steps = 1
  elif variant == "80gb":
    # FSDP alone fits a v5p-8 (docs/sharding.md); on 80 GB devices XLA:CPU's figures need tensor 4.
    config_base.tensor_parallel_7b(config)
  elif variant != "paper":
    raise ValueError(f"configs/lean.py: unknown variant {variant!r} (known: paper, 80gb, demo, tiny)")
  if variant in ("paper", "80gb"):
    # Rows packed by length, at most a padded micro-batch's tokens per pass: SGS's kept proofs are short
    # beside the 8192-token cap, and padding every row to the longest costs most of the update
    # (docs/sharding.md, "Lean iteration"). The update is the same token mean (config_base.pack_update_rows).
    config_base.pack_update_rows(config)
  return config
