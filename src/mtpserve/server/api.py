"""The FastAPI app: routes, readiness, auth, metrics; and ``run_server`` for the CLI.

Routes:

- ``GET /health``: 200 ``{"status": "ok"}`` once the engine is ready; 503 with ``status``
  ``starting`` | ``dead`` (with ``error``) | ``stopped`` otherwise. Never needs the API key.
- ``GET /metrics``: Prometheus text (see ``metrics.py``). Never needs the API key.
- ``GET /v1/models``, ``GET /v1/models/{id}``, ``POST /v1/completions``,
  ``POST /v1/chat/completions``: need ``Authorization: Bearer <key>`` when an API key is set
  (else 401), and answer 503 until the engine is ready.

Every error body is an OpenAI error object (see ``errors.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import Awaitable, Callable

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from mtpserve.config import EngineConfig
from mtpserve.engine.async_engine import AsyncEngine
from mtpserve.server.auth import api_key_checker
from mtpserve.server.errors import APIError, install_error_handlers
from mtpserve.server.logprobs import TokenStrings
from mtpserve.server.metrics import ServerMetrics
from mtpserve.server.model_context import ModelContext, model_context
from mtpserve.server.protocol import ChatCompletionRequest, CompletionRequest
from mtpserve.server.serving_chat import ChatServing
from mtpserve.server.serving_common import parse_body
from mtpserve.server.serving_completion import CompletionServing

logger = logging.getLogger(__name__)

def engine_state(engine: AsyncEngine) -> str:
    """``ok`` (serving), ``starting`` (loading / warming up), ``dead`` (loop died) or ``stopped``."""
    if engine.ready and engine.alive:
        return "ok"
    if engine.dead:
        return "dead"
    return "starting" if engine.alive else "stopped"


def readiness_checker(engine: AsyncEngine) -> Callable[[], Awaitable[None]]:
    """A dependency raising APIError 503 (``service_unavailable``) unless the engine is ready."""
    async def check() -> None:   # async: no thread-pool hop per request (~0.9 ms on the CPU)
        state = engine_state(engine)
        if state == "ok":
            return
        msg = {"starting": "the engine is starting (loading weights and warming up); retry soon",
               "dead": f"the engine has stopped after an error: {engine.error}",
               "stopped": "the engine is not running"}[state]
        raise APIError(503, msg, type="service_unavailable", code=f"engine_{state}")
    return check


def build_app(engine: AsyncEngine, *, served_model_name: str | None = None,
              api_key: str | None = None, start_engine: bool = True) -> FastAPI:
    """The OpenAI-compatible app over ``engine``.

    Args:
        engine: the async engine front (built by the caller; its factory loads the model).
        served_model_name: the model id clients must use; default ``engine.config.served_model_name``,
            else the model file's stem (directory name for HF folders).
        api_key: when set, /v1/* need ``Authorization: Bearer <api_key>``.
        start_engine: start the engine thread when the app starts (and shut it down when the app
            stops); pass False when the caller starts it.
    """
    metrics = ServerMetrics(engine.stats)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if start_engine:
            engine.start()
        try:
            yield
        finally:
            if start_engine:
                await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="mtpserve", lifespan=lifespan)
    app.state.engine = engine
    app.state.metrics = metrics
    install_error_handlers(app)
    app.include_router(_v1_router(engine, metrics, served_model_name, api_key))

    @app.get("/health")
    async def health() -> JSONResponse:
        state = engine_state(engine)
        body = {"status": state}
        if state == "dead":
            body["error"] = engine.error
        return JSONResponse(body, status_code=200 if state == "ok" else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    return app


def _v1_router(engine: AsyncEngine, metrics: ServerMetrics, served_model_name: str | None,
               api_key: str | None) -> APIRouter:
    router = APIRouter(prefix="/v1", dependencies=[Depends(api_key_checker(api_key)),
                                                   Depends(readiness_checker(engine))])
    strings: dict[int, TokenStrings] = {}

    def strings_for(ctx: ModelContext) -> TokenStrings:
        key = id(ctx.tokenizer)
        if key not in strings:
            strings[key] = TokenStrings(ctx.tokenizer)
        return strings[key]

    chat = ChatServing(engine, metrics, strings_for)
    completion = CompletionServing(engine, metrics, strings_for)
    created = int(time.time())

    def ctx() -> ModelContext:
        return model_context(engine, served_model_name)

    def card(c: ModelContext) -> dict:
        return {"id": c.name, "object": "model", "created": created, "owned_by": "mtpserve",
                "max_model_len": c.max_model_len}

    @router.get("/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [card(ctx())]}

    @router.get("/models/{model_id:path}")
    async def get_model(model_id: str) -> dict:
        c = ctx()
        if model_id != c.name:
            raise APIError(404, f"The model `{model_id}` does not exist.", param="model",
                           code="model_not_found")
        return card(c)

    @router.post("/completions")
    async def create_completion(request: Request):
        req = await parse_body(request, CompletionRequest)
        return await completion.create(req, ctx(), request)

    @router.post("/chat/completions")
    async def create_chat_completion(request: Request):
        req = await parse_body(request, ChatCompletionRequest)
        return await chat.create(req, ctx(), request)

    return router


def make_engine(config: EngineConfig, warmup: bool = True,
                engine_process: bool = False) -> AsyncEngine:
    """An (unstarted) async engine whose thread builds ``LLMEngine(config)``; with
    ``engine_process``, one whose own process does (engine/process_engine.py)."""
    if engine_process:
        from mtpserve.engine.process_engine import ProcessEngine

        return ProcessEngine(config, warmup=warmup)

    def factory():
        t0 = time.perf_counter()
        from mtpserve.engine.engine import LLMEngine   # torch and the model code: seconds
        logger.info("engine modules imported in %.1f s", time.perf_counter() - t0)
        return LLMEngine(config)
    return AsyncEngine(factory, warmup=warmup)


def run_server(config: EngineConfig, *, host: str = "127.0.0.1", port: int = 8000,
               api_key: str | None = None, log_level: str = "info",
               served_model_name: str | None = None, engine_process: bool = False) -> int:
    """Serve the OpenAI API for ``config``'s model until interrupted; returns the exit code: 0
    after an interrupt, 1 when the engine failed to start, 3 when the port cannot be opened.

    The HTTP port opens at once; the model loads in the engine thread meanwhile (``/health``
    answers 503 until it is ready). The model id is ``served_model_name``, else
    ``config.served_model_name``, else the model file's stem. A port that cannot be opened
    (in use, no permission) ends the command with exit code 3 before any weight is loaded; an
    engine that dies before it is ready (its error logged) ends it with 1
    (``runner.AbortingServer``).
    ``engine_process``: the engine loop runs in a process of its own (engine/engine_core.py).
    """
    import uvicorn

    from mtpserve.server.runner import AbortingServer, listen_socket

    try:
        sock = listen_socket(host, port)
    except OSError as e:
        logger.error("cannot listen on %s:%d: %s", host, port, e.strerror or e)
        return 3
    engine = make_engine(config, engine_process=engine_process)
    app = build_app(engine, served_model_name=served_model_name, api_key=api_key)
    cfg = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(),
                         timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    server = AbortingServer(cfg, engine)
    server.run(sockets=[sock])
    return server.exit_code


GRACEFUL_SHUTDOWN_S = 5.0   # after Ctrl-C, uvicorn then cancels whatever is still open
