"""Plotly figures from the history, and exports for sites that run Grafana and Prometheus.

A leaf package: no Flask, no database. It takes data in and returns figures (plain, JSON-ready dicts).
"""
