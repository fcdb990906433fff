"""Every error a client sees is an error object in its API's shape: OpenAI's
{"error": {message, type, param, code}}, or on the Anthropic Messages API (/v1/messages)
Anthropic's {"type": "error", "error": {type, message}}.

APIError(message, status=400, ...)   raise anywhere in a handler; .response(path) answers
install_error_handlers(app)          maps APIError, validation errors, 404 / 405 / 413 /
                                     415, 429 (QueueFull), 503 (engine dead), 500 (a
                                     failed engine step or a bug) to that shape
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from cadence.engine.client import EngineDeadError, EngineStepError

logger = logging.getLogger("cadence.api")

# HTTP status -> OpenAI error type, for errors raised outside our own handlers.
_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "internal_error",
    503: "service_unavailable",
}


# HTTP status -> Anthropic error type.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)


class QueueFull(Exception):
    """The server is full right now: 429 with Retry-After."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class APIError(Exception):
    """An error for the client: becomes {"error": {...}} with this HTTP status."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code or self.status,
            }
        }

    def response(self, path: str = "") -> JSONResponse:
        """The JSON error response, in the shape of the API that `path` belongs to."""
        anthropic = path.startswith(ANTHROPIC_PATHS)
        body = anthropic_error_body(self) if anthropic else self.body()
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def anthropic_error_body(err: APIError) -> dict:
    fallback = "invalid_request_error" if err.status < 500 else "api_error"
    kind = _ANTHROPIC_TYPES.get(err.status, fallback)
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def validation_message(e: ValidationError) -> str:
    """A pydantic error, as one line naming where: `messages.0.role: Input should be ...`."""
    err = e.errors()[0]
    where = ".".join(str(x) for x in err.get("loc", ()))
    return f"{where}: {err.get('msg')}" if where else str(err.get("msg"))


def api_error_for(e: BaseException) -> APIError:
    """The client's view of an exception raised while serving a request (also used for the
    error event that ends a stream whose status line already went out)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, QueueFull):
        return APIError(
            str(e), 429, "rate_limit_exceeded", headers={"Retry-After": str(e.retry_after)}
        )
    if isinstance(e, EngineDeadError):
        return APIError(str(e), 503, "service_unavailable")
    if isinstance(e, EngineStepError):
        return APIError(str(e), 500, "internal_error", code="engine_step_failed")
    if isinstance(e, ValueError):
        return APIError(str(e))
    logger.error("internal error", exc_info=e)
    return APIError(f"internal error: {type(e).__name__}", 500, "internal_error")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        path = request.url.path
        errs = e.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            detail = first.get("ctx", {}).get("error", "")
            return APIError(f"malformed JSON body: {detail}".strip()).response(path)
        loc = [str(x) for x in first.get("loc", []) if x != "body"]
        msg = "; ".join(
            f"{'.'.join(str(x) for x in err.get('loc', []) if x != 'body')}: {err.get('msg')}"
            for err in errs[:5]
        )
        return APIError(msg or "invalid request", param=".".join(loc) or None).response(path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        message = str(e.detail)
        if e.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif e.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return APIError(
            message, e.status_code, _TYPES.get(e.status_code, "invalid_request_error")
        ).response(request.url.path)

    for kind in (APIError, QueueFull, EngineDeadError, EngineStepError, ValueError, Exception):

        @app.exception_handler(kind)
        async def _mapped(request: Request, e: Exception):
            return api_error_for(e).response(request.url.path)
