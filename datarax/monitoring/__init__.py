"""datarax.monitoring."""
