"""Flightdeck's control plane. `controlplane.app.create_app` builds the Flask application.

Kept import-free on purpose: gunicorn.conf.py reads the settings before prometheus_client may be
imported, because the metrics' multiprocess mode is chosen at that import.
"""

# The one place the version is written: pyproject.toml reads it (setuptools `attr`), the server reports it.
__version__ = "0.1.0"
