"""The command line for access: `users`, `tokens` and `audit` (added to `python -m controlplane`).

Every change made here is audited with actor_kind 'cli' and the OS user's name as the actor.
"""

from __future__ import annotations

import getpass
import os
import sys
from datetime import UTC, datetime

import click

from controlplane.auth import tokens as token_service
from controlplane.auth import users as user_service
from controlplane.auth.audit import MAX_LIMIT, audited, list_events
from controlplane.auth.passwords import generate_password
from controlplane.auth.roles import Actor, Role
from controlplane.clicontext import CliContext, FlightdeckGroup, emit_json, json_option, pass_cli
from controlplane.errors import ApiError
from controlplane.models import ApiToken, AuditEvent

ROLES = click.Choice([r.value for r in Role])


def cli_actor() -> Actor:
    """Return the actor CLI changes are audited as: the OS user, with the admin role the shell implies."""
    try:
        name = getpass.getuser()
    except (OSError, KeyError):  # no passwd entry, e.g. an arbitrary container uid
        name = f"uid:{os.getuid()}"
    return Actor(name=name, role=Role.ADMIN, kind="cli")


def event_json(event: AuditEvent) -> dict[str, object]:
    """Describe one audit event for `--json`."""
    names = ("ts", "actor", "actor_kind", "action", "target", "outcome", "address", "detail")
    return {name: getattr(event, name) for name in names}


def _read_password(password_stdin: bool) -> str:
    if password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    return click.prompt("Password", hide_input=True, confirmation_prompt=True)


@click.group("auth", cls=FlightdeckGroup)
def auth_cli() -> None:
    """Users, API tokens and the audit trail."""


@auth_cli.group(cls=FlightdeckGroup)
def users() -> None:
    """User accounts."""


@users.command("create")
@click.argument("name")
@click.option("--role", type=ROLES, default=Role.VIEWER.value, show_default=True)
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
@click.option("--generate", is_flag=True, help="Generate a random password and print it once.")
@pass_cli
def users_create(obj: CliContext, name: str, role: str, password_stdin: bool, generate: bool) -> None:
    """Create a user (the database is migrated first, so this works before the first start)."""
    if password_stdin and generate:
        raise click.UsageError("--password-stdin and --generate exclude each other")
    password = generate_password() if generate else _read_password(password_stdin)
    obj.migrate()
    with obj.session() as session, audited(session, cli_actor(), "user.create", name) as event:
        event.detail["role"] = role
        user_service.create_user(session, name, password, Role(role), datetime.now(UTC))
    click.echo(f"created user {name} ({role})")
    if generate:
        click.echo(f"password (shown once): {password}")


@users.command("update")
@click.argument("name")
@click.option("--role", type=ROLES, help="New role.")
@click.option("--disable/--enable", "disabled", default=None, help="Refuse or allow the user's logins and tokens.")
@click.option("--password", "new_password", is_flag=True, help="Set a new password (prompted).")
@click.option("--password-stdin", is_flag=True, help="Set a new password read from the first line of stdin.")
@pass_cli
def users_update(
    obj: CliContext, name: str, role: str | None, disabled: bool | None, new_password: bool, password_stdin: bool
) -> None:
    """Change a user's role, disable or enable them, or reset their password."""
    password = _read_password(password_stdin) if new_password or password_stdin else None
    with obj.session() as session, audited(session, cli_actor(), "user.update", name) as event:
        user = user_service.get_user(session, name)
        if user is None:
            raise ApiError(f"no user named {name!r}")
        event.detail.update(
            user_service.update_user(
                session, user, role=Role(role) if role else None, disabled=disabled, password=password
            )
        )
    click.echo(f"updated user {name}: {', '.join(sorted(event.detail)) or 'nothing changed'}")


@users.command("list")
@json_option
@pass_cli
def users_list(obj: CliContext, as_json: bool) -> None:
    """List the users."""
    with obj.session() as session:
        rows = user_service.list_users(session)
    if as_json:
        emit_json([{"name": u.name, "role": u.role, "disabled": u.disabled, "created_at": u.created_at} for u in rows])
        return
    for user in rows:
        state = "disabled" if user.disabled else "enabled"
        click.echo(f"{user.name:<24} {user.role:<9} {state:<9} created {user.created_at:%Y-%m-%d %H:%M}")


