"""edgeserve: a lightweight LLM server for the edge."""

__version__ = "0.1.0"

# Before anything loads llama.cpp: CUDA libraries a CUDA build takes from NVIDIA's wheels.
from edgeserve import cuda_runtime

cuda_runtime.preload()
