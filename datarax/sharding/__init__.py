"""datarax.sharding."""
