"""Prompts for the two Lean roles, in the formats the DeepSeek-Prover-V2 models know.

Both are user messages: the training loop wraps them in the model's chat template.
"""
from compassplay_jax.domains.lean.targets import LeanTarget

# SGS's conjecturer prompt (sgs/utils/prompts.py), word for word, including its
# missing space after "statement." so outputs stay comparable with SGS.
_CONJECTURER_TEMPLATE = (
    "Here is a Lean 4 problem statement:\n```lean4\n{statement}\n```\n"
    "Please generate a lean4 theorem that is a lemma or related theorem that is useful for "
    "proving the above statement. It should be possible to use the lemma or related theorem to "
    "help prove the above statement. The lemma or related theorem should be simpler to prove "
    "than the target statement.It should NOT be identical to the target statement. It should "
    "NOT be equivalent through renaming variables and premises.\n"
    "Output the final theorem as a syntactically correct lean4 theorem statement between "
    "```lean4 and ``` tags. The final thing you output should be the theorem statement WITHOUT "
    "any proof, just put 'sorry' for the proof.")

# DeepSeek-Prover-V2 non-CoT format, as SGS uses it: header + statement ending `:= by`.
_PROVER_TEMPLATE = "Complete the following Lean 4 code:\n\n```lean4\n{code}\n```"

# DeepSeek-Prover-V2 chain-of-thought format (its README): the statement ends in sorry.
_PROVER_COT_TEMPLATE = (
    "Complete the following Lean 4 code:\n\n```lean4\n{code}\n  sorry\n```\n\n"
    "Before producing the Lean 4 code to formally prove the given theorem, provide a detailed "
    "proof plan outlining the main proof steps and strategies.\n"
    "The plan should highlight key ideas, intermediate lemmas, and proof structures that will "
    "guide the construction of the final formal proof.")


def conjecturer_prompt(seed: LeanTarget) -> str:
  """Asks for a simpler related lemma, conditioned only on the seed statement (no proof)."""
  return _CONJECTURER_TEMPLATE.format(statement=seed.statement.rstrip())


def prover_prompt(statement: str, header: str, chain_of_thought: bool = False) -> str:
  """Asks for a proof of `statement`; the answer's proof body follows its `:= by`."""
  code = header + statement.rstrip()
  template = _PROVER_COT_TEMPLATE if chain_of_thought else _PROVER_TEMPLATE
  return template.format(code=code)
