"""Errors raised by the serving engine, each carrying the HTTP status it maps to.

The engine knows nothing of HTTP; the status is a hint the transport layer uses so
that every caller (REST, CLI, tests) classifies failures the same way.
"""


class ServingError(Exception):
    """Base class for every error the engine reports to a caller."""

    status: int = 500
    reason: str = "internal"
    # Where the engine had routed the request when it failed; None when it failed before routing.
    version: str | None = None
    slot: str | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# Why a client's request was refused, as `kind` (a label on the client-error counts of history and metrics).
CLIENT_ERROR_KINDS = (
    "malformed",  # the body is not a well-formed inference request (JSON, binary layout, parameters)
    "shape",  # a tensor's shape (rank, a fixed axis, batch or sequence length agreeing) does not fit
    "datatype",  # a tensor's datatype or its values do not fit the model's
    "unknown_input",  # an input the model does not have, or one it needs missing
    "unknown_output",  # an output asked for that the model does not have
    "batch_size",  # over the model's batch limit
    "too_large",  # the body is over the size limit
    "not_found",  # a version not loaded
    "runtime",  # ONNX Runtime refused the request's own values (an id outside the vocabulary)
)


class InvalidInput(ServingError):
    """The request does not match the model's declared inputs; `kind` says how (`CLIENT_ERROR_KINDS`)."""

    status = 400
    reason = "invalid_input"

    def __init__(self, message: str, kind: str = "malformed") -> None:
        super().__init__(message)
        self.kind = kind


class InputRejected(InvalidInput):
    """The model's runtime refused this request's own values or shapes (an id outside the vocabulary)."""

    def __init__(self, message: str, kind: str = "runtime") -> None:
        super().__init__(message, kind)


class ModelNotFound(ServingError):
    """No such model, or no such version loaded."""

    status = 404
    reason = "not_found"


class PayloadTooLarge(ServingError):
    """The request body is over the configured size limit."""

    status = 413
    reason = "too_large"


class Overloaded(ServingError):
    """The bounded queue is full; the client should retry after `retry_after` seconds."""

    status = 429
    reason = "overloaded"

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = max(1, int(retry_after))


class Unavailable(Overloaded):
    """The engine is draining or the model is not ready; retry elsewhere or later."""

    status = 503
    reason = "unavailable"


class DeadlineExceeded(ServingError):
    """The request's deadline passed before it could run."""

    status = 504
    reason = "timeout"


def client_error_kind(exc: ServingError) -> str | None:
    """The client-error kind of a refusal, or None when the request was not at fault (overload, a failure)."""
    if isinstance(exc, InvalidInput):
        return exc.kind
    if isinstance(exc, PayloadTooLarge):
        return "too_large"
    if isinstance(exc, ModelNotFound):
        return "not_found"
    return None


class InferenceFailed(ServingError):
    """The model itself failed while running a batch."""

    status = 500
    reason = "inference_failed"
