"""The special tokens of the p01 code model, in one place: the FIM sentinels (camplib.codegen.fim)
and the end of text that closes every document. A module of its own so that code which only
needs the names (the tokenizer, the lab's setup) does not import the FIM transform."""
EOT = "<|endoftext|>"
FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
FIM_TOKENS = (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)
SPECIAL_TOKENS = (EOT, *FIM_TOKENS)