@auth_cli.group(cls=FlightdeckGroup)
def tokens() -> None:
    """API tokens for scripts and runbooks."""


@tokens.command("create")
@click.option("--user", "user_name", required=True, help="The user the token acts for.")
@click.option("--name", required=True, help="What the token is for, e.g. deploy-bot.")
@click.option("--role", type=ROLES, help="Role (default: the user's; never above it).")
@click.option("--ttl-s", type=click.IntRange(min=1), help="Seconds until it expires (default: never).")
@pass_cli
def tokens_create(obj: CliContext, user_name: str, name: str, role: str | None, ttl_s: int | None) -> None:
    """Create a token and print its secret (shown this once only)."""
    with obj.session() as session, audited(session, cli_actor(), "token.create", user_name) as event:
        user = user_service.get_user(session, user_name)
        if user is None:
            raise ApiError(f"no user named {user_name!r}")
        wanted = Role(role or user.role)
        event.detail.update(name=name, role=wanted.value, ttl_s=ttl_s)
        token, secret = token_service.create_token(session, user, name, wanted, datetime.now(UTC), ttl_s)
        event.detail.update(token_id=token.id, prefix=token.prefix)
    click.echo(f"token {token.id} ({name}, {wanted}) for {user_name}; the secret is shown only now:")
    click.echo(secret)


@tokens.command("revoke")
@click.argument("token_id", type=int)
@pass_cli
def tokens_revoke(obj: CliContext, token_id: int) -> None:
    """Revoke a token by its id."""
    with obj.session() as session, audited(session, cli_actor(), "token.revoke", str(token_id)) as event:
        token = session.get(ApiToken, token_id)
        if token is None:
            raise ApiError(f"no token {token_id}")
        if not token_service.revoke_token(session, token, datetime.now(UTC)):
            event.detail["already_revoked"] = True
    click.echo(f"token {token_id} revoked" + (" (it already was)" if event.detail.get("already_revoked") else ""))


@tokens.command("list")
@click.option("--user", "user_name", help="Only this user's tokens.")
@json_option
@pass_cli
def tokens_list(obj: CliContext, user_name: str | None, as_json: bool) -> None:
    """List tokens (never their secrets)."""
    now = datetime.now(UTC)
    with obj.session() as session:
        user_id = None
        if user_name:
            user = user_service.get_user(session, user_name)
            if user is None:
                raise ApiError(f"no user named {user_name!r}")
            user_id = user.id
        rows = [token_service.token_to_dict(t, owner, now) for t, owner in token_service.list_tokens(session, user_id)]
    if as_json:
        emit_json(rows)
        return
    for t in rows:
        state = "active" if t["active"] else ("revoked" if t["revoked_at"] else "expired")
        click.echo(f"{t['id']:>5} {t['prefix']}…  {t['user']:<16} {t['name']:<20} {t['role']:<9} {state}")


@auth_cli.command()
@click.option("--since", default="-1h", show_default=True, help="Start: 'now', -15m, -6h, -7d or ISO 8601.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, MAX_LIMIT))
@click.option("--actor", help="Only this actor.")
@click.option("--action", help="Only this action (a trailing * matches a prefix, e.g. 'token.*').")
@json_option
@pass_cli
def audit(obj: CliContext, since: str, limit: int, actor: str | None, action: str | None, as_json: bool) -> None:
    """Print audit events, newest first."""
    from controlplane.timeparse import parse_time

    try:
        start = parse_time(since, "since", datetime.now(UTC))
    except ApiError as exc:
        raise click.BadParameter(exc.message, param_hint="--since") from None
    with obj.session() as session:
        events = list_events(session, since=start, actor=actor, action=action, limit=limit)
    if as_json:
        emit_json([event_json(e) for e in events])
        return
    if not events:
        click.echo("no audit events in this range")
    for e in events:
        where = e.address or "-"
        click.echo(
            f"{e.ts:%Y-%m-%d %H:%M:%S} {e.outcome:<6} {e.actor}({e.actor_kind}) {e.action} {e.target} from {where}"
        )
