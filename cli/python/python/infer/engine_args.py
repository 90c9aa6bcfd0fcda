"""Engine settings as vLLM's ``LLM(...)`` / ``AsyncEngineArgs`` take them, turned into the flags
of ``infer serve`` (the same names with dashes), so every setting is checked, honoured or
refused exactly as the server does it."""

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


def to_flags(model: str, kwargs: Dict[str, Any]) -> List[str]:
    """``infer serve`` arguments for ``model`` and vLLM-style keyword settings.

    ``True`` becomes a bare flag, ``False`` and ``None`` leave the flag out (the default), a
    list gives several values and a dict its JSON (``speculative_config``).
    """
    args = ["--model", model]
    for key, value in kwargs.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)):
            args.append(flag)
            args.extend(str(v) for v in value)
        elif isinstance(value, dict):
            args.extend([flag, json.dumps(value)])
        else:
            args.extend([flag, str(value)])
    return args


@dataclass
class EngineArgs:
    """vLLM's ``EngineArgs``: ``model`` and any ``infer serve`` setting by its Python name."""

    model: str
    extra: Dict[str, Any] = field(default_factory=dict)

    def __init__(self, model: str, **kwargs: Any):
        self.model = model
        self.extra = kwargs

    def flags(self) -> List[str]:
        return to_flags(self.model, self.extra)


AsyncEngineArgs = EngineArgs


def engine_kwargs(tokenizer: Optional[str], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``LLM``'s keywords as engine settings (``tokenizer`` is a flag of its own)."""
    out = dict(kwargs)
    if tokenizer is not None:
        out["tokenizer"] = tokenizer
    return out
