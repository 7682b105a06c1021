"""Plain data passed into and out of the engine."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    import numpy as np

FinishReason = Literal["stop", "length", "abort"]
MediaKind = Literal["image", "audio"]
# --flash-attn: on where llama.cpp's backend supports it for the model (auto), always, never.
FlashAttnMode = Literal["auto", "on", "off"]

# LoRA adapters a request runs under: (adapter id, scale) pairs, sorted by id, no zero scales
# (see adapters.py); () is the base model alone.
AdapterSet = tuple[tuple[int, float], ...]

# Where a media item sits in a ChatTurn's content. Random per process, so no text a client
# sends can stand for an image.
MEDIA_MARKER: Final = f"<__edgeserve_media_{secrets.token_hex(8)}__>"


@dataclass(frozen=True)
class EngineConfig:
    """How the model and context are loaded and scheduled."""

    model_path: str
    embedding_model_path: str | None = None
    draft_model_path: str | None = None
    n_ctx: int = 4096
    parallel: int = 4
    n_threads: int | None = None
    n_gpu_layers: int = -1
    n_batch: int = 2048
    prefill_chunk: int = 16
    max_queue: int = 64
    chat_template: str | None = None
    flash_attn: FlashAttnMode = "auto"
    draft_max: int = 16
    use_mmap: bool = True
    use_mlock: bool = False
    max_score_tokens: int = 65536
    grammar_step_limit_s: float = 2.0
    kv_cache_type: str = "f16"
    swa_full: bool = False
    mmproj_path: str | None = None
    max_media_pixels: int = 40_000_000
    max_media_tokens: int = 4096
    # LoRA adapters loaded with the model, as (name, GGUF path); their ids are their places.
    lora_adapters: tuple[tuple[str, str], ...] = ()
    # The folder adapters load from at run time (None: the folders of `lora_adapters`), and
    # the most adapters loaded at once, those loaded with the model included.
    lora_dir: str | None = None
    max_loras: int = 8
    # The prompt cache's tiers below the KV cache (prompt_store.py): bytes of host memory,
    # and a folder (None: no disk tier) with the most bytes its files may take.
    prompt_cache_ram: int = 0
    prompt_cache_dir: str | None = None
    prompt_cache_disk: int = 8 * 2**30


@dataclass(frozen=True)
class Media:
    """An image or audio clip as the client sent it (the file's bytes: png, jpeg, gif, bmp,
    webp; wav, mp3, flac); decoded and encoded through the projector on a prepare thread."""

    kind: MediaKind
    data: bytes


@dataclass(frozen=True)
class ChatTurn:
    """One message as the chat template sees it: `content` holds one MEDIA_MARKER per item
    of `media`, in order, where that item sits among the text."""

    role: str
    content: str
    media: tuple[Media, ...] = ()


@dataclass(frozen=True)
class GrammarSpec:
    """Constrained output: a GBNF grammar, any JSON object, or JSON matching a JSON schema."""

    kind: Literal["gbnf", "json_object", "json_schema"]
    text: str = ""


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence sampling; `temperature <= 0` or `do_sample=False` means greedy."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    stop: tuple[str, ...] = ()
    do_sample: bool = True
    grammar: GrammarSpec | None = None
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to arg-max."""
        return not self.do_sample or self.temperature <= 0.0

    @property
    def seeded(self) -> bool:
        """True when a seed asks for a sampled answer that repeats from run to run."""
        return self.seed is not None and not self.greedy


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation to render with the model's chat template."""

    messages: tuple[ChatTurn, ...]
    system: str | None = None
    tools: str | None = None


@dataclass(frozen=True)
class TokenPrompt:
    """A prompt given as token ids, used exactly as given (no BOS is added)."""

    ids: tuple[int, ...]


@dataclass(frozen=True)
class GenerationRequest:
    """Work for the engine: a prompt (chat, raw text or token ids), how to sample `n`
    answers, and the LoRA adapters to answer under."""

    prompt: ChatPrompt | str | TokenPrompt
    params: SamplingParams
    n: int = 1
    adapters: AdapterSet = ()


@dataclass(frozen=True)
class ScoreRequest:
    """Texts (raw text, BOS added as the model says, or token ids as given) to score by the
    model's log-probabilities (or a classifier head's logit)."""

    texts: tuple[str | TokenPrompt, ...]
    max_length: int | None = None
    reduction: Literal["mean", "sum"] = "mean"
    return_token_logprobs: bool = False
    top_logprobs: int | None = None
    adapters: AdapterSet = ()


@dataclass(frozen=True)
class EmbedRequest:
    """Texts (raw text, BOS added as the model says, or token ids as given) to embed."""

    texts: tuple[str | TokenPrompt, ...]
    adapters: AdapterSet = ()


