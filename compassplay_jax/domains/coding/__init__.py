"""coding package."""
