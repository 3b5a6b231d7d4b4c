from controlplane.cli import cli

cli(prog_name="python -m controlplane")
