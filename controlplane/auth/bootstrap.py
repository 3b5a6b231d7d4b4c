"""The first admin: created with a random password when there are no users at all."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.auth.audit import record_event
from controlplane.auth.passwords import generate_password
from controlplane.auth.roles import SYSTEM_ACTOR, Role
from controlplane.auth.users import count_users, create_user
from controlplane.config import Settings
from controlplane.errors import Conflict

INITIAL_ADMIN = "admin"
PASSWORD_FILE = "initial-admin-password"


def write_secret_file(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by this OS user only (0600, even if the file existed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def ensure_initial_admin(sessions: sessionmaker[Session], settings: Settings) -> str | None:
    """Create user 'admin' with a random password when no user exists; return the password, else None.

    The password is also written to HOME/initial-admin-password (mode 0600) for whoever missed the
    start-up output; delete that file once the password is changed. Safe to call from several
    processes at once: only the one whose insert wins gets a password back.
    """
    with sessions() as session:
        if count_users(session):
            return None
        password = generate_password()
        try:
            create_user(session, INITIAL_ADMIN, password, Role.ADMIN, datetime.now(UTC))
            record_event(session, SYSTEM_ACTOR, "user.create", INITIAL_ADMIN, "ok", {"role": "admin", "initial": True})
            session.commit()
        except (Conflict, IntegrityError):  # another process got there first
            session.rollback()
            return None
    write_secret_file(settings.home / PASSWORD_FILE, password + "\n")
    return password
