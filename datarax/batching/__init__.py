"""datarax.batching."""
