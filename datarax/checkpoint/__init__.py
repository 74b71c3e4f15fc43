"""datarax.checkpoint."""
