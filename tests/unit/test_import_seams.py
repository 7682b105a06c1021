"""What the server imports when it starts: what every request needs, and not the packages that
only some requests or flags use, which load when first used (README "Memory"). Each check
runs in a fresh interpreter, where no other test has imported anything."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import import_module
from pathlib import Path

from edgeserve.http.app import LAZY_APIS

REPO = Path(__file__).resolve().parents[2]


def modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter (this checkout's edgeserve first on its path) holds
    after running `code`."""
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


def of_package(modules: set[str], package: str) -> set[str]:
    return {name for name in modules if name == package or name.startswith(package + ".")}


def test_the_server_starts_without_pillow():
    # Pillow decodes images for a --mmproj that takes them (engine/images.py), ~2 MiB resident.
    loaded = modules_after("import edgeserve.http.server")
    assert "edgeserve.engine.llama.projector" in loaded, "the engine that serves images"
    assert of_package(loaded, "PIL") == set()


def test_the_first_image_imports_pillow_without_its_own_pixel_limit():
    # decode_image refuses from the header past --max-media-pixels, in place of Pillow's
    # process-wide limit, which must be off once Pillow is in.
    code = (
        "from edgeserve.engine.images import pillow\n"
        "assert 'PIL' not in sys.modules\n"
        "assert pillow().MAX_IMAGE_PIXELS is None"
    )
    assert "PIL.Image" in modules_after(code)


def test_the_server_starts_without_the_apis_it_loads_on_first_use():
    loaded = modules_after("import edgeserve.http.server")
    assert "edgeserve.api.openai_chat.wire" in loaded, "chat loads with the app"
    for api in LAZY_APIS:
        package = api.module.rsplit(".", 1)[0]
        assert of_package(loaded, package) == set(), package


def test_every_api_is_mounted_and_a_lazy_one_where_its_module_declares():
    # The paths mounted at start are the routes the module declares once imported; an API
    # is either imported with the app or in LAZY_APIS.
    for api in LAZY_APIS:
        routes = import_module(api.module).ROUTES
        assert tuple((route.method, route.path) for route in routes) == api.paths, api.module
    with_app = modules_after("import edgeserve.http.app")
    for path in sorted((REPO / "edgeserve" / "api").glob("*/routes.py")):
        module = f"edgeserve.api.{path.parent.name}.routes"
        assert module in with_app or module in {api.module for api in LAZY_APIS}, module


def test_the_server_starts_without_llama_cpp_s_high_level_package():
    # llama-cpp-python's __init__ imports its Llama class, diskcache (sqlite3), multiprocessing
    # and every chat format; edgeserve calls the bindings only (edgeserve/llama_import.py).
    loaded = modules_after("import edgeserve.http.server")
    assert "llama_cpp.llama_cpp" in loaded and "llama_cpp.llama_grammar" in loaded
    for unused in ("llama_cpp.llama", "llama_cpp.llama_chat_format", "diskcache", "sqlite3"):
        assert unused not in loaded, unused


def test_the_deferred_package_is_whole_to_anyone_who_asks_for_more():
    code = (
        "import edgeserve.http.server\n"
        "import llama_cpp\n"
        "assert llama_cpp.Llama.__module__ == 'llama_cpp.llama'\n"
        "assert llama_cpp.__version__\n"
        "assert llama_cpp.llama_decode is llama_cpp.llama_cpp.llama_decode"
    )
    assert "llama_cpp.llama_chat_format" in modules_after(code)
