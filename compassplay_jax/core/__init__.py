"""Bottom layer: errors and JSON-lines helpers; imports nothing of the package."""
