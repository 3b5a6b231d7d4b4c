"""The drift API: scores per version against its reference, their series, and pinning a reference.

GET    /api/models/<m>/drift[?window=1h&version=2]          scores now
GET    /api/models/<m>/drift/series?version=2&start=-1d     a point per step (the charts)
PUT    /api/models/<m>/versions/<v>/drift-reference         pin a window (operator, audited)
DELETE /api/models/<m>/versions/<v>/drift-reference         back to the first day (operator, audited)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint

from controlplane.auth import Role
from controlplane.auth.guard import current_actor, refusals_audited, request_audit, require_role
from controlplane.context import get_db
from controlplane.contract import operation
from controlplane.history import drift
from controlplane.history.drift_schemas import (
    DriftQuery,
    DriftSeriesQuery,
    DriftSeriesView,
    DriftView,
    PinBody,
    ReferenceView,
    UnpinView,
)

bp = Blueprint("drift", __name__, url_prefix="/api/models")
PATH = {"name": "a model", "version": "one of its versions"}


@bp.get("/<name>/drift")
@operation(query=DriftQuery, response=DriftView, tags=("history",), path=PATH)
def scores(name: str, query: DriftQuery) -> dict[str, Any]:
    """Score each version's predictions and inputs over the window against its reference."""
    end = datetime.now(UTC)
    return drift.describe(get_db(), name, end - timedelta(seconds=query.seconds), end, query.version)


@bp.get("/<name>/drift/series")
@operation(query=DriftSeriesQuery, response=DriftSeriesView, tags=("history",), path=PATH)
def series(name: str, query: DriftSeriesQuery) -> dict[str, Any]:
    """Return one version's scores over a range, a point per step against its reference."""
    reference, found = drift.drift_series(get_db(), name, query.version, query.start, query.end, query.step)
    return {
        "model": name,
        "version": query.version,
        "reference": reference.as_dict() if reference else None,
        "series": found,
    }


@bp.put("/<name>/versions/<version>/drift-reference")
@require_role(Role.OPERATOR, action="drift.pin_reference")
@refusals_audited("drift.pin_reference", lambda name, version, **_: f"{name}:{version}")
@operation(body=PinBody, response=ReferenceView, tags=("history",), path=PATH, errors={404: "No such version"})
def pin(name: str, version: str, body: PinBody) -> dict[str, Any]:
    """Pin a window of what the version answered as the reference later windows are compared with."""
    session = get_db()
    start, end = body.window()
    pinned = drift.pin_reference(session, name, version, start, end, request_audit, current_actor().name)
    session.commit()
    return pinned.as_dict()


@bp.delete("/<name>/versions/<version>/drift-reference")
@require_role(Role.OPERATOR, action="drift.unpin_reference")
@refusals_audited("drift.unpin_reference", lambda name, version, **_: f"{name}:{version}")
@operation(response=UnpinView, tags=("history",), path=PATH)
def unpin(name: str, version: str) -> dict[str, Any]:
    """Forget a pinned reference: the version's first day serving is its reference again."""
    session = get_db()
    removed = drift.unpin_reference(session, name, version, request_audit)
    session.commit()
    return {"removed": removed}
