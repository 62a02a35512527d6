"""Project p01: a small Llama-style code-completion model pretrained on the Python standard library.

One idea per module:
- `fim`: fill-in-the-middle (prefix/suffix/middle sentinels, PSM order, a fraction of documents);
- `corpus`: the stdlib split (camplib.data) and its tokenizer (camplib.tokenizer) with the sentinels;
- `baselines`: the token n-gram model the trained model must beat;
- `metrics`: perplexity, bits per byte, next-line exact match, parse rate (plain formulas);
- `evaluate`: those metrics measured on a model (held-out losses, greedy next lines, samples);
- `pretrain`: building and pretraining the model with camplib.trainer, saving it for `camp serve`;
- `export_hf`: a folder `transformers.LlamaForCausalLM.from_pretrained` loads (via camplib.hf);
- `tuning`: the Optuna study (TPE sampler, median pruner on validation loss, trial and time budget);
- `tuning_harness`: synthetic learning curves, to check an objective's reporting and pruning fast;
- `complete`: completion (left-to-right or FIM) and the ipywidgets text box that shows it.
"""
