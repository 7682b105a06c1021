"""The one compiled module, the head of the sampler's draw (edgeserve/engine/rowdraw.c); every
other setting is in pyproject.toml. pip builds it with the C compiler llama-cpp-python's own
build needs."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "edgeserve.engine._rowdraw",
            sources=["edgeserve/engine/rowdraw.c"],
            # no fused multiply-adds: the threshold it returns is what numpy works out
            extra_compile_args=["-O3", "-ffp-contract=off"],
        )
    ]
)
