"""lean package."""
