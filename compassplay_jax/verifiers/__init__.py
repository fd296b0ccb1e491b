"""verifiers package."""
