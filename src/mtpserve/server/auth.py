"""Bearer-token check for the /v1 routes (``--api-key``); /health and /metrics stay open."""

from __future__ import annotations

import hmac
from typing import Awaitable, Callable

from fastapi import Request

from mtpserve.server.errors import APIError


def api_key_checker(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency that requires ``Authorization: Bearer <api_key>``.

    With ``api_key=None`` every request passes.

    Raises:
        APIError: 401 (``authentication_error``, code ``invalid_api_key``) on a missing or wrong key.
    """
    expected = api_key.encode() if api_key else None

    async def check(request: Request) -> None:   # async: no thread-pool hop per request
        if expected is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            what = "missing" if not header else "incorrect"
            raise APIError(401, f"{what} API key: send the header 'Authorization: Bearer <key>'",
                           type="authentication_error", code="invalid_api_key")

    return check
