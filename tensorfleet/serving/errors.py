"""The one error a request can end in, with TF Serving's status codes for gRPC and HTTP."""

from __future__ import annotations

from enum import Enum

__all__ = ["Code", "ServingError", "as_serving_error"]


class Code(str, Enum):
    """The gRPC status names TF Serving answers with, each with its HTTP status for the REST API."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    NOT_FOUND = "NOT_FOUND"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    INTERNAL = "INTERNAL"

    @property
    def http_status(self) -> int:
        return _HTTP[self]


# As TF Serving's REST front maps them (http_rest_api_handler: ToHTTPStatusCode).
_HTTP = {
    Code.INVALID_ARGUMENT: 400, Code.FAILED_PRECONDITION: 400, Code.NOT_FOUND: 404,
    Code.RESOURCE_EXHAUSTED: 429, Code.UNAVAILABLE: 503, Code.DEADLINE_EXCEEDED: 504, Code.INTERNAL: 500,
}


class ServingError(Exception):
    """A request the server refuses or could not answer; ``code`` says which kind, for both APIs."""

    def __init__(self, message: str, code: Code = Code.INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.message = message
        self.code = Code(code)

    @property
    def http_status(self) -> int:
        return self.code.http_status


# TensorFlow's OpError.error_code values (tensorflow/core/protobuf/error_codes.proto) that a request can cause.
_TF_CODES = {3: Code.INVALID_ARGUMENT, 5: Code.NOT_FOUND, 8: Code.RESOURCE_EXHAUSTED, 9: Code.FAILED_PRECONDITION,
             14: Code.UNAVAILABLE, 4: Code.DEADLINE_EXCEEDED}


def as_serving_error(exc: BaseException) -> ServingError:
    """``exc`` as a ServingError: itself, a TensorFlow op error with its own code, else INTERNAL.

    Example:
        >>> as_serving_error(RuntimeError("boom")).code, as_serving_error(RuntimeError("boom")).message
        (<Code.INTERNAL: 'INTERNAL'>, 'RuntimeError: boom')
    """
    if isinstance(exc, ServingError):
        return exc
    error_code = getattr(exc, "error_code", None)
    code = _TF_CODES.get(error_code, Code.INTERNAL) if isinstance(error_code, int) else Code.INTERNAL
    message = getattr(exc, "message", None) or str(exc)
    return ServingError(f"{type(exc).__name__}: {message}", code)
