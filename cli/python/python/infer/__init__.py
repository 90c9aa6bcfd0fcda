"""infer: LLM inference with vLLM's Python API.

    from infer import LLM, SamplingParams
    llm = LLM(model="model.gguf")
    outputs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=16))

The engine is infer's (Rust): the same scheduler, sampler and request checks as
``infer serve``.
"""

from infer._infer import __version__
from infer.async_llm import AsyncLLM, AsyncLLMEngine, OpenAIReply
from infer.engine_args import AsyncEngineArgs, EngineArgs
from infer.errors import EngineError, EngineStartError, RequestError
from infer.llm import LLM
from infer.outputs import (BeamSearchOutput, BeamSearchSequence, CompletionOutput, Logprob, RequestMetrics,
                           RequestOutput)
from infer.sampling_params import (BeamSearchParams, GuidedDecodingParams, RequestOutputKind, SamplingParams,
                                   StructuredOutputsParams)
from infer.tokenizer import Tokenizer

__all__ = [
    "__version__", "LLM", "AsyncLLM", "AsyncLLMEngine", "OpenAIReply", "EngineArgs", "AsyncEngineArgs",
    "SamplingParams", "BeamSearchParams", "StructuredOutputsParams", "GuidedDecodingParams",
    "RequestOutputKind", "RequestOutput", "CompletionOutput", "Logprob", "RequestMetrics",
    "BeamSearchOutput", "BeamSearchSequence", "Tokenizer", "RequestError", "EngineError", "EngineStartError",
]
