"""Access control and audit: users and roles, API tokens, sessions, the audit trail.

Views guard themselves with `controlplane.auth.guard.require_role(Role.OPERATOR)` (the web layer);
a change and its audit event go in one transaction with `record_event` (or the `audited` block);
views hand `guard.request_audit` to services that take an `Audit` callback, the CLI
`audit.audit_as(cli_actor())`. This package's own names are Flask-free: the domain imports them.
"""

from controlplane.auth.audit import audited, record_event
from controlplane.auth.roles import SYSTEM_ACTOR, Actor, Role

__all__ = ["SYSTEM_ACTOR", "Actor", "Role", "audited", "record_event"]
