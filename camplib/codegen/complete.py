"""Code completion from the p01 model, and a text box that completes as you type.

Left to right: the prompt is the code before the cursor. Fill-in-the-middle (when there is code
after the cursor): the prompt is `<|fim_prefix|> before <|fim_suffix|> after <|fim_middle|>`
(camplib.codegen.fim.fim_prompt) and the model writes the middle, ending it with an end of text
as FIM training taught it.
"""
from __future__ import annotations

import html

import torch

from camplib.codegen.evaluate import continue_text
from camplib.codegen.fim import fim_prompt
from camplib.tokenizer import ByteBPE

__all__ = ["complete", "completion_box"]


def complete(model, bpe: ByteBPE, before: str, after: str = "", max_new_tokens: int = 24,
             temperature: float = 0.0, seed: int = 0) -> str:
    """What the model writes at the cursor (greedy by default). With `after`, FIM; without, the
    rest of the current line and the next ones, up to max_new_tokens."""
    prompt = fim_prompt(before, after) if after else before
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    return continue_text(model, bpe, prompt, max_new_tokens, temperature=temperature, generator=g)


def completion_box(model, bpe: ByteBPE, before: str = "def add(a, b):\n    return ", after: str = "",
                   max_new_tokens: int = 24):
    """An ipywidgets box: type code before and (optionally) after the cursor; the completion, in
    green between the two, updates on every keystroke. Returns the widget (display it)."""
    import ipywidgets as widgets

    before_box = widgets.Textarea(value=before, description="before", layout=widgets.Layout(width="95%", height="7em"))
    after_box = widgets.Textarea(value=after, description="after", placeholder="optional: code after the cursor (FIM)",
                                 layout=widgets.Layout(width="95%", height="3em"))
    tokens = widgets.IntSlider(value=max_new_tokens, min=4, max=64, description="new tokens")
    shown = widgets.HTML()

    def update(_=None):
        middle = complete(model, bpe, before_box.value, after_box.value, tokens.value)
        shown.value = ("<pre style='font-size: 90%'>" + html.escape(before_box.value)
                       + f"<span style='background:#c8f7c5'>{html.escape(middle)}</span>"
                       + html.escape(after_box.value) + "</pre>")

    for w in (before_box, after_box, tokens):
        w.observe(update, names="value")
    update()
    return widgets.VBox([before_box, after_box, tokens, shown])
