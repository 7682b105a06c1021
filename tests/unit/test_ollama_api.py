"""Ollama's API without a model: its options as sampling (Ollama's defaults and type errors),
its model names (`:latest`, the 404), requests as engine work (system messages, calls, images,
`think`, `format`, an empty request), its NDJSON objects as the `ollama` library reads them
and its error bodies. The real model's side is tests/sdk/test_ollama_sdk.py."""

from __future__ import annotations

import base64
import json

import ollama
import pytest

from edgeserve.api.common.call import RequestRecord
from edgeserve.api.common.generating_api import ChoiceAnswer, ChoiceEnd, TokenUsage
from edgeserve.api.common.tool_calls import ToolCall
from edgeserve.api.common.tool_stream import CallArguments, CallStart, Content
from edgeserve.api.ollama.names import listed_name, served_name
from edgeserve.api.ollama.options import read_options
from edgeserve.api.ollama.render import OllamaRenderer
from edgeserve.api.ollama.routes import OllamaApi, ollama_error_body, only_unloads
from edgeserve.api.ollama.translate import prepare_chat, prepare_generate
from edgeserve.api.ollama.wire import ChatRequest, GenerateRequest
from edgeserve.api.reference.limits import Limits
from edgeserve.engine.types import MEDIA_MARKER, ChatPrompt, Finished
from edgeserve.errors import ApiError

LIMITS = Limits()
IMAGES = Limits(media_kinds=frozenset({"image"}))
PNG = base64.b64encode(b"\x89PNG fake").decode()


def refused(call, *args, status: int = 400) -> str:
    with pytest.raises(ApiError) as raised:
        call(*args)
    assert raised.value.status == status
    return raised.value.detail


async def refused_async(work, status: int = 400) -> str:
    with pytest.raises(ApiError) as raised:
        await work
    assert raised.value.status == status
    return raised.value.detail


def test_options_take_ollama_s_defaults_and_map_each_value():
    default = read_options(None, LIMITS)
    assert (default.temperature, default.top_k, default.top_p) == (0.8, 40, 0.9)
    assert default.max_tokens is None and default.seed is None and default.repeat_penalty == 1.0
    given = {
        "temperature": 0,
        "top_k": 5,
        "top_p": 0.5,
        "min_p": 0.1,
        "seed": 7,
        "num_predict": 12,
        "stop": ["\n"],
        "repeat_penalty": 1.3,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "num_thread": 3,  # ignored, as Ollama ignores what it has no use for
    }
    params = read_options(given, LIMITS)
    assert params.greedy and (params.top_k, params.top_p, params.min_p) == (5, 0.5, 0.1)
    assert (params.seed, params.max_tokens, params.stop) == (7, 12, ("\n",))
    assert (params.repeat_penalty, params.presence_penalty, params.frequency_penalty) == (
        1.3,
        0.5,
        -0.5,
    )


def test_num_predict_and_seed_keep_ollama_s_meanings():
    for unlimited in (-1, -2, 0):
        assert read_options({"num_predict": unlimited}, LIMITS).max_tokens is None
    assert read_options({"seed": -1}, LIMITS).seed is None
    assert read_options({"num_predict": 3.0}, LIMITS).max_tokens == 3


def test_options_of_the_wrong_type_are_ollama_s_400():
    assert refused(read_options, {"temperature": "hot"}, LIMITS) == (
        'option "temperature" must be of type float32'
    )
    assert refused(read_options, {"top_k": 1.5}, LIMITS) == 'option "top_k" must be of type integer'
    assert refused(read_options, {"stop": "\n"}, LIMITS) == 'option "stop" must be of type array'
    assert "top_p" in refused(read_options, {"top_p": 2}, LIMITS)
    assert "num_ctx" in refused(read_options, {"num_ctx": 0}, LIMITS)


def test_num_ctx_of_any_size_is_taken_and_changes_nothing():
    plain = read_options({}, LIMITS)
    for num_ctx in (1, 2048, 1_000_000):  # clients send the GGUF's training context
        assert read_options({"num_ctx": num_ctx}, LIMITS) == plain


def test_model_names_are_checked_and_latest_names_the_untagged_model():
    served = ["gemma", "smol:135m"]
    assert served_name("gemma", served) == "gemma"
    assert served_name("gemma:latest", served) == "gemma"
    assert served_name("smol:135m", served) == "smol:135m"
    assert refused(served_name, "llama3", served, status=404) == "model 'llama3' not found"
    assert refused(served_name, "smol", served, status=404) == "model 'smol' not found"
    assert refused(served_name, None, served) == "model is required"
    assert listed_name("gemma") == "gemma:latest" and listed_name("smol:135m") == "smol:135m"


