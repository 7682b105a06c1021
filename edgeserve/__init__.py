"""edgeserve: a lightweight LLM server for the edge."""

__version__ = "0.1.0"
