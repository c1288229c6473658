"""Chat template rendering: HF-compatible environment, sandboxing and clear errors."""

from __future__ import annotations

import pytest
from model_layer_helpers import TINY_CHAT_TEMPLATE, train_tiny_tokenizer

from prefixcache.engine.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    chat_template_from_tokenizer_config,
)

# Exercises trim_blocks / lstrip_blocks whitespace, loop controls, tojson, tools, bos_token.
RICH_TEMPLATE = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] == 'system' and not loop.first %}
        {{ raise_exception('system message must come first') }}
    {% endif %}
    {% if message['role'] == 'tool' %}{% continue %}{% endif %}
<|{{ message['role'] }}|>{{ message['content'] | trim }}
{% endfor %}
{% if tools %}Tools: {{ tools | tojson }}
{% endif %}
{% if add_generation_prompt %}<|assistant|>{% generation %}{% endgeneration %}{% endif %}"""
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "  Héllo 日本 😀  "},
    {"role": "tool", "content": "ignored"},
    {"role": "assistant", "content": "Hi."},
]
TOOLS = [{"type": "function", "function": {"name": "météo", "parameters": {}}}]


def hf_tokenizer(template):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=train_tiny_tokenizer(), bos_token="<s>",
                                   eos_token="<|im_end|>", chat_template=template)


@pytest.mark.parametrize("template", [TINY_CHAT_TEMPLATE, RICH_TEMPLATE])
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_renders_like_transformers(template, generation_prompt):
    """Bitwise transformers' text, tools included where the template reads them (a template
    that does not gets them in its messages instead: the next test)."""
    ours = ChatTemplate(template, bos_token="<s>", eos_token="<|im_end|>")
    messages = MESSAGES if ours.uses_tools else [m for m in MESSAGES if m["role"] != "tool"]
    tools = TOOLS if ours.uses_tools else None
    expected = hf_tokenizer(template).apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt)
    assert ours.render(messages, tools=tools, add_generation_prompt=generation_prompt) == expected


def test_a_template_without_tools_gets_them_in_the_hermes_format():
    ours = ChatTemplate(TINY_CHAT_TEMPLATE, bos_token="<s>", eos_token="<|im_end|>")
    assert not ours.uses_tools and ChatTemplate(RICH_TEMPLATE).uses_tools
    call = {"id": "call_1", "type": "function",
            "function": {"name": "météo", "arguments": '{"ville": "Paris"}'}}
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "warm"},
    ]
    text = ours.render(conversation, tools=TOOLS)
    assert text.count("<|im_start|>system") == 1 and "Be brief.\n\n# Tools" in text
    assert '{"type": "function", "function": {"name": "météo", "parameters": {}}}' in text
    assert '<tool_call>\n{"name": "météo", "arguments": {"ville": "Paris"}}\n</tool_call>' in text
    # both results in one user turn, in order
    assert ("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n"
            "warm\n</tool_response>") in text
    assert "<|im_start|>tool" not in text
    with pytest.raises(ValueError, match="tools\\[0\\]"):
        ours.render(conversation, tools=[{"type": "retrieval"}])


def test_raise_exception_becomes_chat_template_error():
    template = ChatTemplate(RICH_TEMPLATE)
    with pytest.raises(ChatTemplateError, match="system message must come first"):
        template.render([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])


def test_sandbox_blocks_attribute_escapes():
    template = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user", "content": "x"}])
    mutate = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(ChatTemplateError):
        mutate.render([{"role": "user", "content": "x"}])


def test_openai_text_parts_are_joined():
    template = ChatTemplate(TINY_CHAT_TEMPLATE)
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]
    assert "Hello there<|im_end|>" in template.render([{"role": "user", "content": parts}])
    with pytest.raises(ChatTemplateError, match="only text content parts"):
        template.render([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    for part in ({"type": "text"}, {"type": "text", "text": 5}):
        with pytest.raises(ChatTemplateError, match="needs a string 'text'"):
            template.render([{"role": "user", "content": [part]}])


def test_bad_messages_and_bad_templates():
    with pytest.raises(ChatTemplateError, match="needs a 'role'"):
        ChatTemplate(TINY_CHAT_TEMPLATE).render([{"content": "no role"}])
    with pytest.raises(ChatTemplateError, match="'role' must be a string"):
        ChatTemplate(TINY_CHAT_TEMPLATE).render([{"role": 5, "content": "x"}])
    with pytest.raises(ChatTemplateError, match="content must be a string, a list of text"):
        ChatTemplate(TINY_CHAT_TEMPLATE).render([{"role": "user", "content": 7}])
    adds_content = ChatTemplate("{% for m in messages %}{{ m['n'] + m['content'] }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="failed on these messages"):
        adds_content.render([{"role": "user", "content": "x", "n": 1}])
    assert adds_content.render([{"role": "user", "content": "x", "n": "<"}]) == "<x"


def test_null_or_missing_content_renders_as_empty_text():
    template = ChatTemplate(TINY_CHAT_TEMPLATE)
    empty = template.render([{"role": "assistant", "content": ""}])
    assert template.render([{"role": "assistant", "content": None}]) == empty
    assert template.render([{"role": "assistant"}]) == empty
    assert "None" not in empty
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ValueError, match="non-empty"):
        ChatTemplate("")


def test_template_from_tokenizer_config():
    assert chat_template_from_tokenizer_config({"chat_template": "x"}) == "x"
    named = {"chat_template": [{"name": "tool_use", "template": "t"},
                               {"name": "default", "template": "d"}]}
    assert chat_template_from_tokenizer_config(named) == "d"
    assert chat_template_from_tokenizer_config(named, "tool_use") == "t"
    assert chat_template_from_tokenizer_config({}) is None
