"""Access control and audit: users and roles, API tokens, sessions, `require_role`, the audit trail.

Views guard themselves with `require_role(Role.OPERATOR)`; a change and its audit event go in
one transaction with `record_event` (or the `audited` block); views hand `request_audit` to
services that take an `Audit` callback, the CLI `audit.audit_as(cli_actor())`. The HTTP side lives in
`controlplane.auth.api` (blueprint) and the command line in `controlplane.auth.cli`.
"""

from controlplane.auth.audit import audited, record_event
from controlplane.auth.guard import current_actor, public, refusals_audited, request_audit, require_role
from controlplane.auth.roles import SYSTEM_ACTOR, Actor, Role

__all__ = [
    "SYSTEM_ACTOR",
    "Actor",
    "Role",
    "audited",
    "current_actor",
    "public",
    "record_event",
    "refusals_audited",
    "request_audit",
    "require_role",
]
