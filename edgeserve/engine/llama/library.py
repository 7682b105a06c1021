"""Whether llama.cpp's shared libraries load at all, asked before anything imports them."""

from __future__ import annotations


def load_error() -> str | None:
    """Why llama-cpp-python's shared libraries do not load (a CUDA build on a machine without
    CUDA's runtime libraries, a wheel built for another CPU), or None when they load."""
    try:
        import llama_cpp.llama_cpp  # noqa: F401
    except (OSError, RuntimeError) as exc:
        return str(exc)
    return None
