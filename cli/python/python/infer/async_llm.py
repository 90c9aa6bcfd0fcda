"""vLLM's asynchronous engine: ``AsyncLLM`` (``AsyncLLMEngine``) streaming outputs to asyncio.

Requests run on the engine's own thread; awaiting an output never holds the GIL while the
engine steps. Cancelling the task that consumes ``generate`` aborts its request, which frees
its KV blocks within one step.
"""

import itertools
import json
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

from infer import _infer
from infer.engine_args import EngineArgs, to_flags
from infer.llm import PromptType, _split_prompt
from infer.outputs import OutputBuilder, RequestOutput
from infer.sampling_params import RequestOutputKind, SamplingParams
from infer.tokenizer import Tokenizer


class OpenAIReply:
    """A reply of the OpenAI routes: ``status``, ``headers``, then the body's chunks (an SSE
    reply's events as they are made) by ``async for``."""

    def __init__(self, native):
        self._native = native
        self.status: int = native.status
        self.headers: List[Tuple[str, str]] = native.headers

    def header(self, name: str) -> Optional[str]:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    async def body(self) -> bytes:
        return b"".join([chunk async for chunk in self])

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._native.next_chunk_async()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    def close(self) -> None:
        self._native.close()


class AsyncLLM:
    """The engine for concurrent requests (a server, a Ray Serve replica)."""

    def __init__(self, model: str, **kwargs: Any):
        kwargs.setdefault("disable_log_stats", True)
        self._engine = _infer.Engine(to_flags(model, kwargs))
        self._tokenizer = Tokenizer(self._engine.tokenizer())
        self._ids = itertools.count()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, start_engine_loop: bool = True, usage_context: Any = None,
                         stat_loggers: Any = None, **unknown: Any) -> "AsyncLLM":
        """vLLM's constructor. ``usage_context`` is accepted (nothing is reported anywhere);
        the engine loop always starts, and custom stat loggers are not supported (the
        engine's counters are ``get_stats()``): asking otherwise raises."""
        if unknown:
            raise TypeError(f"AsyncLLM.from_engine_args: unsupported argument(s) {', '.join(sorted(unknown))}")
        if not start_engine_loop:
            raise ValueError("start_engine_loop=False is not supported: the engine runs on its own thread from the start")
        if stat_loggers:
            raise ValueError("stat_loggers are not supported: read the engine's counters with get_stats()")
        return cls(engine_args.model, **engine_args.extra)

    @property
    def model_name(self) -> str:
        return self._engine.model_name

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    @property
    def is_running(self) -> bool:
        return self._engine.is_running()

    @property
    def errored(self) -> bool:
        return not self._engine.is_running()

    async def check_health(self) -> None:
        """Raises when the engine has stopped (a health check for Serve to replace it)."""
        if not self._engine.is_running():
            raise RuntimeError("the engine has stopped")

    async def get_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    async def get_stats(self) -> Dict[str, Any]:
        """The engine's counters: steps, queues (``num_running``, ``num_waiting``), KV cache
        usage, tokens."""
        return json.loads(self._engine.stats_json() or "{}")

    async def generate(self, prompt: PromptType, sampling_params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None) -> AsyncIterator[RequestOutput]:
        """Outputs as the engine makes them: cumulative (the default), deltas or the final one
        only, as ``sampling_params.output_kind`` says."""
        params = sampling_params or SamplingParams()
        body = params.request_fields()
        body.update(_split_prompt(prompt))
        prepared = self._engine.prepare_completion(json.dumps(body))
        if len(prepared.prompt_token_ids) != 1:
            raise ValueError("generate takes one prompt (a list of texts is several requests)")
        request_id = request_id or f"req-{next(self._ids)}"
        (stream,) = await self._engine.submit_async(prepared, [request_id])
        builder = OutputBuilder(prompt if isinstance(prompt, str) else None, prepared.prompt_token_ids[0],
                                prepared.n, params.output_kind, params.detokenize,
                                params.logprobs is not None, self._tokenizer.token_text)
        # Only the last output is wanted: the ones before it are skipped natively.
        final_only = params.output_kind == RequestOutputKind.FINAL_ONLY
        try:
            while True:
                event = await (stream.last_async() if final_only else stream.next_async())
                if event is None:
                    return
                out = builder.push(event)
                if out is not None:
                    yield out
        finally:
            # Cancelled, closed early or failed: nothing is left running.
            self._engine.abort([request_id])
            stream.close()

    async def abort(self, request_id: Any) -> None:
        """Aborts requests by id (one or a list); their ``generate`` iterators end."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self._engine.abort(ids)

    async def openai(self, method: str, path: str, body: bytes = b"",
                     headers: Optional[List[Tuple[str, str]]] = None) -> OpenAIReply:
        """One OpenAI request (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``,
        ...) through ``infer serve``'s own routes: the same status, headers and bytes."""
        native = await self._engine.openai_async(method, path, body, headers or [])
        return OpenAIReply(native)

    def shutdown(self) -> None:
        self._engine.shutdown()


AsyncLLMEngine = AsyncLLM
