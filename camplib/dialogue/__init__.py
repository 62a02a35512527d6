"""camplib.dialogue: what project p02 (multi-turn dialogue) leaves behind.

`data` (the customer-service conversations, slots carried across turns, a held-out split),
`template` (the ChatML Jinja template with {% generation %} markers, and the same rendering in
Python), `chat_tokenizer` (one tokenizer interface for camplib's BPE and transformers'),
`masking` (ids and assistant mask of a conversation, padded batches whose padding is never
trained although pad == eos, the shifted masked cross-entropy), `sft` (LoRA fine-tuning, and
its plain-data form for a grader), `evaluate` (exact match, slot accuracy and stopping per turn)
and `base` (`load_base`: the tiny CI base, SmolLM2-135M-Instruct, or a p01 checkpoint).
"""
