"""The self-play loops (coding and Lean) and the pieces they share."""
