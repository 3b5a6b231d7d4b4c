"""Runbook scripts, shipped with the package; each `*.py` here (but `_*.py`) runs as a standalone script."""
