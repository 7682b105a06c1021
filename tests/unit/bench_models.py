"""A tiny vocabulary-only GGUF (written with the `gguf` package) for the bench's model tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import gguf

from tests.fixtures.gguf_files import write_gguf

# SmolLM2's shape: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 (its eos), a FIM repo-name
# token, words, and control tokens that end nothing.
SMOL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>",
               "hello", "world", "<start_of_turn>")  # fmt: skip
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def vocab_gguf(
    path: Path,
    tokens: Sequence[str] = SMOL_TOKENS,
    eos: int | None = 2,
    eot: int | None = None,
    arch: str = "llama",
    template: str | None = CHATML,
) -> Path:
    """Write a GGUF that holds only a vocabulary (`tokens`, control-typed when they look like
    <...>), its eos/eot ids, the architecture and the chat template (None: none)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(list(tokens))
    control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL
    writer.add_token_types([control if t.startswith("<") else normal for t in tokens])
    if eos is not None:
        writer.add_eos_token_id(eos)
    if eot is not None:
        writer.add_eot_token_id(eot)
    if template is not None:
        writer.add_chat_template(template)
    write_gguf(writer, {})
    return path
