"""A Ray Serve deployment holding ``AsyncLLM`` in process and serving the OpenAI API through
Serve's HTTP ingress, replies byte for byte as ``infer serve`` makes them (JSON and SSE).

    from infer.ray.serve import build_openai_app
    app = build_openai_app({"model": "model.gguf", "engine_kwargs": {"max_model_len": 2048},
                            "deployment_config": {"num_replicas": 2}})
    serve.run(app)

or from the command line: ``serve run infer.ray.serve:build_app model=model.gguf num_replicas=2``.
Replicas and autoscaling are Serve's own options (``num_replicas``, ``autoscaling_config``,
``ray_actor_options={"num_gpus": 1}`` for ``backend="cuda"``). A replica whose engine has
stopped fails its health check, and Serve replaces it.
"""

import os
from typing import Any, Dict, Optional

from ray import serve
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from infer.async_llm import AsyncLLM

# Headers that describe the reply's framing: Starlette sets its own.
_FRAMING = {"content-length", "transfer-encoding", "connection"}


class InferServer:
    """One replica: an engine and the OpenAI routes in front of it."""

    def __init__(self, model: str, engine_kwargs: Optional[Dict[str, Any]] = None):
        self.engine = AsyncLLM(model, **(engine_kwargs or {}))
        self.replica = str(os.getpid())

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        root = request.scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        if request.url.query:
            path += "?" + request.url.query
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _FRAMING]
        reply = await self.engine.openai(request.method, path, await request.body(), headers)
        out_headers = {k: v for k, v in reply.headers if k.lower() not in _FRAMING}
        # Which replica answered (load spread, logs); the body is the server's as is.
        out_headers["x-infer-replica"] = self.replica
        if (reply.header("content-type") or "").startswith("text/event-stream"):
            return StreamingResponse(_chunks(reply), status_code=reply.status, headers=out_headers)
        return Response(await reply.body(), status_code=reply.status, headers=out_headers)

    async def check_health(self) -> None:
        """Serve's health check: a stopped engine makes the replica unhealthy (replaced)."""
        await self.engine.check_health()

    async def stats(self) -> Dict[str, Any]:
        """This replica's engine counters and process id (which replica answered)."""
        stats = await self.engine.get_stats()
        stats["pid"] = os.getpid()
        return stats

    async def shutdown_engine(self) -> int:
        """Stops this replica's engine (operators and tests: what a dead engine looks like);
        returns the replica's process id."""
        self.engine.shutdown()
        return os.getpid()


async def _chunks(reply):
    try:
        async for chunk in reply:
            yield chunk
    finally:
        # The client went away: drop the stream, which aborts its request.
        reply.close()


def build_openai_app(config: Dict[str, Any]) -> "serve.Application":
    """A Serve application for ``config``: ``model`` (or ``model_loading_config.model_source``),
    ``engine_kwargs`` (``infer serve`` settings by their Python names) and
    ``deployment_config`` (Serve's: ``num_replicas``, ``autoscaling_config``,
    ``ray_actor_options``, ``max_ongoing_requests``, health check periods)."""
    model = config.get("model") or config.get("model_loading_config", {}).get("model_source")
    if not model:
        raise ValueError("build_openai_app: give `model` (a GGUF file, HF folder or hub id)")
    engine_kwargs = dict(config.get("engine_kwargs") or {})
    served = config.get("model_loading_config", {}).get("model_id")
    if served and "served_model_name" not in engine_kwargs:
        engine_kwargs["served_model_name"] = served
    options = {"health_check_period_s": 2, "health_check_timeout_s": 30, "max_ongoing_requests": 64}
    options.update(config.get("deployment_config") or {})
    deployment = serve.deployment(InferServer, name=config.get("name", "InferServer")).options(**options)
    return deployment.bind(model, engine_kwargs)


def build_app(args: Dict[str, str]) -> "serve.Application":
    """``serve run infer.ray.serve:build_app model=... num_replicas=2 [backend=cuda ...]``:
    Serve's command-line builder (every other ``key=value`` is an engine setting)."""
    args = dict(args)
    model = args.pop("model", None)
    deployment: Dict[str, Any] = {}
    if "num_replicas" in args:
        deployment["num_replicas"] = int(args.pop("num_replicas"))
    if "num_gpus" in args:
        deployment["ray_actor_options"] = {"num_gpus": float(args.pop("num_gpus"))}
    engine_kwargs = {k: _value(v) for k, v in args.items()}
    return build_openai_app({"model": model, "engine_kwargs": engine_kwargs, "deployment_config": deployment})


def _value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text
