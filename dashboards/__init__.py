"""Dashboards: Plotly figures from recorded history, and a Grafana dashboard over the Prometheus metrics.

A leaf package: no Flask, no database. It takes data in and returns figures (plain, JSON-ready dicts).
"""
