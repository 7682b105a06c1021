"""Ollama's native API (/api/chat, /api/generate, /api/embed, /api/tags, …): its requests on
the engine, its NDJSON streams and its `{"error": …}` bodies."""
