"""Peers the benchmark measures Flightdeck against, each run in a process (and environment) of its own."""
