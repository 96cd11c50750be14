"""Errors a client sees: an HTTP status and an OpenAI-style {"error": {...}} body, never a traceback."""

from __future__ import annotations

from app.errors import FlashDeskError


class ApiError(Exception):
    """A request the server refuses or could not serve; `body()` is what the client gets."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param
        self.headers = headers or {}

    def __reduce__(self) -> tuple:  # pickled whole: the app's engine process sends a job's failure to the app
        return (ApiError, (self.status, self.message, self.type, self.code, self.param, self.headers))

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class ServerConfigError(FlashDeskError):
    """A server that must not start as asked (a public bind without a key, a bad limit)."""


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def server_error(message: str) -> ApiError:
    return ApiError(500, message, type_="server_error")


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, type_="server_error", code="unavailable")
