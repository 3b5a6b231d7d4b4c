"""Declared documents (alert rules, SLOs, runbook declarations, model manifests): one way to say what is wrong.

A leaf: it imports pydantic only, so `alerts/`, `serving/` and `controlplane/` may all use it.
"""
