"""vLLM's ``RequestOutput`` and ``CompletionOutput``, built from the engine's events."""

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Union

from infer.sampling_params import RequestOutputKind


@dataclass
class Logprob:
    """A token's log-probability; ``rank`` is 1 + how many tokens were more likely."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# Per position: token id -> Logprob (the chosen token and the most likely alternatives).
SampleLogprobs = List[Dict[int, Logprob]]
PromptLogprobs = List[Optional[Dict[int, Logprob]]]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Seconds from the request's arrival to each event, and its token counts."""

    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    finished_time: Optional[float] = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_preemptions: int = 0
    num_cached_tokens: Optional[int] = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    prompt_logprobs: Optional[PromptLogprobs]
    outputs: List[CompletionOutput]
    finished: bool
    metrics: Optional[RequestMetrics] = None
    num_cached_tokens: Optional[int] = None


@dataclass
class BeamSearchSequence:
    tokens: List[int]
    text: str
    cum_logprob: float
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None


@dataclass
class BeamSearchOutput:
    sequences: List[BeamSearchSequence] = field(default_factory=list)


def _logprobs(entry: Dict[str, Any], name: Callable[[int], str]) -> Dict[int, Logprob]:
    out = {entry["token_id"]: Logprob(entry["logprob"], entry.get("rank"), name(entry["token_id"]))}
    ranked = sorted(entry.get("top_logprobs", []), key=lambda t: -t["logprob"])
    for i, top in enumerate(ranked):
        tid = top["token_id"]
        if tid in out:
            out[tid].rank = out[tid].rank or i + 1
        else:
            out[tid] = Logprob(top["logprob"], i + 1, name(tid))
    if out[entry["token_id"]].rank is None:
        # The chosen token's rank among the alternatives shown (1 + those more likely).
        better = sum(1 for t in ranked if t["logprob"] > entry["logprob"])
        out[entry["token_id"]].rank = better + 1
    return out


class OutputBuilder:
    """Turns one request's engine events into ``RequestOutput``s of the asked kind."""

    def __init__(self, prompt: Optional[str], prompt_token_ids: List[int], n: int,
                 kind: RequestOutputKind, detokenize: bool, want_logprobs: bool,
                 token_name: Callable[[int], str]):
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.kind = kind
        self.detokenize = detokenize
        self.want_logprobs = want_logprobs
        self.name = token_name
        self.seqs = [CompletionOutput(i, "", [], None, [] if want_logprobs else None) for i in range(n)]
        self.sent = [(0, 0, 0) for _ in range(n)]  # text, tokens, logprobs already given (DELTA)

    def push(self, event_json: str) -> Optional[RequestOutput]:
        """The output to hand the caller for this event (``None``: nothing for this kind)."""
        event = json.loads(event_json)
        for d in event["deltas"]:
            seq = self.seqs[d["index"]]
            seq.text += d["text_delta"]
            seq.token_ids.extend(d["new_token_ids"])
            if self.want_logprobs:
                for entry in d["logprobs"]:
                    seq.logprobs.append(_logprobs(entry, self.name))
                    seq.cumulative_logprob = (seq.cumulative_logprob or 0.0) + entry["logprob"]
            seq.finish_reason = d["finish_reason"] or seq.finish_reason
            seq.stop_reason = d["stop_reason"] if d["stop_reason"] is not None else seq.stop_reason
        finished = event["outputs"] is not None
        if finished:
            self.seqs = [self._final(o) for o in event["outputs"]]
        elif self.kind == RequestOutputKind.FINAL_ONLY:
            return None
        metrics = RequestMetrics(**event["metrics"])
        prompt_logprobs = None
        if event.get("prompt_logprobs") is not None:
            prompt_logprobs = [None if e is None else _logprobs(e, self.name) for e in event["prompt_logprobs"]]
        outputs = self.seqs if self.kind != RequestOutputKind.DELTA else self._deltas()
        if not self.detokenize:
            outputs = [CompletionOutput(o.index, "", o.token_ids, o.cumulative_logprob, o.logprobs,
                                        o.finish_reason, o.stop_reason) for o in outputs]
        return RequestOutput(
            request_id=event["request_id"], prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=prompt_logprobs, outputs=[_copy(o) for o in outputs], finished=finished,
            metrics=metrics, num_cached_tokens=metrics.num_cached_tokens)

    def _final(self, o: Dict[str, Any]) -> CompletionOutput:
        logprobs = None
        if o.get("logprobs") is not None:
            logprobs = [_logprobs(e, self.name) for e in o["logprobs"]]
        return CompletionOutput(o["index"], o["text"], o["token_ids"], o.get("cumulative_logprob"),
                                logprobs if self.want_logprobs else None, o["finish_reason"],
                                o.get("stop_reason"))

    def _deltas(self) -> List[CompletionOutput]:
        """Each sequence's text, tokens and logprobs not handed out yet."""
        out = []
        for i, seq in enumerate(self.seqs):
            t, k, lp = self.sent[i]
            new_lp = None if seq.logprobs is None else seq.logprobs[lp:]
            out.append(CompletionOutput(seq.index, seq.text[t:], seq.token_ids[k:], seq.cumulative_logprob,
                                        new_lp, seq.finish_reason, seq.stop_reason))
            self.sent[i] = (len(seq.text), len(seq.token_ids), len(seq.logprobs or []))
        return out


def _copy(o: CompletionOutput) -> CompletionOutput:
    return CompletionOutput(o.index, o.text, list(o.token_ids), o.cumulative_logprob,
                            None if o.logprobs is None else list(o.logprobs), o.finish_reason, o.stop_reason)
