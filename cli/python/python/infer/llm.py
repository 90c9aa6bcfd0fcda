"""vLLM's offline API: ``LLM(model=...).generate(prompts, sampling_params)``."""

import itertools
import json
import sys
from typing import Any, Dict, List, Optional, Sequence, Union

from infer import _infer
from infer.engine_args import engine_kwargs, to_flags
from infer.outputs import BeamSearchOutput, BeamSearchSequence, OutputBuilder, RequestOutput
from infer.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams
from infer.tokenizer import Tokenizer

PromptType = Union[str, Dict[str, Any], List[int]]


def _split_prompt(prompt: PromptType) -> Dict[str, Any]:
    """A prompt as ``/v1/completions`` takes it: text, or token ids."""
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return {"prompt": list(prompt["prompt_token_ids"])}
        if "prompt" in prompt:
            return {"prompt": prompt["prompt"]}
        raise ValueError("a prompt dict needs `prompt` (text) or `prompt_token_ids`")
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
        return {"prompt": list(prompt)}
    raise TypeError(f"a prompt is text, token ids or a dict, not {type(prompt).__name__}")


class _Progress:
    """tqdm when asked for and installed; nothing otherwise."""

    def __init__(self, total: int, enabled: bool, desc: str):
        self.bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=desc, dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                pass

    def update(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class LLM:
    """A model loaded in this process, for offline batched inference (vLLM's ``LLM``).

    ``model`` is a GGUF file, a Hugging Face folder or hub id; every other keyword is an
    ``infer serve`` setting by its Python name (``backend="cuda"``, ``max_model_len=2048``,
    ``gpu_memory_utilization=0.8``, ``seed=0``, ``speculative_config={...}``), checked as the
    server checks its flags.
    """

    def __init__(self, model: str, tokenizer: Optional[str] = None, **kwargs: Any):
        kwargs.setdefault("disable_log_stats", True)
        # Offline: every prompt given is queued, however many, and steps take the whole token
        # budget (the server paces them to keep running streams' gaps between tokens short;
        # a batch wants the fewest steps: 130 instead of 194 for 32 prompts of 170 + 128 tokens).
        kwargs.setdefault("max_waiting", 0)
        kwargs.setdefault("step_target_ms", 0)
        self._engine = _infer.Engine(to_flags(model, engine_kwargs(tokenizer, kwargs)))
        self._tokenizer = Tokenizer(self._engine.tokenizer())
        self._ids = itertools.count()

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    @property
    def model_name(self) -> str:
        return self._engine.model_name

    def get_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def engine_config(self) -> Dict[str, Any]:
        """The KV pool and scheduler as built (blocks, block size, limits)."""
        return json.loads(self._engine.config_json())

    def stats(self) -> Dict[str, Any]:
        """The engine's counters (steps, queues, KV cache usage, tokens)."""
        return json.loads(self._engine.stats_json() or "{}")

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True) -> List[RequestOutput]:
        """Outputs for ``prompts`` (text, token ids or ``{"prompt_token_ids": ...}``), in order.

        All prompts are queued at once and batched by the scheduler; ``sampling_params`` is
        one for all or one per prompt (default: the model's generation config, else vLLM's).
        """
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"{len(sampling_params)} sampling params for {len(prompts)} prompts")
            params_list = list(sampling_params)
        else:
            params_list = [sampling_params] * len(prompts)
        jobs = []
        for prompt, params in zip(prompts, params_list):
            body = params.request_fields() if params is not None else {}
            body.update(_split_prompt(prompt))
            jobs.append((prompt, params, self._engine.prepare_completion(json.dumps(body))))
        return self._run(jobs, use_tqdm, "Processed prompts")

    def chat(self, messages: Union[List[Dict[str, Any]], List[List[Dict[str, Any]]]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
             use_tqdm: bool = True, chat_template_kwargs: Optional[Dict[str, Any]] = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             tools: Optional[List[Dict[str, Any]]] = None) -> List[RequestOutput]:
        """Replies to one conversation or a list of them, through the model's chat template
        (with ``tools`` shown to the model) as ``/v1/chat/completions`` renders them."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        if isinstance(sampling_params, (list, tuple)):
            params_list = list(sampling_params)
        else:
            params_list = [sampling_params] * len(conversations)
        jobs = []
        for conversation, params in zip(conversations, params_list):
            body = params.request_fields() if params is not None else {}
            # `/v1/chat/completions` names these differently.
            if "logprobs" in body:
                body["top_logprobs"] = body.pop("logprobs")
                body["logprobs"] = True
            body["messages"] = conversation
            if tools:
                body["tools"] = tools
            if chat_template_kwargs:
                body["chat_template_kwargs"] = chat_template_kwargs
            if not add_generation_prompt:
                body["add_generation_prompt"] = False
            if continue_final_message:
                body["continue_final_message"] = True
            jobs.append((None, params, self._engine.prepare_chat(json.dumps(body))))
        return self._run(jobs, use_tqdm, "Processed chats")

    def beam_search(self, prompts: Sequence[PromptType], params: BeamSearchParams) -> List[BeamSearchOutput]:
        """The ``beam_width`` best sequences for each prompt, best first (vLLM's); the
        prompts' beams are searched together, batched by the scheduler."""
        jobs = []
        for prompt in prompts:
            body = params.request_fields()
            body.update(_split_prompt(prompt))
            jobs.append((prompt, None, self._engine.prepare_completion(json.dumps(body))))
        return [
            BeamSearchOutput([
                BeamSearchSequence(out.prompt_token_ids + o.token_ids, o.text, o.cumulative_logprob or 0.0,
                                   o.finish_reason, o.stop_reason)
                for o in out.outputs
            ])
            for out in self._run(jobs, False, "")
        ]

    def _run(self, jobs, use_tqdm: bool, desc: str) -> List[RequestOutput]:
        streams = []
        try:
            # One call for every job: the engine admits them at the same step.
            submitted = self._engine.submit(
                [(prepared, [str(next(self._ids)) for _ in prepared.prompt_token_ids]) for _, _, prepared in jobs])
            for (prompt, params, prepared), job_streams in zip(jobs, submitted):
                for s, ptoks in zip(job_streams, prepared.prompt_token_ids):
                    streams.append((s, self._builder(prompt, ptoks, prepared.n, params)))
            progress = _Progress(len(streams), use_tqdm, desc)
            results = []
            for stream, builder in streams:
                results.append(_drain(stream, builder))
                progress.update()
            progress.close()
            return results
        finally:
            # An exception (KeyboardInterrupt included) leaves nothing running.
            self._engine.abort([s.request_id for s, _ in streams])

    def _builder(self, prompt, prompt_token_ids, n, params) -> OutputBuilder:
        text = prompt if isinstance(prompt, str) else (prompt.get("prompt") if isinstance(prompt, dict) else None)
        want_logprobs = params is not None and params.logprobs is not None
        detokenize = params is None or params.detokenize
        return OutputBuilder(text, prompt_token_ids, n, RequestOutputKind.FINAL_ONLY, detokenize,
                             want_logprobs, self._tokenizer.token_text)

    def shutdown(self) -> None:
        """Stops the engine (also done when the process exits)."""
        self._engine.shutdown()


def _drain(stream, builder: OutputBuilder) -> RequestOutput:
    """The request's final output; the engine's per-step outputs are skipped natively."""
    event = stream.last()
    out = builder.push(event) if event is not None else None
    if out is None:
        raise RuntimeError(f"request {stream.request_id} ended without output")
    return out
