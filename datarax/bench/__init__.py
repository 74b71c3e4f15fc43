"""datarax.bench."""
