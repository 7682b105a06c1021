"""CUDA's runtime libraries from NVIDIA's wheels, loaded before llama.cpp is.

A CUDA build of llama-cpp-python made against NVIDIA's cuBLAS (or CUDA runtime) wheel, as
`make install-cuda` does on a toolkit without cuBLAS (deploy/cuda.py), needs those libraries at
run time, and the dynamic loader does not look inside site-packages. They are loaded here, once,
with their symbols global, so that llama.cpp's CUDA library finds them already loaded. A CPU or
Metal build (no `libggml-cuda.so`) loads nothing. Standard library only: importing this module
must not load llama.cpp.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

# In the order they need each other: cuBLAS needs cuBLASLt, both need the CUDA runtime.
_LIBRARIES = ("libcudart.so.*", "libcublasLt.so.*", "libcublas.so.*")


def _package_dirs(name: str) -> list[Path]:
    """The folders of an installed package (a namespace package may have several), found
    without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def llama_has_cuda() -> bool:
    """Whether the installed llama-cpp-python was built with CUDA."""
    return any((d / "lib" / "libggml-cuda.so").exists() for d in _package_dirs("llama_cpp"))


def wheel_libraries() -> list[Path]:
    """The CUDA runtime and cuBLAS libraries NVIDIA's wheels installed, in load order."""
    lib_dirs = [lib for d in _package_dirs("nvidia") for lib in sorted(d.glob("*/lib"))]
    return [
        path for pattern in _LIBRARIES for lib in lib_dirs for path in sorted(lib.glob(pattern))
    ]


def preload() -> None:
    """Load the wheels' CUDA libraries a CUDA build of llama.cpp links to (nothing otherwise).
    A library that does not load is left to llama.cpp's own load, which reports it."""
    if not llama_has_cuda():
        return
    for path in wheel_libraries():
        try:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
