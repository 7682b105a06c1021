"""The engine: one thread owns llama.cpp; nothing here knows about HTTP."""
