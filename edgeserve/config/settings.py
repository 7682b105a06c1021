"""The `Settings` dataclass: every setting of `edgeserve serve`, each field carrying its parser,
help text and names (read by `edgeserve.config.sources`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Literal

from edgeserve.config import values
from edgeserve.config.presets import ModelPreset, model_presets
from edgeserve.config.values import (
    ANY_HOST,
    CORS_ANY,
    CORS_LOCAL,
    CORS_REFERENCE,
    DEFAULT_HOST,
    DEFAULT_MODEL_FILE,
    FLASH_ATTN_MODES,
    KV_CACHE_TYPES,
    LOG_FORMATS,
    LOG_LEVELS,
    physical_cores,
)
from edgeserve.engine.types import EngineConfig, FlashAttnMode


def _setting(
    default: Any,
    parse: Callable[[object], Any],
    doc: str,
    metavar: str,
    *,
    env: tuple[str, ...] = (),
    flag: str = "",
    kind: Literal["value", "switch", "repeat", "table"] = "value",
    path: bool = False,
    in_file: bool = True,
    secret: bool = False,
    shown: str = "",
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A `Settings` field whose metadata says how to read it (see `Option`)."""
    meta = {
        "parse": parse,
        "help": doc,
        "metavar": metavar,
        "env": env,
        "flag": flag,
        "kind": kind,
        "path": path,
        "in_file": in_file,
        "secret": secret,
        "shown": shown,
    }
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything `edgeserve serve` runs with. `load_settings` builds it; tests may construct it."""

    model: str = _setting(
        MISSING,
        values.text,
        "GGUF model file",
        "PATH",
        path=True,
        shown=f"the installed default model ({DEFAULT_MODEL_FILE})",
    )
    models_dir: str | None = _setting(
        None,
        values.text,
        "folder of models served side by side, loaded on demand (a file is a model named after "
        "it; a sub-folder is one model with its mmproj*.gguf)",
        "DIR",
        path=True,
        shown="unset: --model alone",
    )
    models: tuple[ModelPreset, ...] = _setting(
        (),
        model_presets,
        "[models.NAME] tables of the config file: catalogue entries with settings of their own",
        "TABLE",
        kind="table",
        shown="none",
    )
    models_memory: int | None = _setting(
        None,
        values.byte_size,
        "memory the loaded models may take in all (estimated from each GGUF before it loads); "
        "idle models unload to make room",
        "BYTES",
        shown="three quarters of the memory available at start",
    )
    models_max: int = _setting(4, values.integer(1), "most models loaded at once", "N")
    keep_alive: float = _setting(
        300.0,
        values.keep_alive,
        "how long an idle model of the catalogue stays loaded: seconds or a duration (5m); 0 "
        "unloads after each answer, a negative value never",
        "DURATION",
        shown="5m",
    )
    embedding_model: str | None = _setting(
        None,
        values.text,
        "GGUF embedding model served by /v1/embeddings (with its own pooling), loaded beside "
        "the chat model",
        "PATH",
        path=True,
        shown="unset: mean pooling over the chat model",
    )
    draft_model: str | None = _setting(
        None,
        values.text,
        "GGUF model with the chat model's vocabulary (e.g. a smaller one of its family) whose "
        "greedy tokens speculation drafts, in place of n-gram drafts; verified exactly",
        "PATH",
        path=True,
        shown="unset: n-gram drafts",
    )
    mmproj: str | None = _setting(
        None,
        values.text,
        "multimodal projector GGUF of the model (llama.cpp's --mmproj): chat content then takes "
        "images, and audio where the projector has an audio encoder",
        "PATH",
        path=True,
        shown="unset: text only",
    )
    lora: tuple[tuple[str, str], ...] = _setting(
        (),
        values.lora_adapters,
        "LoRA adapter of the model (GGUF, e.g. from llama.cpp's convert_lora_to_gguf.py) that "
        "requests choose by `model`: NAME; repeat the flag for several",
        "NAME=PATH",
        kind="repeat",
        path=True,
        shown="none",
    )
    allow_runtime_lora: bool = _setting(
        False,
        values.boolean,
        "allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter (behind the API key, "
        "which a non-loopback --host then needs)",
        "BOOL",
        kind="switch",
    )
    lora_dir: str | None = _setting(
        None,
        values.text,
        "folder whose LoRA GGUFs /v1/load_lora_adapter may load (symlinks resolved, a file "
        "must lie in it)",
        "DIR",
        path=True,
        shown="the folders of the --lora files; none without them: nothing loads at run time",
    )
    max_loras: int = _setting(
        8,
        values.integer(1),
        "most LoRA adapters loaded at once, the --lora ones included (each holds its weights "
        "in memory)",
        "N",
    )
    host: str = _setting(DEFAULT_HOST, values.text, "bind address", "HOST", env=("API_HOST",))
    port: int = _setting(8000, values.integer(1, 65535), "TCP port", "PORT", env=("API_PORT",))
    ssl_certfile: str | None = _setting(
        None,
        values.text,
        "serve HTTPS with this PEM certificate (chain); its key in --ssl-keyfile or this file",
        "FILE",
        path=True,
        shown="unset: plain HTTP",
    )
    ssl_keyfile: str | None = _setting(
        None,
        values.text,
        "PEM private key of --ssl-certfile (unencrypted)",
        "FILE",
        path=True,
        shown="unset",
    )
    ssl_ca_certs: str | None = _setting(
        None,
        values.text,
        "PEM CA certificates: clients must present a certificate signed by one (mutual TLS)",
        "FILE",
        path=True,
        shown="unset: no client certificates",
    )
    api_keys: tuple[str, ...] = _setting(
        (),
        values.api_keys,
        "bearer API key; repeat the flag for several (unset = no auth)",
        "KEY",
        env=("API_KEY",),
        flag="--api-key",
        kind="repeat",
        secret=True,
        shown="unset",
    )
    api_key_file: str | None = _setting(
        None,
        values.text,
        "file of API keys, one per line; blank lines and # comments ignored",
        "FILE",
        path=True,
        shown="unset",
    )
    model_name: str = _setting(
        "",
        values.text,
        "model id shown by /v1/models",
        "NAME",
        env=("API_MODEL_NAME",),
        shown="the GGUF file name without .gguf",
    )
    parallel: int = _setting(4, values.integer(1), "sequences decoded together", "N")
    ctx_size: int = _setting(
        4096, values.integer(1), "KV cache tokens shared by all sequences", "N"
    )
    n_gpu_layers: int = _setting(
        -1,
        values.integer(-1),
        "layers offloaded to CUDA/Metal (-1 = all); ignored on CPU builds",
        "N",
    )
    threads: int = _setting(
        None, values.integer(1), "CPU threads", "N", factory=physical_cores, shown="physical cores"
    )
    batch_size: int = _setting(
        2048,
        values.integer(1),
        "prompt tokens per llama_decode while no stream is generating (run in micro-batches "
        "of at most 512)",
        "N",
    )
    prefill_chunk: int = _setting(
        16,
        values.integer(1),
        "least prompt tokens per step while streams are generating (more while the step takes "
        "at most twice its time without them)",
        "N",
    )
    max_queue: int = _setting(64, values.integer(0), "waiting requests before 503", "N")
    chat_template: str | None = _setting(
        None,
        values.text,
        "chat template name or Jinja file",
        "TEMPLATE",
        shown="from the GGUF, else by architecture",
    )
    flash_attn: FlashAttnMode = _setting(  # noqa: RUF009 (a Literal of str: immutable)
        "auto",
        values.flash_attn_mode,
        "flash attention: auto (on where llama.cpp's backend supports it for the model, as "
        "llama-server's default), on or off; alone, on",
        "|".join(FLASH_ATTN_MODES),
        kind="switch",
    )
    draft_max: int = _setting(
        16,
        values.integer(0),
        "most tokens a sequence drafts per step by n-gram speculation, verified exactly (0: off)",
        "N",
    )
    no_mmap: bool = _setting(
        False, values.boolean, "read the model into memory, no mmap", "BOOL", kind="switch"
    )
    mlock: bool = _setting(False, values.boolean, "lock the model in RAM", "BOOL", kind="switch")
    kv_cache_type: str = _setting(
        "f16",
        values.choice(KV_CACHE_TYPES),
        "KV cache element type (llama.cpp type_k and type_v); q8_0 and q4_0 need flash "
        "attention (not --flash-attn off)",
        "|".join(KV_CACHE_TYPES),
    )
    swa_full: bool = _setting(
        False,
        values.boolean,
        "full-size sliding-window KV caches (Gemma 3): more memory at long contexts, and no "
        "prompt re-decoded from a window checkpoint",
        "BOOL",
        kind="switch",
    )
    prompt_cache_ram: int | None = _setting(
        None,
        values.byte_size_or_off,
        "host memory each model's prompt cache may keep finished prompts' KV in once their "
        "cells are needed (restored when a prompt starts with one); 0: off",
        "BYTES",
        shown="8 GiB, at most a quarter of the memory; in a catalogue, an eighth of its budget",
    )
    prompt_cache_dir: str | None = _setting(
        None,
        values.text,
        "folder where the prompt cache also keeps its entries as files, restored after a "
        "restart (each model, context size and cache type apart)",
        "DIR",
        path=True,
        shown="unset: no disk tier",
    )
    prompt_cache_disk: int = _setting(
        8 * 2**30,
        values.byte_size,
        "most bytes the files of --prompt-cache-dir may take, every model's together",
        "BYTES",
        shown="8GiB",
    )
    max_body_bytes: int = _setting(
        32 * 1024 * 1024,
        values.integer(1),
        "largest request body (32 MiB: room for one --max-media-bytes image as a base64 data URL)",
        "BYTES",
    )
    max_n: int = _setting(16, values.integer(1), "largest `n` (choices) per request", "N")
    max_tokens_cap: int | None = _setting(
        None,
        values.integer(1),
        "largest max_tokens per request",
        "N",
        shown="bounded by the context",
    )
    max_media_per_request: int = _setting(
        8, values.integer(1), "most images and audio clips in one request", "N"
    )
    max_media_bytes: int = _setting(
        20 * 1024 * 1024,
        values.integer(1),
        "largest image or audio file (a data URL's decoded bytes, a local file, a download); "
        "larger is a 413",
        "BYTES",
    )
    max_media_pixels: int = _setting(
        40_000_000,
        values.integer(1),
        "most pixels in one image (width × height, read from its header: a larger image, such "
        "as a decompression bomb, is refused before it is decoded)",
        "N",
    )
    max_media_tokens: int = _setting(
        4096, values.integer(1), "most tokens the images and audio of one request may take", "N"
    )
    media_fetch_timeout_s: float = _setting(
        10.0,
        values.seconds(allow_zero=False),
        "time limit for downloading one media URL, redirects included",
        "SECONDS",
    )
    allow_private_media_urls: bool = _setting(
        False,
        values.boolean,
        "fetch media URLs whose host is a private, loopback, link-local or reserved address "
        "(refused by default: a client could otherwise make the server reach its own network)",
        "BOOL",
        kind="switch",
    )
    max_score_texts: int = _setting(256, values.integer(1), "most texts in one score request", "N")
    max_score_tokens: int = _setting(
        65536, values.integer(1), "most tokens (all texts) in one score request", "N"
    )
    grammar_step_limit_s: float = _setting(
        2.0,
        values.seconds(allow_zero=False),
        "a structured-output answer whose one grammar-constrained token took longer ends early",
        "SECONDS",
    )
    request_timeout_s: float = _setting(
        600.0, values.seconds(allow_zero=False), "per-request time limit", "SECONDS"
    )
    drain_timeout_s: float = _setting(
        30.0,
        values.seconds(allow_zero=True),
        "on SIGTERM, time running requests get to finish",
        "SECONDS",
    )
    engine_stall_s: float = _setting(
        120.0,
        values.seconds(allow_zero=False),
        "exit (for the supervisor to restart) when one engine step lasts this long (the engine "
        "thread is stuck)",
        "SECONDS",
    )
    ping_interval_s: float = _setting(
        15.0,
        values.seconds(allow_zero=False),
        "keep-alive comment interval on idle streams",
        "SECONDS",
    )
    cors_origins: tuple[str, ...] = _setting(
        (CORS_LOCAL,),
        values.origins,
        f"origins whose web pages may call the API (CORS), comma-separated: origins, "
        f"{CORS_LOCAL} (http(s)://localhost, 127.0.0.1, [::1], any port), {CORS_ANY} (any, "
        f"without credentials), {CORS_REFERENCE} (any origin echoed with credentials, as the "
        f"reference); empty = no CORS",
        "ORIGINS",
    )
    allowed_hosts: tuple[str, ...] = _setting(
        (),
        values.hosts,
        "further names clients may reach this server by (the Host header; .example.com: the "
        "name and its subdomains), comma-separated; any other name gets 403 (DNS rebinding). "
        f"{ANY_HOST}: any, only with an API key and a non-loopback --host",
        "HOSTS",
        shown="none: the bound address, localhost, loopback addresses (any IP address when "
        "bound to 0.0.0.0 or ::)",
    )
    root_path: str = _setting(
        "",
        values.root_path,
        "path prefix when served behind a proxy",
        "PATH",
        env=("EDGESERVE_ROOT_PATH", "FASTAPI_ROOT_PATH"),
        shown="none",
    )
    no_webui: bool = _setting(
        False,
        values.boolean,
        "do not serve the chat page at / (it then answers 404, as the reference does)",
        "BOOL",
        kind="switch",
    )
    reference_errors: bool = _setting(
        False,
        values.boolean,
        'error bodies exactly as the reference writes them: {"detail": ...} without the added '
        '"message" that OpenAI SDKs print',
        "BOOL",
        kind="switch",
    )
    log_format: str = _setting(
        "text", values.choice(LOG_FORMATS), "log format", "|".join(LOG_FORMATS)
    )
    log_level: str = _setting(
        "info", values.choice(LOG_LEVELS), "log level: " + ", ".join(LOG_LEVELS), "LEVEL"
    )
    log_prompts: bool = _setting(
        False,
        values.boolean,
        "log each chat prompt's text at debug level (never logged otherwise)",
        "BOOL",
        kind="switch",
    )
    config: str | None = _setting(
        None,
        values.text,
        "TOML file with the same keys",
        "FILE",
        path=True,
        in_file=False,
        shown="none",
    )

    def __post_init__(self) -> None:
        if not self.model_name:
            object.__setattr__(self, "model_name", Path(self.model).stem)

    @property
    def catalogue(self) -> bool:
        """Whether models come from a catalogue (--models-dir or [models.NAME] tables), each
        loaded on demand, rather than from --model alone."""
        return self.models_dir is not None or bool(self.models)

    def engine_config(self) -> EngineConfig:
        """The engine's view of these settings."""
        return EngineConfig(
            model_path=self.model,
            embedding_model_path=self.embedding_model,
            draft_model_path=self.draft_model,
            n_ctx=self.ctx_size,
            parallel=self.parallel,
            n_threads=self.threads,
            n_gpu_layers=self.n_gpu_layers,
            n_batch=self.batch_size,
            prefill_chunk=self.prefill_chunk,
            max_queue=self.max_queue,
            chat_template=self.chat_template,
            flash_attn=self.flash_attn,
            draft_max=self.draft_max,
            use_mmap=not self.no_mmap,
            use_mlock=self.mlock,
            max_score_tokens=self.max_score_tokens,
            grammar_step_limit_s=self.grammar_step_limit_s,
            kv_cache_type=self.kv_cache_type,
            swa_full=self.swa_full,
            mmproj_path=self.mmproj,
            max_media_pixels=self.max_media_pixels,
            max_media_tokens=self.max_media_tokens,
            lora_adapters=self.lora,
            lora_dir=self.lora_dir,
            max_loras=self.max_loras,
            prompt_cache_ram=self._prompt_cache_ram(),
            prompt_cache_dir=self.prompt_cache_dir,
            prompt_cache_disk=self.prompt_cache_disk,
        )

    def _prompt_cache_ram(self) -> int:
        """--prompt-cache-ram, or its default: 8 GiB, at most a quarter of physical memory,
        and in a catalogue (whose models' budget counts it) an eighth of that budget."""
        if self.prompt_cache_ram is not None:
            return self.prompt_cache_ram
        share = values.physical_memory() // 4
        if self.catalogue:
            share = (self.models_memory or values.default_models_budget()) // 8
        return min(8 * 2**30, share)
