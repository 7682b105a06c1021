"""The bench's images workload (bench/images.py): the image, the request, the flag probe, the
figures, its report lines ("n/a" for a baseline without --mmproj), its switches, and the turns
against two fake streaming servers."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from bench import build, images, report
from bench.__main__ import parse_args
from bench.anchors import EDGESERVE, EDGESERVE_BASELINE, LLAMA_SERVER, Setup
from bench.load import Stream
from tests.unit.bench_results import bench_setup, results
from tests.unit.fake_chat_server import streaming_chat_app
from tests.unit.test_bench_report import block, lines_of, row


def test_the_image_is_a_png_of_random_pixels_fixed_by_its_seed():
    png = images.png_bytes(64, 48, 3)
    with Image.open(io.BytesIO(png)) as img:
        assert img.format == "PNG"
        assert (img.size, img.mode) == ((64, 48), "RGB")
        pixels = img.tobytes()
    assert len(set(pixels)) > 200  # random, not a flat colour
    assert images.png_bytes(64, 48, 3) == png
    assert images.png_bytes(64, 48, 4) != png
    # random pixels do not compress: every server decodes the full size
    assert len(images.png_bytes(images.WIDTH, images.HEIGHT, 0)) > 3 * 640 * 480


def test_the_request_carries_the_image_as_a_data_url_then_the_question():
    png = images.png_bytes(8, 8, 0)
    url = images.data_url(png)
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == png
    [message] = images.messages(url)
    assert message["role"] == "user"
    assert message["content"] == [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": images.PROMPT},
    ]


@pytest.mark.parametrize(
    ("help_text", "offered"),
    [
        ("  --mmproj PATH      multimodal projector GGUF of the model", True),
        ("-mm,   --mmproj FILE                    path to a multimodal projector file", True),
        ("-mmu,  --mmproj-url URL   URL to a multimodal projector file", False),
        ("--no-mmproj, --mmproj-offload", False),
        ("  --model PATH\n  --draft-model PATH", False),
        ("", False),
    ],
)
def test_a_server_takes_images_when_its_help_lists_mmproj(help_text: str, offered: bool):
    assert images.offers_mmproj(help_text) is offered


def test_the_help_commands(tmp_path: Path):
    setup = bench_setup(tmp_path)
    assert images.help_command(EDGESERVE, setup) == [".venv/bin/edgeserve", "serve", "--help"]
    assert images.help_command(EDGESERVE_BASELINE, setup)[0] == "/cache/abc/.venv/bin/edgeserve"
    assert images.help_command(LLAMA_SERVER, setup) == [str(tmp_path / "llama-server"), "--help"]
    with pytest.raises(ValueError, match="does not take images"):
        images.help_command("llama_cpp.server", setup)


def test_a_missing_binary_is_a_reason_not_an_error(tmp_path: Path):
    setup = Setup(Path("m"), 1, 64, tmp_path / "nothing", tmp_path, Path("python"), tmp_path)
    assert "--help failed" in (images.missing_mmproj(EDGESERVE, setup) or "")


def test_a_failed_start_in_one_line():
    error = "edgeserve exited with 2:\nloading\nerror: --mmproj x.gguf does not fit the model\n"
    assert images.start_failure(error) == (
        "did not start: edgeserve exited with 2: error: --mmproj x.gguf does not fit the model"
    )
    assert images.start_failure("not ready after 180 s") == "did not start: not ready after 180 s"
    assert images.start_failure("") == "did not start"


def stream(ttft: float | None, tps: float | None, **more: object) -> Stream:
    base = {"tokens": 32, "ttft": ttft, "decode_tps": tps, "prompt_tokens": 12, "short": False}
    return Stream(**(base | more))


def test_summarize_gives_each_image_and_the_medians():
    cold = [stream(0.30, 50.0), stream(0.10, 40.0), stream(0.20, None, short=True)]
    repeated = [
        stream(0.05, 55.0, cached_tokens=11),
        stream(None, None, error="HTTP 500: boom", cached_tokens=None),
        stream(0.07, 52.0, cached_tokens=9),
    ]
    got = images.summarize(cold, repeated)
    assert got["requests"] == 3
    assert got["ttft_ms"] == pytest.approx([300.0, 100.0, 200.0])
    assert got["ttft_p50_ms"] == pytest.approx(200.0)
    assert got["repeat_ttft_ms"][1] is None
    assert got["repeat_ttft_p50_ms"] == pytest.approx(60.0)
    assert got["decode_tps_p50"] == pytest.approx(45.0)
    assert got["prompt_tokens"] == 12.0
    assert got["repeat_cached_tokens"] == 10.0
    assert got["short"] == 1
    assert got["errors"] == ["HTTP 500: boom"]


def test_summarize_with_nothing_measured():
    got = images.summarize([stream(None, None)], [stream(None, None)])
    assert got["ttft_p50_ms"] is None
    assert got["decode_tps_p50"] is None


def image_figures(ttft: float, tps: float, spread: float = 0.0) -> dict:
    return {
        "requests": 2,
        "ttft_ms": [ttft - spread, ttft + spread],
        "ttft_p50_ms": ttft,
        "repeat_ttft_ms": [20.0, 20.0],
        "repeat_ttft_p50_ms": 20.0,
        "decode_tps": [tps, tps],
        "decode_tps_p50": tps,
        "prompt_tokens": 14.0,
        "repeat_cached_tokens": 13.0,
        "short": 0,
        "errors": [],
    }


def with_images(data: dict, baseline: dict | None) -> dict:
    data["images"] = {
        "width": 640,
        "height": 480,
        "png_bytes": 921_000,
        "mmproj": "bench/results/images/tiny-gemma3-mmproj.gguf",
        "requests": 2,
        "max_tokens": 32,
        "unsupported": {} if baseline else {EDGESERVE_BASELINE: "no --mmproj"},
        EDGESERVE: image_figures(90.0, 50.0, spread=10.0),
        LLAMA_SERVER: image_figures(100.0, 45.0),
    }
    if baseline:
        data["images"][EDGESERVE_BASELINE] = baseline
    return data


def test_report_images_beside_llama_server_and_n_a_for_an_old_baseline():
    data = with_images(results(), None)
    lines = lines_of(data)
    title = "images (one 640x480 PNG of 899 KiB per request, --parallel 1, 32 tokens; 2 new"
    assert any(line.startswith(title) for line in lines)
    # edgeserve, baseline, llama-server, es/llama-server, vs previous
    assert row(lines, "images", "cold TTFT p50 ms") == ["90", "n/a", "100", "0.90", "n/a"]
    assert row(lines, "images", "generated tok/s p50") == ["50.0", "n/a", "45.0", "1.11", "n/a"]
    assert row(lines, "images", "repeated-image TTFT p50 ms") == [
        "20",
        "n/a",
        "20",
        "1.00",
        "n/a",
    ]
    assert "  edgeserve-baseline n/a: no --mmproj" in block(lines, "images")
    labels = {f.label for f in report.versus_previous(data)}
    assert not any(label.startswith("images ") for label in labels)
    assert "c=4 aggregate tok/s" in labels  # the rest is compared as before


def test_report_images_vs_previous_where_the_baseline_takes_images():
    data = with_images(results(), image_figures(60.0, 50.0))
    lines = lines_of(data)
    assert row(lines, "images", "cold TTFT p50 ms") == ["90", "60", "100", "0.90", "1.50"]
    figures = {f.label: f for f in report.versus_previous(data)}
    cold = figures["images cold TTFT p50 ms"]
    assert cold.noise == pytest.approx(20 / 90)  # edgeserve's images spread 80..100
    assert cold.regressed()
    assert not figures["images generated tok/s p50"].regressed()
    assert figures["images streams cut short"].noise == 0.0


def test_report_without_a_baseline_or_llama_server():
    data = with_images(results((EDGESERVE,)), None)
    data["images"]["unsupported"] = {}
    del data["images"][LLAMA_SERVER]
    lines = lines_of(data)
    assert row(lines, "images", "cold TTFT p50 ms") == ["90"]


def test_the_image_ttft_target():
    data = with_images(results(), None)
    checks = {what: (ok, why) for what, ok, why in report.targets(data)}
    what = "image TTFT p50 <= llama-server's (cold, --mmproj)"
    assert checks[what] == (True, "90 vs 100 ms (ratio 0.90)")
    data["images"][EDGESERVE]["ttft_p50_ms"] = 101.0
    checks = {what: ok for what, ok, _ in report.targets(data)}
    assert checks[what] is False
    del data["images"][EDGESERVE]
    checks = {what: ok for what, ok, _ in report.targets(data)}
    assert checks[what] is None
    assert what not in {w for w, _, _ in report.targets(results())}


def test_the_photo_is_a_camera_sized_png_that_is_cheap_to_send():
    width, height = images.PHOTO_WIDTH, images.PHOTO_HEIGHT
    data = images.photo_png(width, height)
    picture = Image.open(io.BytesIO(data))
    assert picture.size == (4000, 3000) and picture.mode == "RGB"
    assert picture.getpixel((0, 0)) == (0, 0, 128)
    assert picture.getpixel((width - 1, height - 1)) == (255, 255, 128)
    assert len(data) < width * height * 3 / 50  # a gradient: all pixels to decode, few bytes


def test_the_photo_beside_a_stream_in_the_report_and_its_target():
    data = with_images(results(), None)
    data["images"]["photo"] = {"width": 4000, "height": 3000}
    data["images"][EDGESERVE]["photo"] = {"max_gap_s": 0.31, "photo_ttft_s": 1.2, "error": None}
    data["images"][LLAMA_SERVER]["photo"] = {"max_gap_s": 1.7, "photo_ttft_s": 1.9, "error": None}
    lines = block(lines_of(data), "images")
    assert (
        "  edgeserve: a 4000x3000 photo beside a stream: the stream's longest gap 0.31 s, "
        "the photo's TTFT 1.20 s"
    ) in lines
    assert any(line.startswith("  llama-server: a 4000x3000 photo") for line in lines)
    what = "a stream's longest gap < 1 s beside a camera photo"
    checks = {w: (ok, why) for w, ok, why in report.targets(data)}
    assert checks[what] == (True, "0.31 s")
    data["images"][EDGESERVE]["photo"]["max_gap_s"] = 1.5
    assert {w: ok for w, ok, _ in report.targets(data)}[what] is False
    del data["images"]["photo"], data["images"][EDGESERVE]["photo"]
    assert what not in {w for w, _, _ in report.targets(data)}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_images_run_by_default_and_have_their_switches(model: Path, tmp_path: Path, capsys):
    args = parse_args(["--model", str(model)])
    assert (args.no_images, args.images_only, args.image_requests, args.mmproj) == (
        False,
        False,
        8,
        None,
    )
    assert parse_args(["--model", str(model), "--quick"]).image_requests == 3
    assert parse_args(["--model", str(model), "--no-images"]).no_images
    args = parse_args(["--model", str(model), "--images-only", "--image-requests", "2"])
    assert (args.images_only, args.image_requests) == (True, 2)
    with pytest.raises(SystemExit):
        parse_args(["--model", str(model), "--images-only", "--no-images"])
    assert "exclude each other" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--model", str(model), "--mmproj", str(tmp_path / "none.gguf")])
    assert "no projector" in capsys.readouterr().err


def test_the_anchor_build_keeps_mtmd(tmp_path: Path):
    options = build.cmake_options("", native=True)
    assert options["LLAMA_BUILD_TOOLS"] == options["LLAMA_BUILD_SERVER"] == "ON"
    root = tmp_path / "llamacpp"
    (root / "src").mkdir(parents=True)
    (root / "build" / "bin").mkdir(parents=True)
    for target in build.TARGETS:
        exe = root / "build" / "bin" / target
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)

    def cache(tools: str) -> None:
        entries = {**options, "LLAMA_BUILD_TOOLS": tools, "CMAKE_HOME_DIRECTORY": str(root / "src")}
        (root / "build" / "CMakeCache.txt").write_text(
            "".join(f"{k}:STRING={v}\n" for k, v in entries.items())
        )

    cache("ON")
    assert build.reusable(root, options)
    cache("OFF")
    assert not build.reusable(root, options)


async def test_each_server_takes_each_new_image_twice_in_rotating_turns(aiohttp_server):
    seen: list[tuple[str, str]] = []

    def record(name: str) -> Callable[[dict], None]:
        def seen_image(body: dict) -> None:
            [part, _text] = body["messages"][0]["content"]
            seen.append((name, hashlib.sha256(part["image_url"]["url"].encode()).hexdigest()))

        return seen_image

    a = await aiohttp_server(streaming_chat_app(record("a")))
    b = await aiohttp_server(streaming_chat_app(record("b")))
    pair = [("a", str(a.make_url("")).rstrip("/")), ("b", str(b.make_url("")).rstrip("/"))]
    got = await images.compare(pair, requests=3, max_tokens=4, width=16, height=8, eog_ids=(1,))
    assert "".join(name for name, _ in seen) == "aabb" + "bbaa" + "aabb"
    per_round = [seen[i * 4 : i * 4 + 4] for i in range(3)]
    for turns in per_round:
        assert len({image for _, image in turns}) == 1  # the same image for every server
    assert len({turns[0][1] for turns in per_round}) == 3  # a new image each round
    for name in ("a", "b"):
        assert got[name]["requests"] == 3
        assert got[name]["short"] == 0
        assert got[name]["prompt_tokens"] == 9.0
        assert all(t is not None and t > 0 for t in got[name]["ttft_ms"])
