"""A scripted coder for the tiny coding config (a random tiny model writes no valid programs).

`ScriptedCoder(tokenizer)` has rollout.sample's signature: it runs the real rollout.sample on every
request (the engine's sampler, each process's share across processes), then answers from a script:
proposals cycle through PROGRAMS by their position in the call, a solver's even samples are right and
odd ones wrong, so every proposal is valid and in band (solve rate 1/2) and its cosine pays it. The
answers depend only on the call's prompts, never on how they were split between processes.
"""
import numpy as np

from compassplay_jax.sampling.generate import GenerationResult
from compassplay_jax.selfplay import rollout

# Shorter sequences than coding:tiny's (1024 prompt, 24 new, 256 reward-completion tokens): every pass
# of the tiny model costs its 49,152-token vocabulary per position, so the reward passes' 256-column
# rows (g_ref, cosines) and the decode steps were most of a step. Prompts keep their last 96 tokens
# (the task and the scaffold the scripted coder continues), reward rows 128 columns, 8 decode steps:
# the scripted answers (a few tokens) are unchanged, every candidate is still valid, in band and paid
# by its cosine, and the runs compared (meshes, processes) see the same truncated rows.
SHORT_SEQUENCES = {"sampling.max_prompt_tokens": 96, "sampling.max_new_tokens": 8, "reward.max_completion_tokens": 32}

PROGRAMS = {"x * 2": "3", "x + 5": "4", "x - 7": "9", "x * x": "2"}  # one-line body -> its input


def _output(body: str, x: int) -> int:
  """The program's output on x (the script's own arithmetic; no model text is evaluated)."""
  return {"x * 2": x * 2, "x + 5": x + 5, "x - 7": x - 7, "x * x": x * x}[body]


class ScriptedCoder:

  def __init__(self, tokenizer=None):
    self.tokenizer, self.calls = tokenizer, 0

  def answer(self, prompt, sample, proposal_index):
    if not isinstance(prompt, str):  # the proposal's second segment: its input
      body = self.tokenizer.decode(list(prompt)).rsplit("return ", 1)[1].split("\n")[0]  # its own program
      return PROGRAMS[body] + "\n"
    if prompt.endswith("return "):  # a proposal's first segment: the function body
      return list(PROGRAMS)[proposal_index % len(PROGRAMS)] + "\n"
    task = prompt[prompt.rindex("```python\n"):]
    body = next((b for b in PROGRAMS if f"return {b}\n" in task), None)
    if body is None:  # a seed task in the solver batch
      return "0\n"
    x = int(PROGRAMS[body])
    if prompt.endswith("```output\n"):
      return f"{_output(body, x)}\n" if sample % 2 == 0 else "-1000\n"
    return f"{x}\n" if sample % 2 == 0 else "1000\n"

  def __call__(self, engine, params, tokenizer, prompts, config, key, *, n_samples=1, on_finish=None, **kwargs):
    # on_finish is not passed on: the real rows are replaced below, so the loop checks the scripted
    # ones after generation (selfplay/overlap.py's path for an engine without the hook).
    self.tokenizer = self.tokenizer or tokenizer
    real = rollout.sample(engine, params, tokenizer, prompts, config, key, n_samples=n_samples, **kwargs)
    texts = [self.answer(p, s, i) for i, p in enumerate(prompts) for s in range(n_samples)]
    tokens = [np.asarray(tokenizer.encode(t, add_special_tokens=False), np.int32) for t in texts]
    self.calls += 1
    return GenerationResult(prompt_index=real.prompt_index, sample_index=real.sample_index,
                            prompt_tokens=real.prompt_tokens, tokens=tokens,
                            logprobs=[np.full(len(t), -1.0, np.float32) for t in tokens],
                            lengths=np.asarray([len(t) for t in tokens]), finish_reasons=["stop"] * len(texts),
                            texts=texts)
