"""Benchmarks and soaks (the lead is moving serving/bench* here too)."""
