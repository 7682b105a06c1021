"""The chat page's files (edgeserve/http/webui/) and how they are served: each file the page
loads is shipped, nothing comes from another origin or runs inline, model and user text never
reach an HTML parser, and ETags answer a browser's revalidation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request

from edgeserve.http import chat_page

WEBUI = Path(chat_page.__file__).parent / "webui"
ASSETS = chat_page.load_assets()
INDEX = ASSETS["index.html"].body.decode()
SCRIPTS = {name: asset.body.decode() for name, asset in ASSETS.items() if name.endswith(".js")}


def test_every_file_of_the_folder_is_served_with_its_type():
    assert sorted(ASSETS) == sorted(path.name for path in WEBUI.iterdir())
    types = {name: asset.content_type for name, asset in ASSETS.items()}
    assert types["index.html"] == "text/html; charset=utf-8"
    assert types["style.css"] == "text/css; charset=utf-8"
    assert types["icon.svg"] == "image/svg+xml"
    assert {types[name] for name in SCRIPTS} == {"text/javascript; charset=utf-8"}


def test_what_the_page_loads_is_shipped_and_relative():
    linked = re.findall(r'(?:src|href)="([^"]+)"', INDEX)
    imported = [m for text in SCRIPTS.values() for m in re.findall(r'from "\./([^"]+)"', text)]
    assert linked and imported
    for url in linked:
        assert url.startswith("webui/") and url.removeprefix("webui/") in ASSETS, url
    assert set(imported) <= set(SCRIPTS)
    assert set(SCRIPTS) == {"app.js", *imported}


def test_nothing_inline_and_no_other_origin():
    assert re.findall(r"<script\b[^>]*>", INDEX) == ['<script type="module" src="webui/app.js">']
    assert "<style" not in INDEX
    assert not re.search(r"\s(on[a-z]+|style)=", INDEX)
    for name, asset in ASSETS.items():
        urls = re.findall(rb"(?:https?:)?//[\w.-]+", asset.body)
        assert urls in ([], [b"http://www.w3.org"]), (name, urls)  # the SVG namespace only


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_scripts_never_parse_html_or_evaluate_text(name):
    forbidden = (
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|createContextualFragment"
        r"|DOMParser|\beval\(|new Function"
    )
    assert not re.search(forbidden, SCRIPTS[name])


def test_the_policy_allows_this_origin_only_and_no_framing():
    policy = dict(part.split(" ", 1) for part in chat_page.CONTENT_SECURITY_POLICY.split("; "))
    assert policy == {
        "default-src": "'none'",
        "script-src": "'self'",
        "style-src": "'self'",
        "img-src": "'self' data: blob:",
        "connect-src": "'self'",
        "base-uri": "'none'",
        "form-action": "'none'",
        "frame-ancestors": "'none'",
    }


@pytest.mark.parametrize(
    ("if_none_match", "current"),
    [
        pytest.param(None, False, id="none"),
        pytest.param('"{tag}"', True, id="same"),
        pytest.param('W/"{tag}"', True, id="weak"),
        pytest.param('"other", "{tag}"', True, id="in-a-list"),
        pytest.param("*", True, id="any"),
        pytest.param('"other"', False, id="other"),
    ],
)
def test_etag_revalidation(if_none_match, current):
    asset = chat_page.Asset.of("app.js", b"export {};")
    assert asset.headers()["ETag"] == f'"{asset.digest}"'
    sent = if_none_match and if_none_match.format(tag=asset.digest)
    headers = {"If-None-Match": sent} if sent else {}
    assert asset.current(make_mocked_request("GET", "/webui/app.js", headers=headers)) is current


def test_a_changed_file_gets_another_etag():
    assert chat_page.Asset.of("a.css", b"a{}").digest != chat_page.Asset.of("a.css", b"b{}").digest
