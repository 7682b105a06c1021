"""The models a server offers: the catalogue of entries (a folder of GGUF files and the config
file's `[models.NAME]` tables, or `--model` alone), what each would take in memory before it
loads, and the fleet that loads them on demand within one memory budget and unloads idle ones.

Beside the engine: it builds engines from entries and owns their lives; it knows nothing of
HTTP (http/ asks the fleet for a model by name and gets an `EngineClient`).
"""
