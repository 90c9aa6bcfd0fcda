"""The served model's tokenizer, as ``llm.get_tokenizer()`` returns it."""

import functools
import json
from typing import Any, Dict, List, Optional, Union


class Tokenizer:
    """``encode`` / ``decode`` / ``apply_chat_template`` with the model's tokenizer and chat
    template, checked as the server's ``/tokenize`` checks them."""

    def __init__(self, native):
        self._native = native

    @property
    def vocab_size(self) -> int:
        return self._native.vocab_size

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._native.eos_token_id

    @property
    def eos_token(self) -> Optional[str]:
        return self._native.eos_token

    @property
    def bos_token(self) -> Optional[str]:
        return self._native.bos_token

    @property
    def chat_template(self) -> Optional[str]:
        return self._native.chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        return self._native.encode(text, add_special_tokens)

    def decode(self, token_ids: List[int], skip_special_tokens: bool = True) -> str:
        return self._native.decode(list(token_ids), skip_special_tokens)

    def convert_ids_to_tokens(self, token_ids: List[int]) -> List[Optional[str]]:
        return self._native.convert_ids_to_tokens(list(token_ids))

    @functools.lru_cache(maxsize=65536)
    def token_text(self, token_id: int) -> str:
        """One token's text (logprobs' ``decoded_token``)."""
        return self._native.decode([token_id], False)

    def apply_chat_template(self, conversation: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]] = None,
                            add_generation_prompt: bool = True, tokenize: bool = True,
                            continue_final_message: bool = False, **kwargs: Any) -> Union[str, List[int]]:
        """The conversation through the model's chat template: token ids (``tokenize``, the
        default, as transformers) or text. Other keywords are template variables."""
        body: Dict[str, Any] = {"messages": conversation, "add_generation_prompt": add_generation_prompt}
        if tools:
            body["tools"] = tools
        if continue_final_message:
            body["continue_final_message"] = True
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        return self._native.apply_chat_template(json.dumps(body), tokenize)
