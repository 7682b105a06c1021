"""Valid request bodies of every endpoint that reads one: the seeds the fuzzing mutates.

Together they use every feature of each wire model (tools and tool choices, response formats
and JSON schemas, media, log-probabilities, LoRA choices, streaming), and every generating one
asks for at most a few tokens, so that a mutation that keeps the body valid costs little."""

from __future__ import annotations

from typing import Any

from tests.fuzz.sample_images import png_data_url

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"enum": ["c", "f"]},
        "days": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 2},
    },
    "required": ["city"],
    "additionalProperties": False,
}
SCHEMAS: list[dict[str, Any]] = [
    WEATHER,
    {"type": "object"},
    {"type": "string", "pattern": "^[a-c]{1,3}$"},
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
    {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    {"oneOf": [{"const": "x"}, {"enum": [1, 2.5, True, None]}]},
    {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/a"}},
        "$defs": {"a": {"type": "boolean"}},
    },
    {"type": "string", "format": "date-time"},
    {"type": "integer", "minimum": -3, "maximum": 40, "exclusiveMaximum": 41},
    {"allOf": [{"type": "object", "properties": {"x": {"type": "string"}}}]},
    {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1},
]
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "w", "parameters": WEATHER},
}
USER = {"role": "user", "content": "hi"}


def _chat() -> list[dict[str, Any]]:
    base = {"model": "gemma-test", "messages": [USER], "max_tokens": 2}
    return [
        base,
        {**base, "stream": True, "stream_options": {"include_usage": True}},
        {
            **base,
            "messages": [
                {"role": "system", "content": "be brief"},
                USER,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "x"}'},
                        }
                    ],
                },
                {"role": "tool", "content": "sunny"},
            ],
            "tools": [TOOL],
            "tool_choice": "auto",
        },
        {**base, "tools": [TOOL], "tool_choice": "required", "max_tokens": 4},
        {
            **base,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        {**base, "response_format": {"type": "json_object"}},
        {
            **base,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": WEATHER},
            },
        },
        {
            **base,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 40,
            "min_p": 0.05,
            "seed": 3,
            "n": 2,
            "presence_penalty": 0.1,
            "frequency_penalty": 0.1,
            "repetition_penalty": 1.1,
            "logit_bias": {"5": -100, "6": 2.5},
            "stop": ["\n", "end"],
            "logprobs": True,
            "top_logprobs": 2,
            "user": "u",
            "do_sample": True,
            "max_completion_tokens": 2,
        },
        {
            **base,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": png_data_url(), "detail": "low"},
                        },
                    ],
                }
            ],
        },
        {**base, "lora": [{"id": 0, "scale": 0.5}]},
    ]


def _completions() -> list[dict[str, Any]]:
    base = {"model": "gemma-test", "prompt": "Once", "max_tokens": 2}
    return [
        base,
        {**base, "prompt": ["a", "b"], "n": 1, "stream": True},
        {**base, "prompt": [2, 1596, 1010]},
        {**base, "prompt": [[2, 1596], [2, 17]]},
        {**base, "echo": True, "logprobs": 2, "max_tokens": 0},
        {**base, "temperature": 0, "stop": "x", "seed": 1, "logit_bias": {"10": 1}, "best_of": 1},
        {**base, "suffix": "", "stream_options": {"include_usage": True}, "stream": True},
    ]


def _responses() -> list[dict[str, Any]]:
    base = {"model": "gemma-test", "input": "hi", "max_output_tokens": 2}
    return [
        base,
        {**base, "instructions": "brief", "stream": True, "temperature": 0.5, "top_p": 0.9},
        {
            **base,
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look"},
                        {"type": "input_image", "image_url": png_data_url()},
                    ],
                },
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": "{}",
                },
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "and?"},
            ],
        },
        {
            **base,
            "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}],
            "tool_choice": "required",
        },
        {
            **base,
            "tools": [{"type": "function", "name": "f"}],
            "tool_choice": {"type": "function", "name": "f"},
        },
        {
            **base,
            "text": {
                "format": {"type": "json_schema", "name": "w", "schema": WEATHER, "strict": True}
            },
        },
        {
            **base,
            "text": {"format": {"type": "json_object"}},
            "store": False,
            "metadata": {"k": "v"},
        },
    ]


def _messages() -> list[dict[str, Any]]:
    base = {"model": "gemma-test", "max_tokens": 2, "messages": [USER]}
    tool = {"name": "get_weather", "description": "w", "input_schema": WEATHER}
    return [
        base,
        {**base, "system": "brief", "stream": True, "temperature": 0.5, "top_k": 5, "top_p": 0.9},
        {**base, "system": [{"type": "text", "text": "brief"}], "stop_sequences": ["x"]},
        {
            **base,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": png_data_url().split(",", 1)[1],
                            },
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "s"},
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "get_weather",
                            "input": {"city": "x"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "sunny"}],
                        },
                    ],
                },
            ],
        },
        {**base, "tools": [tool], "tool_choice": {"type": "any"}, "max_tokens": 4},
        {**base, "tools": [tool], "tool_choice": {"type": "tool", "name": "get_weather"}},
        {
            **base,
            "tools": [tool],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        },
    ]


def _count_tokens() -> list[dict[str, Any]]:
    return [
        {key: value for key, value in body.items() if key not in ("max_tokens", "stream")}
        for body in _messages()
    ]


def _embeddings() -> list[dict[str, Any]]:
    return [
        {"model": "gemma-test", "input": "hello"},
        {"input": ["a", "b"], "encoding_format": "base64"},
        {"input": [2, 17, 18], "encoding_format": "float"},
        {"input": [[2, 17], [2, 18]], "dimensions": 640, "user": "u"},
    ]


def _score() -> list[dict[str, Any]]:
    return [
        {"model": "gemma-test", "messages": ["The sky is blue.", "Cats bark."]},
        {
            "model": "m",
            "messages": ["a"],
            "max_length": 8,
            "reduction": "sum",
            "return_token_logprobs": True,
        },
    ]


def _tokenize() -> list[dict[str, Any]]:
    return [
        {"prompt": "hello <start_of_turn>"},
        {"model": "m", "content": "x", "add_special": True, "parse_special": False},
        {"prompt": "y", "add_special_tokens": False},
    ]


def _detokenize() -> list[dict[str, Any]]:
    return [{"tokens": [2, 17, 106]}, {"model": "m", "tokens": []}]


def _lora() -> list[dict[str, Any]]:
    return [
        {"lora_name": "a", "lora_path": "/nonexistent/adapter.gguf"},
        {"lora_name": "b", "lora_path": __file__},
        {"lora_name": "a"},
    ]


BODIES: dict[str, list[dict[str, Any]]] = {
    "/v1/chat/completions": _chat(),
    "/v1/completions": _completions(),
    "/v1/responses": _responses(),
    "/v1/messages": _messages(),
    "/v1/messages/count_tokens": _count_tokens(),
    "/v1/embeddings": _embeddings(),
    "/v1/score/evaluation": _score(),
    "/tokenize": _tokenize(),
    "/detokenize": _detokenize(),
    "/v1/load_lora_adapter": _lora()[:2],
    "/v1/unload_lora_adapter": _lora()[2:],
}
"""Valid bodies by path."""
