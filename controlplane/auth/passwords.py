"""Password hashing (werkzeug's scrypt) and generated passwords."""

from __future__ import annotations

import secrets
from functools import cache

from werkzeug.security import check_password_hash, generate_password_hash

METHOD = "scrypt"
MIN_LENGTH = 8
MAX_LENGTH = 1024  # scrypt over megabytes of "password" is a cheap way to burn our CPU


def hash_password(password: str) -> str:
    """Return the salted scrypt hash to store instead of the password."""
    return generate_password_hash(password, method=METHOD)


def verify_password(stored_hash: str, password: str) -> bool:
    """Return whether `password` matches `stored_hash` (constant-time comparison inside werkzeug)."""
    if len(password) > MAX_LENGTH:
        return False
    return check_password_hash(stored_hash, password)


@cache
def _dummy_hash() -> str:
    return hash_password(secrets.token_urlsafe(16))


def burn_verify_time(password: str) -> None:
    """Spend as long as a real check would, so an unknown name answers no faster than a wrong password."""
    verify_password(_dummy_hash(), password[:MAX_LENGTH])


def generate_password() -> str:
    """Return a random password for a generated account (about 128 bits)."""
    return secrets.token_urlsafe(16)
