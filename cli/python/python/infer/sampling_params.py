"""vLLM's ``SamplingParams``, ``BeamSearchParams`` and ``StructuredOutputsParams``.

Parameters are checked when made, by the server's own code, so a bad value raises
``RequestError`` (a ``ValueError``) with the message ``infer serve`` would answer with.
"""

import enum
import json
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Union


class RequestOutputKind(enum.Enum):
    """What each streamed ``RequestOutput`` carries (vLLM's names)."""

    CUMULATIVE = 0  # everything generated so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # one output, at the end


@dataclass
class StructuredOutputsParams:
    """A constraint on the output: exactly one of these (vLLM's fields)."""

    json: Optional[Union[str, Dict[str, Any]]] = None
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None

    def to_json(self) -> Dict[str, Any]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name == "json" and isinstance(value, str):
                value = json.loads(value)
            out[f.name] = value
        return out


# Legacy name (vLLM < 0.11).
GuidedDecodingParams = StructuredOutputsParams

# Fields that only the Python layer reads; every other field goes to the engine as the
# `/v1/completions` field of the same name.
_PYTHON_ONLY = {"detokenize", "output_kind", "structured_outputs", "guided_decoding", "extra_args"}


@dataclass
class SamplingParams:
    """How to sample, with vLLM's fields and defaults."""

    n: int = 1
    best_of: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    bad_words: Optional[List[str]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logits_processors: Optional[List[Any]] = None
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: Optional[int] = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: Optional[StructuredOutputsParams] = None
    guided_decoding: Optional[StructuredOutputsParams] = None
    logit_bias: Optional[Dict[int, float]] = None
    allowed_token_ids: Optional[List[int]] = None
    extra_args: Optional[Dict[str, Any]] = None

    def __post_init__(self) -> None:
        from infer._infer import check_sampling

        if self.extra_args:
            raise _refused("extra_args", "infer reads no extra sampling arguments")
        if self.structured_outputs is not None and self.guided_decoding is not None:
            raise _refused("guided_decoding", "give `structured_outputs` alone")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise _refused("max_tokens", f"{self.max_tokens} must be at least 1")
        check_sampling(json.dumps(self.request_fields()))

    @classmethod
    def from_optional(cls, **kwargs: Any) -> "SamplingParams":
        return cls(**{k: v for k, v in kwargs.items() if v is not None})

    def clone(self) -> "SamplingParams":
        import copy

        return copy.deepcopy(self)

    def request_fields(self) -> Dict[str, Any]:
        """The parameters as ``/v1/completions`` fields (what the engine is given)."""
        body: Dict[str, Any] = {}
        for f in fields(self):
            if f.name in _PYTHON_ONLY:
                continue
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name == "logit_bias":
                value = {str(k): v for k, v in value.items()}
            if f.name == "logits_processors":
                if not value:
                    continue
                # Refused by the engine with its reason; named here for the message.
                value = [getattr(p, "__name__", repr(p)) for p in value]
            body[f.name] = value
        constraint = self.structured_outputs or self.guided_decoding
        if constraint is not None:
            body["structured_outputs"] = constraint.to_json()
        return body


@dataclass
class BeamSearchParams:
    """``LLM.beam_search``'s parameters (vLLM's)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def request_fields(self) -> Dict[str, Any]:
        return {
            "use_beam_search": True,
            "n": self.beam_width,
            "max_tokens": self.max_tokens,
            "ignore_eos": self.ignore_eos,
            "temperature": self.temperature,
            "length_penalty": self.length_penalty,
            "include_stop_str_in_output": self.include_stop_str_in_output,
        }


def _refused(param: str, why: str) -> ValueError:
    from infer.errors import RequestError

    return RequestError(f"`{param}`: {why}", 400, param)


