"""Batch inference over a Ray Dataset, as ``ray.data.llm`` offers for vLLM:

    from infer.ray.data import InferProcessorConfig, build_llm_processor
    config = InferProcessorConfig(model_source="model.gguf", concurrency=2, batch_size=16)
    processor = build_llm_processor(
        config,
        preprocess=lambda row: {"prompt": row["question"],
                                "sampling_params": {"temperature": 0, "max_tokens": 32}},
        postprocess=lambda row: {"question": row["question"], "answer": row["generated_text"]})
    ds = processor(ray.data.from_items([...]))

Each of ``concurrency`` actors holds one ``LLM`` and runs its batches through it.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from infer.llm import LLM
from infer.sampling_params import SamplingParams


@dataclass
class InferProcessorConfig:
    model_source: str
    engine_kwargs: Dict[str, Any] = field(default_factory=dict)
    concurrency: int = 1
    batch_size: int = 64
    # Per actor (`num_gpus=1` with `engine_kwargs={"backend": "cuda"}`).
    num_gpus: float = 0
    num_cpus: Optional[float] = None


class InferPredictor:
    """A Ray Data actor: one engine, each batch's rows through ``LLM.generate`` or ``chat``."""

    def __init__(self, model: str, engine_kwargs: Dict[str, Any]):
        self.llm = LLM(model, **engine_kwargs)

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
        rows = _rows(batch)
        texts: List[Any] = [None] * len(rows)
        for kind in ("prompt", "messages"):
            picked = [i for i, r in enumerate(rows) if kind in r and r[kind] is not None]
            if not picked:
                continue
            params = [SamplingParams(**(rows[i].get("sampling_params") or {})) for i in picked]
            if kind == "prompt":
                outs = self.llm.generate([_prompt(rows[i]["prompt"]) for i in picked], params, use_tqdm=False)
            else:
                outs = self.llm.chat([list(rows[i]["messages"]) for i in picked], params, use_tqdm=False)
            for i, out in zip(picked, outs):
                texts[i] = out
        if any(t is None for t in texts):
            raise ValueError("every row needs `prompt` (text or token ids) or `messages`")
        batch = dict(batch)
        batch["generated_text"] = [o.outputs[0].text for o in texts]
        batch["generated_tokens"] = [list(o.outputs[0].token_ids) for o in texts]
        batch["num_generated_tokens"] = [len(o.outputs[0].token_ids) for o in texts]
        batch["num_input_tokens"] = [len(o.prompt_token_ids) for o in texts]
        batch.pop("sampling_params", None)
        return batch


def _prompt(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [int(t) for t in value]
    return value


def _rows(batch: Dict[str, np.ndarray]) -> List[Dict[str, Any]]:
    n = len(next(iter(batch.values()))) if batch else 0
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def build_llm_processor(config: InferProcessorConfig,
                        preprocess: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
                        postprocess: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None):
    """A function from a Dataset to its rows with ``generated_text`` (and token counts): rows
    through ``preprocess`` (to ``prompt`` or ``messages`` plus ``sampling_params``), batches
    through ``config.concurrency`` engine actors, rows through ``postprocess``."""

    def process(ds):
        if preprocess is not None:
            ds = ds.map(preprocess)
        resources: Dict[str, Any] = {"num_gpus": config.num_gpus}
        if config.num_cpus is not None:
            resources["num_cpus"] = config.num_cpus
        ds = ds.map_batches(InferPredictor, fn_constructor_kwargs={
            "model": config.model_source, "engine_kwargs": config.engine_kwargs,
        }, concurrency=config.concurrency, batch_size=config.batch_size, **resources)
        if postprocess is not None:
            ds = ds.map(postprocess)
        return ds

    return process
