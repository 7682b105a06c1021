"""Tokenizer endpoint wire types: vLLM's `/tokenize`, `/detokenize` and `/tokenizer_info`
(what lm-evaluation-harness's remote tokenizer reads), with llama-server's field names
accepted beside vLLM's."""

from __future__ import annotations

from edgeserve.api.common.wire import ProtocolModel


class TokenizeRequest(ProtocolModel):
    """POST /tokenize: vLLM's `prompt` and `add_special_tokens`, or llama-server's `content`,
    `add_special` and `parse_special`."""

    model: str | None = None
    prompt: str | None = None
    content: str | None = None
    add_special_tokens: bool | None = None
    add_special: bool | None = None
    parse_special: bool = True


class TokenizeResponse(ProtocolModel):
    """The token ids, their count and the context size (vLLM's shape; llama-server's reads
    `tokens`)."""

    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeRequest(ProtocolModel):
    """POST /detokenize: the token ids to turn into text."""

    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(ProtocolModel):
    """The text, as vLLM (`prompt`) and llama-server (`content`) name it."""

    prompt: str
    content: str


class TokenizerInfoResponse(ProtocolModel):
    """GET /tokenizer_info: the tokenizer_config.json-style fields vLLM answers with."""

    tokenizer_class: str
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    add_bos_token: bool
    add_eos_token: bool
    model_max_length: int
    vocab_size: int
    chat_template: str
    input_modalities: list[str]