@dataclass(frozen=True)
class EmbedResult:
    """One L2-normalised float32 vector per text, in request order, and the tokens read."""

    vectors: tuple[np.ndarray, ...]
    n_tokens: int


@dataclass(frozen=True)
class Tokenization:
    """Text to tokenize: BOS/EOS added as the model says when `add_special`, the text of
    special tokens (such as "<bos>") read as those tokens when `parse_special`."""

    text: str
    add_special: bool
    parse_special: bool


@dataclass(frozen=True)
class ScoreResult:
    """One score per text in request order, plus per-token log-probabilities when asked.

    With `ScoreRequest.top_logprobs` set, `tokens` describes each text's own tokens in order:
    `TokenLogprob.index` is the token's position in the text's tokens, with its bytes and
    alternatives. A BOS the model adds is position 0 and is not described; without one, the
    text's first token is described with no log-probability (nothing predicts it).
    """

    scores: tuple[float, ...]
    token_logprobs: tuple[tuple[float, ...], ...] | None = None
    n_tokens: int = 0
    tokens: tuple[tuple[TokenLogprob, ...], ...] | None = None


@dataclass(frozen=True)
class TextDelta:
    """New text for choice `index` (always whole UTF-8 characters). `generated` is how many
    tokens the choice has generated so far and `cached` how many of its prompt's tokens came
    from the prefix cache, so a request cut short before Finished still knows both."""

    index: int
    text: str
    generated: int = 0
    cached: int = 0


@dataclass(frozen=True)
class TokenLogprob:
    """Sent per sampled token when `SamplingParams.logprobs` is set: the token's log-probability
    under the model (before sampling adjustments) and the `logprobs` most likely alternatives.
    Also describes a scored text's token (see ScoreResult.tokens), where `logprob` is None for
    a first token that nothing predicts."""

    index: int
    token: bytes
    logprob: float | None
    top: tuple[tuple[bytes, float], ...] = ()


@dataclass(frozen=True)
class Finished:
    """Choice `index` ended; `stop_sequence` is the stop string that ended it, if one did."""

    index: int
    reason: FinishReason
    completion_tokens: int
    cached_tokens: int = 0
    stop_sequence: str | None = None
    drafted: int = 0  # tokens drafted by speculation for this choice, and how many were kept
    draft_accepted: int = 0
    # Seconds from admission until the prompt was read (media included), and from then until
    # this choice ended: measurements, not part of what the event says (equal events of two
    # runs compare equal).
    prompt_s: float = field(default=0.0, compare=False)
    decode_s: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class PromptInfo:
    """A prompt as queued for the engine: how many tokens it has."""

    prompt_tokens: int


@dataclass(frozen=True)
class TokenizerInfo:
    """The model's tokenizer as clients see it (vLLM's /tokenizer_info): the special tokens'
    text (None when the model has none), whether BOS/EOS are added, the chat template in use."""

    tokenizer_class: str
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    add_bos_token: bool
    add_eos_token: bool
    vocab_size: int
    model_max_length: int
    chat_template: str


@dataclass(frozen=True)
class CacheTierStats:
    """One tier of the prompt cache below the KV cache ("ram" or "disk"): the entries and
    bytes it holds, the restores it served and the lookups it could not serve."""

    tier: str
    entries: int
    bytes: int
    hits: int
    misses: int


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for /health and metrics."""

    loaded: bool
    n_ctx: int
    parallel: int
    busy_slots: int
    queue_length: int
    gpu_offload: bool
    n_gpu_layers: int
    # Whether the generation context runs flash attention, as llama.cpp resolved --flash-attn
    # (None while loading, or where its log did not say).
    flash_attn: bool | None = None
    scoring_jobs: int = 0
    kv_cells_used: int = 0
    draining: bool = False
    prefix_cache_hits: int = 0
    prefix_cached_tokens: int = 0
    prefix_cache_cells: int = 0
    prompt_cache_tiers: tuple[CacheTierStats, ...] = ()
    engine_steps: int = 0
    engine_restarts: int = 0
    draft_tokens: int = 0
    draft_accepted_tokens: int = 0
    draft_model: str | None = None  # the --draft-model file speculation drafts with
    # What the engine measured a step to cost (step_cost.py; 0 until measured): its fixed
    # part, each logit row, each prompt token beside them.
    step_fixed_seconds: float = 0.0
    step_row_seconds: float = 0.0
    step_prompt_token_seconds: float = 0.0
    # Seconds the engine thread spent in each phase of its steps (step_clock.py).
    phase_seconds: tuple[tuple[str, float], ...] = ()