async def test_a_chat_becomes_turns_with_system_calls_results_and_images():
    req = ChatRequest(
        model="m",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?", "images": [PNG]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "w", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": "sunny", "tool_name": "w"},
            {"role": "system", "content": "Answer in French."},
        ],
        tools=[{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
    )
    work = await prepare_chat(req, IMAGES)
    prompt = work.request.prompt
    assert isinstance(prompt, ChatPrompt) and work.tools
    assert prompt.system == "Be brief.\n\nAnswer in French."
    roles = [(turn.role, turn.content) for turn in prompt.messages]
    calls = json.dumps([{"name": "w", "arguments": json.dumps({"city": "Paris"})}])
    assert roles == [
        ("user", MEDIA_MARKER + "Weather?"),
        ("function", calls),
        ("tool", "sunny"),
    ]
    assert prompt.messages[0].media[0].data == b"\x89PNG fake"
    assert json.loads(prompt.tools)[0]["name"] == "w"


async def test_chat_checks_say_what_is_wrong():
    ask = [{"role": "user", "content": "hi"}]
    think = ChatRequest(model="m", messages=ask, think=True)
    assert await refused_async(prepare_chat(think, LIMITS)) == '"m" does not support thinking'
    assert (await prepare_chat(ChatRequest(model="m", messages=ask, think=False), LIMITS)).request
    text_only = ChatRequest(model="m", messages=[{"role": "user", "content": "?", "images": [PNG]}])
    assert "images" in await refused_async(prepare_chat(text_only, LIMITS))
    bad_image = ChatRequest(model="m", messages=[{"role": "user", "images": ["%%%"]}])
    assert "base64" in await refused_async(prepare_chat(bad_image, IMAGES))
    yaml = ChatRequest(model="m", messages=ask, format="yaml")
    assert await refused_async(prepare_chat(yaml, LIMITS)) == (
        'invalid format: "yaml"; expected "json" or a valid JSON Schema object'
    )
    only_system = ChatRequest(model="m", messages=[{"role": "system", "content": "x"}])
    assert "user message" in await refused_async(prepare_chat(only_system, LIMITS))


async def test_format_is_the_answer_s_grammar():
    ask = [{"role": "user", "content": "hi"}]
    json_any = await prepare_chat(ChatRequest(model="m", messages=ask, format="json"), LIMITS)
    assert json_any.request.params.grammar.kind == "json_object"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    shaped = await prepare_chat(ChatRequest(model="m", messages=ask, format=schema), LIMITS)
    assert shaped.request.params.grammar.kind == "gbnf" and '"\\"a\\""' in (
        shaped.request.params.grammar.text
    )
    plain = await prepare_chat(ChatRequest(model="m", messages=ask), LIMITS)
    assert plain.request.params.grammar is None


async def test_generate_renders_a_user_turn_or_a_raw_prompt_and_refuses_what_it_cannot_do():
    work = await prepare_generate(GenerateRequest(model="m", prompt="Hi", system="S"), LIMITS)
    assert work.request.prompt == ChatPrompt(work.request.prompt.messages, "S")
    assert [(t.role, t.content) for t in work.request.prompt.messages] == [("user", "Hi")]
    raw = await prepare_generate(GenerateRequest(model="m", prompt="Hi", raw=True), LIMITS)
    assert raw.request.prompt == "Hi"
    for fields, said in (
        ({"suffix": "end"}, "fill-in-the-middle"),
        ({"template": "{{ .Prompt }}"}, "chat template"),
        ({"context": [1, 2]}, "/api/chat"),
        ({"raw": True, "system": "S"}, '"raw"'),
    ):
        req = GenerateRequest(model="m", prompt="Hi", **fields)
        assert said in await refused_async(prepare_generate(req, LIMITS))


async def test_an_empty_request_only_loads_or_unloads():
    api = OllamaApi("generate")
    loads = await api.translate(GenerateRequest(model="m", stream=True), LIMITS)
    assert loads.requests == () and loads.idle == "load" and not loads.stream
    unloads = await api.translate(GenerateRequest(model="m", keep_alive=0), LIMITS)
    assert unloads.requests == () and unloads.idle == "unload"
    chat = await OllamaApi("chat").translate(ChatRequest(model="m", keep_alive="0s"), LIMITS)
    assert chat.requests == () and chat.idle == "unload"


def finished(reason: str = "stop", tokens: int = 3) -> Finished:
    return Finished(0, reason, tokens, prompt_s=0.25, decode_s=0.5)  # type: ignore[arg-type]


def renderer(kind: str = "chat", idle: str | None = None) -> OllamaRenderer:
    record = RequestRecord("r")
    record.load_s = 0.125
    return OllamaRenderer(kind, "gemma:latest", record, 11, idle)  # type: ignore[arg-type]


def test_a_streamed_chat_is_ndjson_the_library_reads_calls_included():
    render = renderer()
    lines = render.start()
    lines += render.pieces(0, [Content("Hel"), Content("lo")], None)
    lines += render.pieces(
        0, [CallStart(0, "w"), CallArguments(0, '{"city": '), CallArguments(0, '"Paris"}')], None
    )
    lines += render.finish(ChoiceEnd(finished(), True, None), TokenUsage())
    lines += render.end(TokenUsage())
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines)
    parts = [ollama.ChatResponse.model_validate_json(line) for line in lines]
    assert [part.message.content for part in parts] == ["Hel", "lo", "", ""]
    assert [part.done for part in parts] == [False, False, False, True]
    [call] = parts[2].message.tool_calls
    assert call.function.name == "w" and call.function.arguments == {"city": "Paris"}
    done = parts[-1]
    assert done.done_reason == "stop" and done.model == "gemma:latest"
    assert (done.prompt_eval_count, done.eval_count) == (11, 3)
    assert (done.load_duration, done.prompt_eval_duration, done.eval_duration) == (
        125_000_000,
        250_000_000,
        500_000_000,
    )
    assert done.total_duration > 0 and done.created_at.endswith("Z")


