"""deploy/cuda.py, the CUDA build's toolkit finder, on toolkit folders the tests lay out with a
fake `nvcc` script (it answers `--version` and `--dryrun` as nvcc does), and
edgeserve/llama_import.py's choice of the wheels' libraries. No compiler runs here: the CUDA
build itself is checked by tests/cuda (make test-cuda)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from bench import build
from edgeserve import llama_import

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("deploy_cuda", REPO / "deploy" / "cuda.py")
assert spec is not None and spec.loader is not None
cuda = importlib.util.module_from_spec(spec)
sys.modules["deploy_cuda"] = cuda
spec.loader.exec_module(cuda)


def fake_toolkit(root: Path, release: str = "13.0", cublas: bool = True) -> Path:
    """A toolkit folder whose bin/nvcc is a fake script: `--version` prints `release`, `--dryrun`
    prints the TOP line nvcc prints. Returns the nvcc path."""
    (root / "bin").mkdir(parents=True)
    (root / "lib64").mkdir()
    (root / "include").mkdir()
    if cublas:
        (root / "include" / "cublas_v2.h").write_text("")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --version) echo "Cuda compilation tools, release {release}, V{release}";;\n'
        f"  --dryrun) echo '#$ TOP={root}/bin/..' >&2;; esac\n"
    )
    nvcc.chmod(0o755)
    return nvcc


def wrapper(folder: Path, target: Path) -> Path:
    """An `nvcc` on PATH that is a script calling the real one, as some images install it."""
    folder.mkdir(parents=True)
    script = folder / "nvcc"
    script.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
    script.chmod(0o755)
    return script


def test_the_compiler_is_looked_for_in_the_documented_order(tmp_path):
    first = fake_toolkit(tmp_path / "cudacxx")
    on_path = fake_toolkit(tmp_path / "onpath")
    home = fake_toolkit(tmp_path / "home")
    env = {"CUDACXX": str(first), "PATH": str(on_path.parent), "CUDA_HOME": str(home.parents[1])}
    assert cuda.find_nvcc(env) == first
    del env["CUDACXX"]
    assert cuda.find_nvcc(env) == on_path
    env["PATH"] = str(tmp_path / "empty")
    assert cuda.find_nvcc(env) == home


def test_a_wrapper_on_path_leads_to_the_toolkit_it_runs(tmp_path):
    real = fake_toolkit(tmp_path / "cuda-13.0")
    toolkit = cuda.toolkit_of(wrapper(tmp_path / "usrbin", real))
    assert toolkit.root == (tmp_path / "cuda-13.0").resolve()
    assert toolkit.nvcc == real.resolve()
    assert (toolkit.version, toolkit.major) == ("13.0", "13")


def test_a_toolkit_with_cublas_builds_against_itself_and_needs_nothing_in_the_venv(tmp_path):
    nvcc = fake_toolkit(tmp_path / "cuda")
    (tmp_path / "cuda" / "lib64" / "stubs").mkdir()
    (tmp_path / "cuda" / "lib64" / "stubs" / "libcuda.so").write_text("")
    record = tmp_path / "wheels"
    args = cuda.cmake_args("87", tmp_path / "toolkits", record, {"CUDACXX": str(nvcc), "PATH": ""})
    root = (tmp_path / "cuda").resolve()
    assert args[:3] == [
        f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}",
        f"-DCUDAToolkit_ROOT={root}",
        "-DCMAKE_CUDA_ARCHITECTURES=87",
    ]
    assert not any(a.startswith(("-DCUDA_cublas", "-DCMAKE_CUDA_FLAGS")) for a in args)
    # The driver stub is there: CUDA's virtual memory management stays on.
    assert "-DGGML_CUDA_NO_VMM=ON" not in args
    assert not (tmp_path / "toolkits").exists(), "nothing is fetched"
    notes = (record / "toolkit.txt").read_text()
    assert "nvcc 13.0" in notes and "VMM on" in notes


def test_without_a_driver_library_the_build_leaves_out_vmm_and_says_so(tmp_path, monkeypatch):
    nvcc = fake_toolkit(tmp_path / "cuda")
    monkeypatch.setattr(cuda, "loader_finds", lambda soname: None)
    record = tmp_path / "wheels"
    args = cuda.cmake_args("", tmp_path / "toolkits", record, {"CUDACXX": str(nvcc), "PATH": ""})
    assert "-DGGML_CUDA_NO_VMM=ON" in args
    assert not any(a.startswith("-DCMAKE_CUDA_ARCHITECTURES") for a in args)
    assert "GGML_CUDA_NO_VMM=ON" in (record / "toolkit.txt").read_text()
    # Nor is the CUDA runtime in the loader's cache: its wheel goes into the serving venv.
    assert (record / "requirements.txt").read_text() == f"{cuda.CUDART_WHEELS['13']}\n"


def test_cublas_missing_from_the_toolkit_comes_from_its_wheel_into_build_and_venv(
    tmp_path, monkeypatch
):
    nvcc = fake_toolkit(tmp_path / "cuda", cublas=False)
    monkeypatch.setattr(cuda, "loader_finds", lambda soname: Path("/lib") / soname)
    installed: list[tuple[tuple[str, ...], Path]] = []

    def fake_pip_install(requirements: tuple[str, ...], target: Path) -> Path:
        installed.append((requirements, target))
        tree = target / "nvidia" / "cu13"
        (tree / "include").mkdir(parents=True)
        (tree / "include" / "cublas_v2.h").write_text("")
        (tree / "lib").mkdir()
        for name in ("libcublas.so.13", "libcublasLt.so.13"):
            (tree / "lib" / name).write_text("")
        return target

    monkeypatch.setattr(cuda, "pip_install", fake_pip_install)
    record = tmp_path / "wheels"
    args = cuda.cmake_args("90", tmp_path / "toolkits", record, {"CUDACXX": str(nvcc), "PATH": ""})
    assert installed == [
        (("nvidia-cublas==13.0.2.14",), tmp_path / "toolkits" / "nvidia-cublas-13.0.2.14")
    ]
    tree = tmp_path / "toolkits" / "nvidia-cublas-13.0.2.14" / "nvidia" / "cu13"
    assert f"-DCUDA_cublas_LIBRARY={tree / 'lib' / 'libcublas.so.13'}" in args
    assert f"-DCUDA_cublasLt_LIBRARY={tree / 'lib' / 'libcublasLt.so.13'}" in args
    assert f"-DCMAKE_CUDA_FLAGS=-I{tree / 'include'}" in args
    assert (record / "requirements.txt").read_text() == "nvidia-cublas==13.0.2.14\n"


def test_no_compiler_anywhere_fetches_the_pinned_toolkit_wheels(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda, "STANDARD_ROOTS", ())
    fetched: list[tuple[str, ...]] = []

    def fake_pip_install(requirements: tuple[str, ...], target: Path) -> Path:
        fetched.append(requirements)
        fake_toolkit(target / "nvidia" / "cu13")
        return target

    monkeypatch.setattr(cuda, "pip_install", fake_pip_install)
    args = cuda.cmake_args("", tmp_path / "toolkits", tmp_path / "wheels", {"PATH": ""})
    assert fetched == [cuda.TOOLKIT_WHEELS]
    assert all("==" in pin for pin in cuda.TOOLKIT_WHEELS), "pinned versions"
    wheel_root = (tmp_path / "toolkits" / "toolkit-13.0" / "nvidia" / "cu13").resolve()
    assert args[0] == f"-DCMAKE_CUDA_COMPILER={wheel_root / 'bin' / 'nvcc'}"


def test_the_runtime_loads_the_wheels_libraries_in_dependency_order(tmp_path, monkeypatch):
    lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    for name in ("libcublas.so.13", "libnvblas.so.13", "libcudart.so.13", "libcublasLt.so.13"):
        (lib / name).write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    found = llama_import.wheel_libraries()
    assert [p.name for p in found] == ["libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13"]


def test_a_cpu_build_loads_no_cuda_library():
    # This venv's llama-cpp-python is the CPU build `make test` installs.
    assert not llama_import.llama_has_cuda()
    if os.environ.get("LD_PRELOAD"):
        pytest.skip("LD_PRELOAD is set: the loaded-library check below would see it")
    maps = Path("/proc/self/maps").read_text()
    assert "libcublas" not in maps and "libcudart" not in maps


def test_the_anchors_build_for_cuda_with_the_same_choices_as_the_wheel(tmp_path):
    nvcc = fake_toolkit(tmp_path / "cuda")
    env = {"CUDACXX": str(nvcc)}
    args = build.parse_args(["--dir", str(tmp_path / "anchors"), "--cuda-toolkits",
                             str(tmp_path / "toolkits"), "--cuda-arch", "90"])  # fmt: skip
    defines = build.cuda_defines(args, env)
    wheel_args = cuda.cmake_args("90", tmp_path / "toolkits", tmp_path / "wheel", env)
    assert defines == {"GGML_CUDA": "ON"} | dict(a[2:].split("=", 1) for a in wheel_args)
    assert defines["CMAKE_CUDA_COMPILER"] == str((tmp_path / "cuda").resolve() / "bin" / "nvcc")
    assert (tmp_path / "anchors" / "toolkit.txt").is_file()
    assert build.cuda_defines(build.parse_args(["--dir", str(tmp_path)]), env) == {}
