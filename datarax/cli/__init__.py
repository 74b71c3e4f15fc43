"""datarax.cli."""