def test_whole_answers_are_one_object():
    calls = [ToolCall("w", '{"city": "Paris"}')]
    answer = ChoiceAnswer("ignored", "stop", finished(), calls)
    reply = ollama.ChatResponse.model_validate_json(renderer().body([answer], TokenUsage()))
    assert reply.message.content == "" and reply.message.tool_calls[0].function.name == "w"
    text = ChoiceAnswer("Hello", "length", finished("length"), None)
    made = renderer("generate").body([text], TokenUsage())
    reply = ollama.GenerateResponse.model_validate_json(made)
    assert reply.response == "Hello" and reply.done_reason == "length" and reply.done


def test_an_empty_request_answers_load_or_unload():
    for idle in ("load", "unload"):
        whole = ollama.GenerateResponse.model_validate_json(
            renderer("generate", idle).body([], TokenUsage())
        )
        assert whole.done and whole.done_reason == idle and whole.response == ""
        chat = renderer("chat", idle).body([], TokenUsage())
        assert ollama.ChatResponse.model_validate_json(chat).message.content == ""


def test_errors_are_ollama_s_shape():
    status, body = ollama_error_body(ApiError(404, "model 'x' not found"))
    assert (status, json.loads(body)) == (404, {"error": "model 'x' not found"})
    schema_error = [{"type": "missing", "loc": ["body", "model"], "msg": "Field required"}]
    status, body = ollama_error_body(ApiError(422, schema_error))
    assert (status, json.loads(body)) == (400, {"error": "body.model: Field required"})
    [line] = renderer().failure(ApiError(504, "too slow"))
    assert json.loads(line) == {"error": "too slow"}


@pytest.mark.parametrize(
    ("body", "unloads"),
    [
        ({"model": "m", "keep_alive": 0}, True),
        ({"model": "m", "keep_alive": "0s", "prompt": "", "messages": []}, True),
        ({"model": "m", "keep_alive": "-0"}, True),
        ({"model": "m", "keep_alive": 0, "prompt": "Hi"}, False),
        ({"model": "m", "keep_alive": 0, "messages": [{"role": "user", "content": "Hi"}]}, False),
        ({"model": "m", "keep_alive": 0, "images": ["aGk="]}, False),
        ({"model": "m"}, False),
        ({"model": "m", "keep_alive": None}, False),
        ({"model": "m", "keep_alive": True}, False),
        ({"model": "m", "keep_alive": [0]}, False),
        ({"model": "m", "keep_alive": "NaN"}, False),
        ({"model": "m", "keep_alive": "0x0"}, False),
        ({"model": "m", "keep_alive": "5m"}, False),
        ({"model": "m", "keep_alive": -1}, False),
        ([{"keep_alive": 0}], False),
        ("keep_alive=0", False),
    ],
)
def test_only_a_body_with_nothing_to_run_and_keep_alive_zero_skips_the_load(body, unloads):
    # Anything else (odd types, a prompt, a keep-alive that is not 0) takes the normal path,
    # where the request's own checks answer it.
    assert only_unloads(body) is unloads
