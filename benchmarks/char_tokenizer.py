"""A character tokenizer built in code (no hub) for the tiny Qwen2 models of the benchmarks and of the tests
(`tests/helpers/tiny_lm.py` loads this file)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789 "
SPECIAL = ["<pad>", "<eos>", "<unk>"]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of ``CHARACTERS``; ``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIAL + list(CHARACTERS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
