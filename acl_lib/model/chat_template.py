"""The chat template of the locally built models, in the Qwen3 convention, and its response template.

Rendering (``CHAT_TEMPLATE``, Jinja, run by ``tokenizer.apply_chat_template``):

    <|im_start|>system
    {system prompt}

    # Tools
    ... <tools>
    {one JSON schema per line}
    </tools> ...<|im_end|>
    <|im_start|>user
    {user}<|im_end|>
    <|im_start|>assistant
    {content}
    <tool_call>
    {"name": "search", "arguments": {"query": "..."}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    {tool output}
    </tool_response>
    <tool_response>
    {output of a second call}
    </tool_response><|im_end|>
    <|im_start|>assistant
    ...

Properties the trainers rely on (docs/stack-notes.md):

- prefix-preserving: a message renders the same whatever follows it, except that consecutive ``tool``
  messages share one ``user`` turn (Qwen3 does the same; TRL appends a step's tool results together);
- the assistant's content, tool calls and closing ``<|im_end|>`` sit inside ``{% generation %}``, so
  ``return_assistant_tokens_mask=True`` (TRL ``assistant_only_loss``) trains exactly what the model
  writes; the newline after ``<|im_end|>`` is the template's, not the model's, and stays unmasked;
- a tool call renders exactly as ``acl_lib.chat.format_tool_call`` writes it (arguments given as a dict
  go through ``tojson``; a JSON string is copied verbatim);
- history is rendered verbatim: no ``<think>`` block is added or removed.

``RESPONSE_TEMPLATE`` is the declarative parser spec that ``tokenizer.parse_response`` (and TRL's
``parse_response`` in the GRPO tool loop) runs on generated text: free text up to ``<|im_end|>`` is
``content``, each ``<tool_call>...</tool_call>`` block is parsed as JSON into ``tool_calls``.
"""

from __future__ import annotations

# Special tokens (skipped by ``decode(skip_special_tokens=True)``).
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
# Added but not special: single tokens that decoding keeps, because parsers need to see them.
MARKUP_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Written for this project. Jinja whitespace control ("{%-" / "-%}") keeps the template's own layout out of
# the rendered text; every emitted character is an explicit string below.
CHAT_TEMPLATE = r"""
{%- macro text_of(content) -%}
    {%- if content is none -%}
    {%- elif content is string -%}{{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {#- a list of {"type": "text", "text": ...} parts -#}
        {%- for part in content -%}{%- if part.text is defined -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
    {%- else -%}{{- content | tojson -}}
    {%- endif -%}
{%- endmacro -%}

{%- if messages and messages[0].role == 'system' -%}
    {%- set system_text = text_of(messages[0].content) -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set system_text = none -%}
    {%- set turns = messages -%}
{%- endif -%}

{#- System turn: the system prompt, then the tool signatures. -#}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if system_text -%}{{- system_text + '\n\n' -}}{%- endif -%}
    {{- '# Tools\n\nYou can call functions to help with the task. Their signatures are listed inside <tools></tools> XML tags, one JSON schema per line:\n<tools>' -}}
    {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\n</tools>\n\nTo call a function, write a JSON object with its name and arguments inside <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system_text is not none -%}
    {{- '<|im_start|>system\n' + system_text + '<|im_end|>\n' -}}
{%- endif -%}

{%- for message in turns -%}
    {%- if message.role in ['user', 'system'] -%}
        {{- '<|im_start|>' + message.role + '\n' + text_of(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set content = text_of(message.content) -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- generation -%}
        {{- content -}}
        {%- for call in (message.tool_calls or []) -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
            {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}
            {%- if fn.arguments is string -%}{{- fn.arguments -}}
            {%- elif fn.arguments is none or fn.arguments is undefined -%}{{- '{}' -}}
            {%- else -%}{{- fn.arguments | tojson -}}
            {%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>' -}}
        {%- endgeneration -%}
        {{- '\n' -}}
    {%- elif message.role == 'tool' -%}
        {#- Consecutive tool results share one user turn. -#}
        {%- if loop.first or turns[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + text_of(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or turns[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- else -%}
        {{- raise_exception('unknown chat role: ' + message.role) -}}
    {%- endif -%}
{%- endfor -%}

{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""  # noqa: E501 - the tool instructions are single Jinja literals: wrapping them would change the template

# The parser spec ``tokenizer.parse_response`` runs (transformers >= 5.13 ``response_template`` format).
# ``start_anchor``: generation starts after the last assistant header of the prompt. Text outside tool-call
# blocks is ``content`` (a ``<think>`` block, if any, stays in it: the template renders history verbatim).
RESPONSE_TEMPLATE: dict = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {
            "close_pattern": r"<\|im_end\|>\s*",
            "content": "text",
        },
    },
}


def render_chat(messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = False) -> str:
    """Render a conversation with ``CHAT_TEMPLATE`` without needing a tokenizer (e.g. to build the corpus
    a tokenizer is trained on). Same text as ``tokenizer.apply_chat_template(..., tokenize=False)``."""
    # Imported here: the module's constants must be importable without loading transformers.
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=tools or None,
        chat_template=CHAT_TEMPLATE,
        add_generation_prompt=add_generation_prompt,
    )
    return rendered[0]
