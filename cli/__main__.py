"""`python -m jobq.cli`: the same as the `jobq` command."""

from jobq.cli.main import cli

cli(prog_name="jobq")
