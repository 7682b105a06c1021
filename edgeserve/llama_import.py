"""How llama-cpp-python is imported: what must happen before, and what need not happen at all.

`prepare()` runs when the edgeserve package is imported, before any module imports llama_cpp.

CUDA's runtime libraries from NVIDIA's wheels are loaded first. A CUDA build of
llama-cpp-python made against NVIDIA's cuBLAS (or CUDA runtime) wheel, as `make install-cuda`
does on a toolkit without cuBLAS (deploy/cuda.py), needs those libraries at run time, and the
dynamic loader does not look inside site-packages. They are loaded here, once,
with their symbols global, so that llama.cpp's CUDA library finds them already loaded. A CPU or
Metal build (no `libggml-cuda.so`) loads nothing.

Then the package's own `__init__` is deferred. It imports the high-level `Llama` class, and with
it multiprocessing, diskcache (sqlite3) and every chat format (~4 MiB resident, ~0.1 s), none of
which edgeserve uses: it calls the bindings (`llama_cpp.llama_cpp`, `mtmd_cpp`) and the grammar
converter. The package is registered without running its `__init__`, which runs on the first
use of a name only it defines (`llama_cpp.Llama`, `__version__`), so any other user of the
package sees it whole. Standard library only: importing this module must not load llama.cpp.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from pathlib import Path
from typing import Any

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


def prepare() -> None:
    """Before llama_cpp is first imported: CUDA's libraries loaded, the package's init deferred."""
    preload_cuda_libraries()
    defer_package_init()


def defer_package_init() -> None:
    """Register llama_cpp without running its `__init__`, which runs on first use of a name
    only the package defines. Nothing changes when llama_cpp is already imported or missing."""
    spec = importlib.util.find_spec("llama_cpp")
    if "llama_cpp" in sys.modules or spec is None or spec.loader is None:
        return
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def complete(name: str) -> Any:
        del package.__getattr__
        loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules["llama_cpp"] = package


def preload_cuda_libraries() -> None:
    """Load the wheels' CUDA libraries a CUDA build of llama.cpp links to (nothing otherwise).
    A library that does not load is left to llama.cpp's own load, which reports it."""
    if not llama_has_cuda():
        return
    for path in wheel_libraries():
        try:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
