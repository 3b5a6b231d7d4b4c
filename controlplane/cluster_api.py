"""GET /api/cluster: the nodes, their serving processes (alive or gone), what each serves, and who leads.

A read (a viewer is enough, as for every management read); the data is `controlplane.cluster`'s.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint
from pydantic import Field

from controlplane.clock import utcnow
from controlplane.cluster import describe_cluster
from controlplane.context import current_services, get_db
from controlplane.contract import Reply, Timestamp, operation

bp = Blueprint("cluster", __name__, url_prefix="/api")


class LeaderView(Reply):
    holder: str = Field(description="the lease holder: NODE:PID:<random>")
    process: str = Field(description="the leading process, NODE:PID")
    node: str
    since: Timestamp = Field(description="when this holder took the lease")
    expires_at: Timestamp = Field(description="when the lease runs out unless renewed")
    current: bool = Field(description="false when the lease has expired and nobody has taken it yet")


class ServedView(Reply):
    model: str
    slot: str
    version: str
    state: str = Field(description="what the process last reported: loaded, failed or empty")


class ProcessView(Reply):
    process: str = Field(description="NODE:PID")
    node: str
    pid: int | None
    alive: bool
    state: str = Field(description="alive, or gone: no heartbeat for three FLIGHTDECK_HEARTBEAT_S")
    leader: bool
    last_heartbeat: Timestamp | None = Field(description="None: it left (stopped) or never reported a heartbeat")
    started_at: Timestamp | None
    flightdeck_version: str = Field(description="the Flightdeck release it runs (empty: an older release)")
    serving: list[ServedView]


class NodeView(Reply):
    node: str
    alive: bool = Field(description="at least one of its processes is alive")
    leader: bool
    processes: list[ProcessView]


class ClusterView(Reply):
    node: str = Field(description="the node that answered (also the X-Flightdeck-Node header)")
    leader: LeaderView | None = Field(description="None: no process ever took the lease")
    heartbeat_s: float
    gone_after_s: float
    drop_after_s: float
    nodes: list[NodeView]


@bp.get("/cluster")
@operation(response=ClusterView)
def cluster() -> dict[str, Any]:
    """Every node and serving process (alive or gone, last heartbeat, versions served) and the lease holder."""
    settings = current_services().settings
    return {"node": settings.node_name, **describe_cluster(get_db(), utcnow(), settings.liveness)}
