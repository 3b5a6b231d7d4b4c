"""The SLO status API: each SLO's objective, good/total requests, error budget left and burn rates.

    GET /api/history/slos[?model=mlp]    every SLO (of one model)
    GET /api/history/slos/<name>         one SLO

The SLOs are declared beside the alert rules (alerts/rules/slo.yaml) and loaded once at start.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint

from controlplane.context import current_services
from controlplane.contract import operation
from controlplane.errors import NotFound
from controlplane.history.slo_schemas import SloList, SloQuery, SloStatus

bp = Blueprint("history_slo", __name__, url_prefix="/api/history/slos")


@bp.get("")
@operation(query=SloQuery, response=SloList, tags=("history",))
def slos(query: SloQuery) -> dict[str, Any]:
    """Return every SLO's status now: objective, good/total, budget left, burn rate per alert window."""
    services = current_services()
    chosen = [s for s in services.slos if query.model is None or s.model == query.model]
    return {"slos": services.history.slo_status(chosen, datetime.now(UTC))}


@bp.get("/<name>")
@operation(response=SloStatus, errors={404: "No SLO of that name"}, tags=("history",), path={"name": "the SLO's name"})
def slo(name: str) -> dict[str, Any]:
    """Return one SLO's status now: objective, good/total, budget left, burn rate per alert window."""
    services = current_services()
    chosen = next((s for s in services.slos if s.name == name), None)
    if chosen is None:
        raise NotFound(f"no SLO named {name!r}; known: {sorted(s.name for s in services.slos)}")
    return services.history.slo_status([chosen], datetime.now(UTC))[0]
