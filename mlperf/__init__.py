"""Model core: the GPT-2 model and KV cache, tokenizers, checkpoints, corpus, prompt dataset, training, CLI."""
