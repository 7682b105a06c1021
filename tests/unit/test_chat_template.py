"""Chat templates: fallback by architecture, overrides, the GGUF's own template, sandboxing."""

from __future__ import annotations

import pytest

from edgeserve.engine.chat_template import BUILTIN, ChatTemplate, resolve_template
from edgeserve.engine.types import ChatPrompt, ChatTurn
from edgeserve.errors import InvalidPrompt


def gemma() -> ChatTemplate:
    return ChatTemplate(BUILTIN["gemma"], bos_token="<bos>", eos_token="<eos>")


def test_gemma_turns_with_system_folded_into_first_user_turn():
    prompt = ChatPrompt(
        messages=(
            ChatTurn("user", "Hi"),
            ChatTurn("assistant", "Hello!"),
            ChatTurn("user", " How are you? "),
        ),
        system="Be brief.",
    )
    assert gemma().render(prompt) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nHow are you?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_gemma_maps_tool_roles():
    prompt = ChatPrompt(
        messages=(
            ChatTurn("user", "weather?"),
            ChatTurn("function", '[{"name": "w", "arguments": "{}"}]'),
            ChatTurn("tool", "sunny"),
        )
    )
    text = gemma().render(prompt)
    assert "<start_of_turn>model\n[{" in text
    assert "<start_of_turn>user\nsunny<end_of_turn>" in text


def test_tools_become_a_system_note_when_the_template_ignores_them():
    prompt = ChatPrompt(
        messages=(ChatTurn("user", "hi"),),
        tools='[{"name": "get_weather", "description": "d", "parameters": {}}]',
    )
    text = gemma().render(prompt)
    assert text.index("get_weather") < text.index("\n\nhi<end_of_turn>")


def test_chatml_and_llama3_builtins_render():
    prompt = ChatPrompt(messages=(ChatTurn("user", "hi"),), system="sys")
    chatml = ChatTemplate(BUILTIN["chatml"], bos_token="", eos_token="").render(prompt)
    assert chatml == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )
    llama3 = ChatTemplate(BUILTIN["llama3"], bos_token="<B>", eos_token="").render(prompt)
    assert llama3.startswith("<B><|start_header_id|>system<|end_header_id|>\n\nsys<|eot_id|>")
    assert llama3.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_resolution_order(tmp_path):
    assert resolve_template(None, "{{ 'own' }}", "gemma3") == "{{ 'own' }}"
    assert resolve_template(None, None, "gemma3") == BUILTIN["gemma"]
    assert resolve_template(None, None, "qwen2") == BUILTIN["chatml"]
    assert resolve_template("chatml", "{{ 'own' }}", "gemma3") == BUILTIN["chatml"]
    custom = tmp_path / "t.jinja"
    custom.write_text("{{ messages[0].content }}")
    assert resolve_template(str(custom), None, "gemma3") == "{{ messages[0].content }}"
    with pytest.raises(ValueError, match="neither a file nor one of"):
        resolve_template("nope", None, "gemma3")


def test_template_errors_become_invalid_prompt():
    template = ChatTemplate(
        "{{ raise_exception('roles must alternate') }}", bos_token="", eos_token=""
    )
    with pytest.raises(InvalidPrompt, match="roles must alternate"):
        template.render(ChatPrompt(messages=(ChatTurn("user", "x"),)))


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages[0]['content'] + 1 }}",
        "{{ messages[5]['content'] }}{{ (messages | length) // 0 }}",
        "{{ '%d' % messages[0]['content'] }}",
    ],
)
def test_any_error_a_template_raises_is_invalid_prompt(source):
    template = ChatTemplate(source, bos_token="", eos_token="")
    with pytest.raises(InvalidPrompt, match="chat template"):
        template.render(ChatPrompt(messages=(ChatTurn("user", "x"),)))


def test_the_sandbox_blocks_attribute_escapes():
    template = ChatTemplate(
        "{{ messages.__class__.__mro__[1].__subclasses__() }}", bos_token="", eos_token=""
    )
    with pytest.raises(InvalidPrompt):
        template.render(ChatPrompt(messages=(ChatTurn("user", "x"),)))
