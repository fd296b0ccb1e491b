"""AZR's reward table as data, with the released code's and the paper's variants.

AZR code (LeapLabTHU/Absolute-Zero-Reasoner, paper branch), reward_managers.py:
  proposer: -1 bad format or invalid proposal; -0.5 valid but solve rate in {0, 1}; else 1 - rate.
  solver:   -1 bad format; -0.5 wrong; 1 right.
Paper (arXiv 2505.03335, Eq. 4 and the format-aware penalty): identical except a
valid proposal with solve rate 0 or 1 gets 0 (issue #37 records the mismatch).
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class RewardTable:
  format_error: float = -1.0    # Both roles: tags malformed, or (proposer) invalid task.
  solver_wrong: float = -0.5
  solver_right: float = 1.0
  proposer_out_of_band: float = -0.5  # Valid task that every or no solver sample solved.

  def solver(self, format_ok: bool, correct: bool) -> float:
    if not format_ok:
      return self.format_error
    return self.solver_right if correct else self.solver_wrong

  def proposer(self, format_ok: bool, valid: bool, solve_rate: float) -> float:
    """r = 1 - solve_rate for 0 < rate < 1 (AZR's learnability reward)."""
    if not format_ok or not valid:
      return self.format_error
    if not 0.0 <= solve_rate <= 1.0:
      raise ValueError(f"solve_rate must be in [0, 1], got {solve_rate}")
    if solve_rate in (0.0, 1.0):
      return self.proposer_out_of_band
    return 1.0 - solve_rate


AZR_CODE = RewardTable()
PAPER = RewardTable(proposer_out_of_band=0.0)
TABLES = {"azr_code": AZR_CODE, "paper": PAPER}
