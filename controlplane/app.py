"""Flightdeck's control plane: the Flask application factory."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flask import Flask, Response, g

from controlplane import (
    cluster_api,
    console,
    context,
    dashboards_view,
    docs_view,
    errorhandlers,
    inference_api,
    openapi,
    ops_api,
    repository_api,
)
from controlplane.alerting import api as alerts_api
from controlplane.auth import api as auth_api
from controlplane.auth.session_secret import session_secret
from controlplane.config import Settings, load_settings
from controlplane.contract import RowIdConverter
from controlplane.history import api as history_api
from controlplane.history import slo_api
from controlplane.logconfig import configure_logging
from controlplane.registry import api as registry_api
from controlplane.rollout import api as rollout_api
from controlplane.runbooks import api as runbooks_api
from controlplane.services import Services, build_services

# Management bodies are small JSON; the two that are not (a model archive, an inference request) raise
# this per request to their own settings. Without it an anonymous 300 MB POST /api/session was read.
MAX_API_BODY_BYTES = 1024 * 1024


def create_app(config: Mapping[str, Any] | None = None, services: Services | None = None) -> Flask:
    """Create the application: settings (env + `config` overrides), services, blueprints."""
    settings: Settings = services.settings if services else load_settings(overrides=config)
    configure_logging(settings)
    app = Flask(__name__)
    app.config["SECRET_KEY"] = session_secret(settings)  # configured, or generated once into HOME
    app.config["MAX_CONTENT_LENGTH"] = MAX_API_BODY_BYTES
    app.url_map.converters["int"] = RowIdConverter  # NOTE: before the blueprints: rules bind their converters
    app.extensions[context.KEY] = services or build_services(settings)
    context.init_app(app)  # NOTE: first, so the request's scope is open for every other hook
    errorhandlers.register_handlers(app)
    register_views(app)

    node = settings.node_name

    @app.after_request
    def _echo_request_id(response: Response) -> Response:
        response.headers["X-Request-ID"] = g.get("request_id", "")
        response.headers["X-Flightdeck-Node"] = node  # which node answered, behind a load balancer
        return response

    logging.getLogger(__name__).debug("Flightdeck app created (home %s)", settings.home.resolve())
    return app


def register_views(app: Flask) -> None:
    """Register every blueprint: the routes the API document, the docs site's HTTP reference, and the app share."""
    app.register_blueprint(inference_api.bp)
    app.register_blueprint(repository_api.bp)
    app.register_blueprint(ops_api.bp)
    app.register_blueprint(cluster_api.bp)
    app.register_blueprint(history_api.bp)
    app.register_blueprint(slo_api.bp)
    app.register_blueprint(dashboards_view.bp)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(auth_api.bp)
    app.register_blueprint(registry_api.bp)
    app.register_blueprint(rollout_api.bp)
    app.register_blueprint(alerts_api.bp)
    app.register_blueprint(runbooks_api.bp)
    app.register_blueprint(docs_view.bp)
    app.register_blueprint(console.bp)
