"""The tiny causal LM of the TRL tests and benchmarks, built locally (there is no model
hub): a word-level tokenizer over twelve words and a random 2-layer Llama."""

from __future__ import annotations

from typing import Any

WORDS = "a b c d e f g h i j k l".split()


def word_tokenizer() -> Any:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    vocab.update({w: i + 4 for i, w in enumerate(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    # no token_type_ids: transformers 4 would hand them to a Llama's generate, which refuses them
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                                eos_token="<eos>", bos_token="<bos>",
                                                unk_token="<unk>",
                                                model_input_names=["input_ids", "attention_mask"])


def llama_config(tok: Any) -> Any:
    """Hidden size 16, 2 layers, 2 heads: small enough for a CPU training step."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1, bos_token_id=2)
