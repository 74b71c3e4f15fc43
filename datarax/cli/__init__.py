"""The `datarax` command line (see `datarax.cli.main` and docs/cli.md)."""

from datarax.cli.main import main as main
