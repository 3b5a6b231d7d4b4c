"""Rollouts: desired state per model, the reconciler that converges each engine, and the controller."""
