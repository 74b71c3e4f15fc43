"""datarax.config."""
