"""rl package."""
