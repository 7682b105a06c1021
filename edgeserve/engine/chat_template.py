"""Chat templates: the GGUF's own Jinja template in a sandbox, or a fallback by architecture."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgeserve.engine.types import ChatPrompt
from edgeserve.errors import InvalidPrompt

GEMMA = """\
{{- bos_token -}}
{%- set ns = namespace(prefix='') -%}
{%- if messages and messages[0].role == 'system' -%}
{%- set ns.prefix = messages[0].content ~ '\\n\\n' -%}
{%- set turns = messages[1:] -%}
{%- else -%}
{%- set turns = messages -%}
{%- endif -%}
{%- for m in turns -%}
{%- set role = 'model' if m.role in ('assistant', 'function') else 'user' -%}
<start_of_turn>{{ role }}
{% if loop.first %}{{ ns.prefix }}{% endif %}{{ m.content | trim }}<end_of_turn>
{% endfor -%}
{%- if add_generation_prompt %}<start_of_turn>model
{% endif -%}
"""

CHATML = """\
{%- for m in messages -%}
{%- set role = 'assistant' if m.role == 'function' else m.role -%}
<|im_start|>{{ role }}
{{ m.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""

LLAMA3 = """\
{{- bos_token -}}
{%- for m in messages -%}
{%- set role = {'function': 'assistant', 'tool': 'ipython'}.get(m.role, m.role) -%}
<|start_header_id|>{{ role }}<|end_header_id|>

{{ m.content | trim }}<|eot_id|>
{%- endfor -%}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif -%}
"""

BUILTIN = {"gemma": GEMMA, "chatml": CHATML, "llama3": LLAMA3}
_BY_ARCHITECTURE = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "llama": "llama3"}

TOOLS_PREAMBLE = (
    "You can call these functions. To call one, answer with a JSON object "
    '{{"name": <function name>, "arguments": <arguments object>}} and nothing else.\n'
    "Functions:\n{tools}"
)


def resolve_template(override: str | None, gguf_template: str | None, architecture: str) -> str:
    """Pick the template source: an override (builtin name or file), the GGUF's, or a fallback."""
    if override:
        if override in BUILTIN:
            return BUILTIN[override]
        path = Path(override)
        if not path.is_file():
            names = ", ".join(sorted(BUILTIN))
            raise ValueError(f"chat template {override!r} is neither a file nor one of: {names}")
        return path.read_text(encoding="utf-8")
    if gguf_template:
        return gguf_template
    return BUILTIN[_BY_ARCHITECTURE.get(architecture, "chatml")]


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    """A compiled chat template; `render` turns a ChatPrompt into prompt text."""

    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(source)
        self._mentions_tools = "tools" in source
        self._bos = bos_token
        self._eos = eos_token

    def render(self, prompt: ChatPrompt) -> str:
        """Render the conversation with a generation prompt for the assistant's turn."""
        messages: list[dict[str, Any]] = [
            {"role": t.role, "content": t.content} for t in prompt.messages
        ]
        system = prompt.system
        tools = json.loads(prompt.tools) if prompt.tools else None
        if tools and not self._mentions_tools:
            note = TOOLS_PREAMBLE.format(tools=json.dumps(tools, ensure_ascii=False, indent=2))
            system = f"{system}\n\n{note}" if system else note
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        wrapped = [{"type": "function", "function": t} for t in tools] if tools else None
        try:
            return self._template.render(
                messages=messages,
                tools=wrapped,
                add_generation_prompt=True,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except TemplateError as exc:
            raise InvalidPrompt(f"The chat template rejected the conversation: {exc}") from exc
        except Exception as exc:  # a template is code from the GGUF: any error it raises is its own
            raise InvalidPrompt(f"The chat template failed on this conversation: {exc}") from exc
