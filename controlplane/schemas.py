"""Models shared by every part of the API: the error envelopes, and the building blocks of the others."""

from __future__ import annotations

from pydantic import Field

from controlplane.contract import Reply


class ErrorDetail(Reply):
    code: str = Field(description="stable, machine-readable: bad_request, not_found, conflict, unauthorized, ...")
    message: str = Field(description="what is wrong, for a person")
    request_id: str | None = Field(description="the X-Request-ID of the request, for the logs")


class ErrorEnvelope(Reply):
    """Every refusal of the management API (outside /v2)."""

    error: ErrorDetail


class OipError(Reply):
    """Every refusal under /v2, in the Open Inference Protocol's form."""

    error: str


class Message(Reply):
    """A plain acknowledgement."""

    message: str
