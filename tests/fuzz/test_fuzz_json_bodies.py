"""Fuzzing the request decoders without a model: the body's bytes (decode_json_body), then every
endpoint's schema and checks (parse_body, each API's parse and translate, the LoRA choice) on
mutated valid bodies. The only exception allowed out is ApiError with a 4xx status, and its
error body must encode in both error shapes (the reference's and Anthropic's)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from edgeserve.api.anthropic_messages import routes as anthropic_messages
from edgeserve.api.anthropic_messages.routes import anthropic_error_body
from edgeserve.api.anthropic_messages.translate import (
    parse_count_tokens_request,
    prepare_count_tokens,
)
from edgeserve.api.common.adapters import chosen_adapters
from edgeserve.api.embeddings.translate import parse_embedding_request, prepare_embeddings
from edgeserve.api.lora_adapters.wire import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from edgeserve.api.openai_chat import routes as openai_chat
from edgeserve.api.openai_completions import routes as openai_completions
from edgeserve.api.openai_responses import routes as openai_responses
from edgeserve.api.reference.errors import error_body
from edgeserve.api.reference.limits import Limits
from edgeserve.api.reference.request import decode_json_body, parse_body
from edgeserve.api.score.translate import parse_score_request, prepare_score
from edgeserve.api.tokenize.translate import (
    parse_detokenize_request,
    parse_tokenize_request,
    prepare_tokenize,
)
from edgeserve.engine.adapters import AdapterCatalog
from edgeserve.errors import ApiError
from tests.fuzz.bodies import BODIES
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.json_strategies import corrupted, mutated, pick, to_json

Check = Callable[[Any, Limits], Awaitable[object]]

CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "application/json; charset=latin-1",
    "application/vnd.api+json",
    "APPLICATION/JSON",
    "application/json;;;",
    'application/json; a="',
    "application/",
    "text/plain",
    "multipart/form-data; boundary=x",
    "",
    "\x00",
    "application/\udcff",
    None,
]


def _generating(route: Any) -> Check:
    api = route.endpoint

    async def check(body: Any, limits: Limits) -> object:
        return await api.translate(api.parse(body, limits), limits)

    return check


async def _embeddings(body: Any, limits: Limits) -> object:
    return prepare_embeddings(parse_embedding_request(body), limits, 640)


async def _score(body: Any, limits: Limits) -> object:
    return prepare_score(parse_score_request(body), limits)


async def _tokenize(body: Any, limits: Limits) -> object:
    return prepare_tokenize(parse_tokenize_request(body))


async def _detokenize(body: Any, limits: Limits) -> object:
    return parse_detokenize_request(body)


async def _count_tokens(body: Any, limits: Limits) -> object:
    return await prepare_count_tokens(parse_count_tokens_request(body), limits)


async def _load_lora(body: Any, limits: Limits) -> object:
    return parse_body(LoadLoraAdapterRequest, body)


async def _unload_lora(body: Any, limits: Limits) -> object:
    return parse_body(UnloadLoraAdapterRequest, body)


CHECKS: dict[str, Check] = {
    "/v1/chat/completions": _generating(openai_chat.ROUTES[0]),
    "/v1/completions": _generating(openai_completions.ROUTES[0]),
    "/v1/responses": _generating(openai_responses.ROUTES[0]),
    "/v1/messages": _generating(anthropic_messages.ROUTES[0]),
    "/v1/messages/count_tokens": _count_tokens,
    "/v1/embeddings": _embeddings,
    "/v1/score/evaluation": _score,
    "/tokenize": _tokenize,
    "/detokenize": _detokenize,
    "/v1/load_lora_adapter": _load_lora,
    "/v1/unload_lora_adapter": _unload_lora,
}


@pytest.fixture(scope="module", autouse=True)
def no_name_lookups() -> Iterator[None]:
    """Every host name is unknown (the media URL checks resolve hosts; nothing here may reach
    a DNS server); IP literals resolve as usual."""
    real = socket.getaddrinfo

    def offline(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and (host.replace(".", "").isdigit() or ":" in host):
            return real(host, *args, **kwargs)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    socket.getaddrinfo = offline
    yield
    socket.getaddrinfo = real


def assert_client_error(err: ApiError) -> None:
    """A 4xx whose body encodes in both error shapes."""
    assert 400 <= err.status < 500, err
    error_body(err.detail, with_message=True).decode()
    error_body(err.detail, with_message=False).decode()
    anthropic_error_body(err)[1].decode()


def limits_for(images: bool, safe_media_path: str) -> Limits:
    return Limits(
        max_n=2,
        max_tokens=64,
        safe_media_path=safe_media_path,
        media_kinds=frozenset({"image"}) if images else frozenset(),
    )


def run_checks(path: str, body: Any, limits: Limits) -> None:
    """The endpoint's checks on `body`, then its LoRA choice; a 4xx ApiError is fine."""
    try:
        asyncio.run(CHECKS[path](body, limits))
        chosen_adapters(body, AdapterCatalog())
    except ApiError as err:
        assert_client_error(err)


@fuzz_settings(400)
@given(
    raw=st.one_of(
        st.binary(max_size=64),
        pick([doc for bodies in BODIES.values() for doc in bodies])
        .map(lambda doc: to_json(doc).encode())
        .flatmap(corrupted),
        pick([b"NaN", b"1" * 5000, b"[" * 100_000, b'"\\ud800"', b"\xff\xfe{}"]),
    ),
    content_type=st.sampled_from(CONTENT_TYPES),
)
@example(raw=b"[" * 100_000, content_type="application/json")
@example(raw=b"1" * 5000, content_type="application/json")
def test_body_bytes_decode_or_get_a_client_error(raw: bytes, content_type: str | None) -> None:
    try:
        decode_json_body(raw, content_type)
    except ApiError as err:
        assert_client_error(err)


@fuzz_settings(150)
@given(data=st.data(), path=st.sampled_from(sorted(BODIES)), images=st.booleans())
def test_mutated_bodies_pass_or_get_a_client_error(data, path, images, tmp_path_factory) -> None:
    raw = to_json(data.draw(mutated(BODIES[path]), label="body")).encode()
    safe = tmp_path_factory.getbasetemp() / "safe_media"
    try:
        body = decode_json_body(raw, "application/json")
    except ApiError as err:
        assert_client_error(err)
        return
    run_checks(path, body, limits_for(images, str(safe)))


@pytest.mark.parametrize("path", sorted(BODIES))
def test_every_seed_body_is_valid(path, tmp_path) -> None:
    """The seeds pass every check (else the mutations start from refusals): with a model
    that takes images, none is refused."""
    limits = limits_for(True, str(tmp_path))
    for body in BODIES[path]:
        asyncio.run(CHECKS[path](body, limits))
