"""edgeserve: a lightweight LLM server for the edge."""

__version__ = "0.1.0"

# Before anything imports llama_cpp (edgeserve/llama_import.py).
from edgeserve import llama_import

llama_import.prepare()
