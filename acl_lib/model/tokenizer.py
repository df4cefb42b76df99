"""Byte-level BPE tokenizer for the locally built models, in the Qwen3 chat convention.

- Byte-level: every string encodes, and ``decode(encode(text)) == text`` exactly.
- Digits are split one per token before BPE (arithmetic is learnable digit by digit; numbers never merge
  into opaque chunks).
- ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos) are special tokens; ``<think>``,
  ``</think>``, ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>`` are single added
  tokens that are *not* special, so ``decode(..., skip_special_tokens=True)`` keeps them for the parsers.
- The tokenizer carries ``CHAT_TEMPLATE`` and ``RESPONSE_TEMPLATE`` (``response_template`` attribute, saved
  in ``tokenizer_config.json``), and pads on the left (generation batches).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from acl_lib.model.chat_template import (
    CHAT_TEMPLATE,
    IM_END,
    MARKUP_TOKENS,
    PAD_TOKEN,
    RESPONSE_TEMPLATE,
    SPECIAL_TOKENS,
)


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # Digits first (one token per digit), then the GPT-2 byte-level split; no prefix space so text round-trips.
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def train_tokenizer(
    corpus: Iterable[str], vocab_size: int, model_max_length: int = 1024, min_frequency: int = 2,
    keep_whole: Iterable[str] = (),
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``corpus`` and wrap it for ``transformers``.

    Args:
        corpus: texts (a list or any iterator of strings); chat markup in them is fine.
        vocab_size: target ``len(tokenizer)``, special and markup tokens included. The result is smaller
            only when the corpus has too few distinct pairs to merge. Must exceed the 256 byte symbols
            plus the 9 chat tokens.
        model_max_length: longest sequence in tokens (the model's ``max_position_embeddings``).
        min_frequency: a pair is merged only if seen at least this often.
        keep_whole: words that must each be one token (e.g. a world's entity names): each is added with and
            without a leading space, out of the same ``vocab_size`` budget (the BPE gets fewer merges).
    """
    whole = [v for w in dict.fromkeys(keep_whole) for v in (w, " " + w)]
    n_fixed = 256 + len(SPECIAL_TOKENS) + len(MARKUP_TOKENS) + len(whole)
    if vocab_size <= n_fixed:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for merges (bytes + chat tokens = {n_fixed})")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        # Markup tokens are appended after training, so leave room for them in the target size.
        vocab_size=vocab_size - len(MARKUP_TOKENS) - len(whole),
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_without_markup(corpus), trainer=trainer)
    tok.add_tokens([AddedToken(v, special=False, normalized=False) for v in whole])
    return wrap_tokenizer(tok, model_max_length)


def _without_markup(corpus: Iterable[str]) -> Iterable[str]:
    # Chat tokens become single tokens anyway; keeping their characters out of BPE training stops merges
    # like "<|im" from wasting vocabulary.
    for text in corpus:
        for tok in (*SPECIAL_TOKENS, *MARKUP_TOKENS):
            text = text.replace(tok, "\n")
        yield text


def wrap_tokenizer(tok: Tokenizer, model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """Wrap a trained ``tokenizers.Tokenizer`` (special tokens already in its vocab) with the chat convention."""
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=AddedToken(IM_END, special=True, normalized=False),
        pad_token=AddedToken(PAD_TOKEN, special=True, normalized=False),
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (IM_END, PAD_TOKEN)],
        padding_side="left",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,  # keep decoding exact
        chat_template=CHAT_TEMPLATE,
    )
    fast.response_template = RESPONSE_TEMPLATE
    return fast
