"""OpenAI-style error objects and the FastAPI handlers that produce them.

Every failure the server reports has the body
``{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}``
(the shape of api.openai.com's errors), never FastAPI's default ``{"detail": ...}``.
"""

from __future__ import annotations

import logging
import re
import typing
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from mtpserve.sampling_params import SamplingParamsError

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"


class APIError(Exception):
    """An error answered to the client as an OpenAI error object.

    Args:
        status: HTTP status code (400, 401, 404, 503, ...).
        message: human-readable text.
        type: OpenAI error type (``invalid_request_error``, ``authentication_error``, ...).
        param: the request field at fault (``"messages[0].role"``), or ``None``.
        code: machine-readable code (``"model_not_found"``, ``"context_length_exceeded"``), or None.
    """

    def __init__(self, status: int, message: str, *, type: str = INVALID_REQUEST,
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        """The JSON body: ``{"error": {message, type, param, code}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 ``invalid_request_error``."""
    return APIError(400, message, param=param, code=code)


def from_sampling_error(e: SamplingParamsError, rename: dict[str, str] | None = None) -> APIError:
    """Map a :class:`SamplingParamsError` to a 400, renaming engine field names to API names."""
    param = (rename or {}).get(e.param, e.param)
    return bad_request(str(e), param=param)


def loc_to_param(loc: tuple, model: type[BaseModel] | None = None) -> str | None:
    """Turn a pydantic error location into an OpenAI ``param`` such as ``messages[0].role``.

    With ``model`` (the validated class) only real field names are kept, so pydantic's union-branch
    tags (``str``, ``list[int]``) never show; without it, the path stops at the first element that
    is neither an index nor an identifier. The ``body`` prefix FastAPI adds is dropped.
    """
    parts: list[str] = []
    current = model
    for item in loc:
        if item == "body" and not parts:
            continue
        if isinstance(item, int):
            if not parts:
                break
            parts[-1] += f"[{item}]"
            continue
        if not (isinstance(item, str) and item.isidentifier()):
            break
        if model is not None:
            fields = getattr(current, "model_fields", None)
            if not fields or item not in fields:
                break
            current = _nested_model(fields[item].annotation)
        parts.append(item)
    return ".".join(parts) or None


def _nested_model(annotation) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as ``list[ChatMessage]`` or ``X | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def from_validation_errors(errors: list[dict], model: type[BaseModel] | None = None) -> APIError:
    """A 400 from pydantic / FastAPI validation errors, naming the first bad field.

    The failed branches of a union (``stop``: a string or a list) are merged into one message.
    """
    if not errors:
        return bad_request("invalid request")
    params = [loc_to_param(tuple(e.get("loc", ())), model) for e in errors]
    param = params[0]
    same = [e for e, p in zip(errors, params) if p == param]
    if same[0].get("type") == "missing":
        msg = "field required"
    elif len(same) > 1:
        wants = [_PREFIX.sub("", e.get("msg", "")) for e in same]
        msg = "expected " + " or ".join(dict.fromkeys(wants))
    else:
        msg = same[0].get("msg", "invalid value")
    text = f"{param}: {msg}" if param else msg
    more = len(errors) - len(same)
    if more > 0:
        text += f" (and {more} more error{'s' if more > 1 else ''})"
    return bad_request(text, param=param)


_PREFIX = re.compile(r"^Input should be ")


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error, including FastAPI's own 404/405/422 and unexpected ones, as OpenAI does.

    Request validation errors (FastAPI's 422) become 400.
    """

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation_errors(list(exc.errors())).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        try:
            phrase = HTTPStatus(exc.status_code).phrase
        except ValueError:
            phrase = "error"
        msg = exc.detail if isinstance(exc.detail, str) else phrase
        code = "not_found" if exc.status_code == 404 else None
        return APIError(exc.status_code, msg, code=code).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error while serving a request")
        return APIError(500, f"internal server error: {type(exc).__name__}: {exc}",
                        type="server_error").response()
