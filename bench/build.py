"""Build llama.cpp's `llama-server` and `llama-bench` (the anchors) into a cache folder, once.

    python -m bench.build --dir ~/.cache/edgeserve/llamacpp --version 0.3.36 --cflags "..."
    python -m bench.build --dir ~/.cache/edgeserve/llamacpp-cuda --cuda-toolkits DIR --cuda-arch 90

llama-server is built with libmtmd (tools/mtmd), so it takes `--mmproj` like edgeserve.
The sources are the llama.cpp vendored in the llama-cpp-python sdist of `--version` (the same
llama.cpp edgeserve runs on), fetched with `pip download` and unpacked to DIR/src; the build goes
to DIR/build. An existing build made with the same flags is reused as it is (nothing is
recompiled). Standard library only: it runs before the bench's own venv exists.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("llama-server", "llama-bench")


def cmake_options(cflags: str, native: bool) -> dict[str, str]:
    """The cache entries the anchors are configured with (compared on reuse)."""
    return {
        "CMAKE_BUILD_TYPE": "Release",
        "GGML_NATIVE": "ON" if native else "OFF",
        "CMAKE_C_FLAGS": cflags,
        "CMAKE_CXX_FLAGS": cflags,
        # llama-server links tools/mtmd (its --mmproj: the images workload); a standalone
        # build has both on, pinned here so that a build without them is not reused.
        "LLAMA_BUILD_TOOLS": "ON",
        "LLAMA_BUILD_SERVER": "ON",
        "LLAMA_CURL": "OFF",
        "LLAMA_BUILD_TESTS": "OFF",
        "LLAMA_BUILD_EXAMPLES": "OFF",
    }


def configured_with(build: Path) -> dict[str, str]:
    """NAME -> value of a CMakeCache.txt ({} when there is none)."""
    cache = build / "CMakeCache.txt"
    if not cache.is_file():
        return {}
    out: dict[str, str] = {}
    for line in cache.read_text(errors="replace").splitlines():
        if line and not line.startswith(("#", "//")) and "=" in line and ":" in line:
            head, value = line.split("=", 1)
            out[head.split(":", 1)[0]] = value
    return out


def reusable(root: Path, options: dict[str, str]) -> bool:
    """True when DIR/build already holds both binaries built from DIR/src with `options`."""
    build = root / "build"
    if not all(os.access(build / "bin" / t, os.X_OK) for t in TARGETS):
        return False
    cache = configured_with(build)
    same_src = (
        Path(cache.get("CMAKE_HOME_DIRECTORY", "/nonexistent")).resolve()
        == (root / "src").resolve()
    )
    flags_ok = all(
        cache.get(k, "") == v
        for k, v in options.items()
        if k not in ("LLAMA_CURL", "LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES")
    )
    return same_src and flags_ok


def fetch_sources(root: Path, version: str) -> None:
    """Unpack vendor/llama.cpp of the llama-cpp-python `version` sdist into DIR/src."""
    marker = root / "src" / ".llama-cpp-python-version"
    if marker.is_file() and marker.read_text().strip() == version:
        return
    sdists = root / "sdist"
    sdists.mkdir(parents=True, exist_ok=True)
    name = f"llama_cpp_python-{version}.tar.gz"
    if not (sdists / name).is_file():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "-d", str(sdists), f"llama-cpp-python=={version}"],
            check=True,
        )  # fmt: skip
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    with tempfile.TemporaryDirectory(dir=root) as tmp, tarfile.open(sdists / name) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise SystemExit(f"{name} has no vendor/llama.cpp")
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
            tar.extractall(tmp, members=members, filter="data")
        else:
            tar.extractall(tmp, members=members)
        shutil.rmtree(root / "src", ignore_errors=True)
        shutil.move(str(Path(tmp) / prefix), root / "src")
    marker.write_text(version + "\n")


def build(
    root: Path, version: str, cflags: str, native: bool = True, extra: dict[str, str] | None = None
) -> Path:
    """Make sure DIR/build/bin has the anchors, built with `extra` CMake cache entries too (a
    CUDA build's); return that folder."""
    root = root.expanduser()
    root.mkdir(parents=True, exist_ok=True)
    options = {**cmake_options(cflags, native), **(extra or {})}
    bindir = root / "build" / "bin"
    if reusable(root, options):
        print(f"llama.cpp anchors: reusing {bindir}")
        return bindir
    print(
        f"llama.cpp anchors: building {', '.join(TARGETS)} into {bindir} (once; ~15 min on 2 cores)"
    )
    fetch_sources(root, version)
    defines = [f"-D{k}={v}" for k, v in options.items()]
    run = ["cmake", "-S", str(root / "src"), "-B", str(root / "build"), *defines]
    print("+", shlex.join(run))
    subprocess.run(run, check=True)
    jobs = str(os.cpu_count() or 1)
    subprocess.run(
        ["cmake", "--build", str(root / "build"), "--config", "Release", "-j", jobs,
         "--target", *TARGETS],
        check=True,
    )  # fmt: skip
    return bindir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("~/.cache/edgeserve/llamacpp"))
    parser.add_argument("--version", default="0.3.36")
    parser.add_argument(
        "--cflags", default="", help="C and C++ flags (the Makefile's LLAMA_CFLAGS)"
    )
    parser.add_argument("--no-native", action="store_true", help="GGML_NATIVE=OFF")
    parser.add_argument(
        "--cuda-toolkits", type=Path, metavar="DIR",
        help="build for CUDA with what deploy/cuda.py finds (its wheels fetched into DIR)",
    )  # fmt: skip
    parser.add_argument("--cuda-arch", default="", help="CMAKE_CUDA_ARCHITECTURES (CUDA builds)")
    return parser.parse_args(argv)


def cuda_defines(args: argparse.Namespace, env: dict[str, str]) -> dict[str, str]:
    """The CMake cache entries a CUDA build adds (none without --cuda-toolkits): GGML_CUDA and
    deploy/cuda.py's compiler, cuBLAS and driver choices, as `make install-cuda` builds."""
    if args.cuda_toolkits is None:
        return {}
    name = "bench_build_deploy_cuda"  # deploy/ is scripts, not a package
    spec = importlib.util.spec_from_file_location(name, REPO / "deploy" / "cuda.py")
    assert spec is not None and spec.loader is not None
    cuda = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cuda)
    found = cuda.cmake_args(
        args.cuda_arch, args.cuda_toolkits.expanduser(), args.dir.expanduser(), env
    )
    return {"GGML_CUDA": "ON", **dict(a.removeprefix("-D").split("=", 1) for a in found)}


def main() -> None:
    """Command line: see the module docstring."""
    args = parse_args()
    extra = cuda_defines(args, dict(os.environ))
    build(args.dir, args.version, args.cflags, native=not args.no_native, extra=extra)


if __name__ == "__main__":
    main()
