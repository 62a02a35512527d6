"""The chat template: ChatML role markers, written once as Jinja for `transformers` and once in
Python, and the two must render every conversation to the same text.

    <|im_start|>user\\nWhere is my order?<|im_end|>\\n<|im_start|>assistant\\nintent: ...<|im_end|>\\n

Each message is `<|im_start|>` + role + newline + content + `<|im_end|>` + newline (SmolLM2's
ChatML, so the same template serves the course's tiny model and SmolLM2-135M-Instruct). What a
model must learn to *write* is the assistant's content and the `<|im_end|>` that ends it: the
end-of-turn token is how generation knows to stop. The newline after it is never generated.

The Jinja version wraps exactly that part in `{% generation %}` ... `{% endgeneration %}`, which
is what `tokenizer.apply_chat_template(..., return_assistant_tokens_mask=True)` reads to mark
assistant tokens. SmolLM2's own template has no such markers, so with it that mask comes back
all zeros without a word of warning: a fine-tune "trained" on it learns nothing. `render`
returns the same character spans, so a mask can be checked against transformers'.
"""
from __future__ import annotations

__all__ = ["IM_START", "IM_END", "ENDOFTEXT", "SPECIAL_TOKENS", "CHAT_TEMPLATE", "render", "check_messages"]

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- message['content'] + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_ROLES = ("system", "user", "assistant")


def check_messages(messages) -> None:
    """A clear error for anything that is not a list of {"role", "content"} with known roles and
    content free of the markers (a marker inside content would forge a turn)."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be a dict with str 'role' and 'content', got {m!r:.80}")
        if m["role"] not in _ROLES:
            raise ValueError(f"message {i}: role {m['role']!r} is not one of {_ROLES}")
        if any(s in m["content"] for s in SPECIAL_TOKENS):
            raise ValueError(f"message {i}: its content contains a special token ({SPECIAL_TOKENS})")


def render(messages, add_generation_prompt: bool = False) -> tuple[str, list[tuple[int, int]]]:
    """(text, spans): the conversation as CHAT_TEMPLATE renders it, and the [start, end)
    character span of each assistant turn's trained part (content + <|im_end|>)."""
    check_messages(messages)
    parts, spans, length = [], [], 0
    for m in messages:
        header = f"{IM_START}{m['role']}\n"
        body = m["content"] + IM_END
        if m["role"] == "assistant":
            spans.append((length + len(header), length + len(header) + len(body)))
        piece = header + body + "\n"
        parts.append(piece)
        length += len(piece)
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts), spans
