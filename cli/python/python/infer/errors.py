"""Exceptions the engine raises, with the messages ``infer serve`` answers with."""

from typing import Optional


class RequestError(ValueError):
    """A request the server would refuse (HTTP 4xx, or 503 when busy).

    ``status`` is the HTTP status the server answers with, ``param`` the request field at
    fault and ``code`` OpenAI's machine-readable code, where one names the case.
    """

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None,
                 code: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code


class EngineError(RuntimeError):
    """The engine could not run the request: it stopped, or a step failed."""


class EngineStartError(ValueError):
    """The engine did not start: a setting it refuses, or a model it cannot load (the message
    says which, as ``infer serve`` would)."""
