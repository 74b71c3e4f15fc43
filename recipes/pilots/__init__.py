"""Validation-only pilots that chose a recipe's settings; each module says which settings and how to run it."""
