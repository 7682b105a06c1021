"""The one compiled module, the head of the sampler's draw (edgeserve/engine/rowdraw.c); every
other setting is in pyproject.toml. pip builds it with the C compiler llama-cpp-python's own
build needs."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "edgeserve.engine._rowdraw",
            sources=["edgeserve/engine/rowdraw.c"],
            # no fused multiply-adds: each offset from the best is the float32 arithmetic
            # numpy does (which tokens are in the gap), on every CPU alike
            extra_compile_args=["-O3", "-ffp-contract=off"],
        )
    ]
)
