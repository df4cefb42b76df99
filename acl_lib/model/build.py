"""The base checkpoint: build (mini, smoke) or point at (paper) the model every stage starts from.

- ``build_model(model_cfg, tokenizer)``: a randomly initialised ``Qwen3ForCausalLM`` sized by
  ``cfg.model``, with the tokenizer's eos / pad ids in its config and generation config.
- ``load_model_and_tokenizer(path_or_hub_id)``: the same ``AutoTokenizer`` / ``AutoModelForCausalLM`` calls
  that load Qwen3-8B-Base in the paper profile, plus the chat conventions the trainers need.
- ``save(model, tokenizer, directory)``: ``save_pretrained`` of both into one directory.
- ``base_corpus(cfg)``: chat-rendered text the tokenizer is trained on (and, later, the base pretrained on).

Building the base as a run of the run store (train the tokenizer, build, pretrain, evaluate) is the pipeline's
step ``acl_lib.pipeline.build_base``; this module only constructs and loads models.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM

from acl_lib.config import Config, ModelConfig
from acl_lib.model import base_checkpoint  # noqa: F401  (public here too)
from acl_lib.model.chat_template import IM_END, PAD_TOKEN, RESPONSE_TEMPLATE, render_chat
from acl_lib.model.corpus import base_corpus as corpus_with_counts
from acl_lib.model.tokenizer import train_tokenizer  # noqa: F401  (public here too: the base builder uses it)

# --- model ---------------------------------------------------------------------------------------------


def build_model(model_cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> Qwen3ForCausalLM:
    """A freshly initialised Qwen3 causal LM with ``len(tokenizer)`` embeddings (seed torch beforehand).

    eos = ``<|im_end|>`` (the end of an assistant turn: generation stops there), pad = ``<|endoftext|>``;
    bos = pad, as in Qwen3's own config (no bos token is ever prepended).
    """
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if eos is None or pad is None or eos == pad:
        raise ValueError(f"tokenizer needs distinct eos and pad tokens (eos={eos}, pad={pad})")
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_hidden_layers,
        num_attention_heads=model_cfg.num_attention_heads,
        num_key_value_heads=model_cfg.num_key_value_heads,
        head_dim=model_cfg.head_dim,
        max_position_embeddings=model_cfg.max_position_embeddings,
        tie_word_embeddings=model_cfg.tie_word_embeddings,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    model = Qwen3ForCausalLM(config).to(getattr(torch, model_cfg.dtype))
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = pad
    return model


def apply_chat_convention(model, tokenizer: PreTrainedTokenizerBase) -> None:
    """Make a loaded model + tokenizer follow the conventions the trainers rely on (docs/stack-notes.md).

    A no-op for checkpoints built here. For a hub base model in the Qwen3 convention (Qwen3-8B-Base ships
    eos = ``<|endoftext|>`` and no response template) it sets eos = ``<|im_end|>`` in the tokenizer and the
    generation config, pads on the left and installs a response template for TRL's tool-call parsing
    (TRL's own for a chat template it recognises, else ``RESPONSE_TEMPLATE``).
    """
    vocab = tokenizer.get_vocab()
    if tokenizer.eos_token != IM_END and IM_END in vocab:
        tokenizer.eos_token = IM_END
    if tokenizer.pad_token is None or tokenizer.pad_token == tokenizer.eos_token:
        if PAD_TOKEN not in vocab:
            raise ValueError(f"tokenizer has no pad token distinct from eos and no {PAD_TOKEN}")
        tokenizer.pad_token = PAD_TOKEN
    tokenizer.padding_side = "left"
    if getattr(tokenizer, "response_template", None) is None:
        from trl.chat_template_utils import add_response_schema

        try:  # a chat template TRL knows (Qwen3's own) gets TRL's parser for it
            add_response_schema(tokenizer)
        except ValueError:  # any other template in the Qwen3 convention: ours
            tokenizer.response_template = RESPONSE_TEMPLATE
    if model is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.config.eos_token_id = tokenizer.eos_token_id
        model.config.pad_token_id = tokenizer.pad_token_id


def load_model_and_tokenizer(path_or_hub_id: str | Path, dtype: str = "float32"):
    """Load ``(model, tokenizer)`` from a directory written by ``save`` or from a hub id.

    ``dtype``: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (the profile's ``model.dtype``).
    Under a DeepSpeed ZeRO-3 config already in effect (a trainer's arguments made first: transformers then loads
    through ``deepspeed.zero.Init``) each rank holds only its shard of the weights, never a whole copy.
    """
    tokenizer = load_tokenizer(path_or_hub_id)
    model = AutoModelForCausalLM.from_pretrained(str(path_or_hub_id), dtype=getattr(torch, dtype))
    apply_chat_convention(model, tokenizer)
    return model, tokenizer


def load_tokenizer(path_or_hub_id: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a checkpoint, with the chat conventions the trainers rely on (``apply_chat_convention``)."""
    tokenizer = AutoTokenizer.from_pretrained(str(path_or_hub_id))
    apply_chat_convention(None, tokenizer)
    return tokenizer


def save(model, tokenizer: PreTrainedTokenizerBase, directory: str | Path) -> Path:
    """``save_pretrained`` the model (safetensors + configs) and the tokenizer into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def count_parameters(model) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


# --- corpus --------------------------------------------------------------------------------------------

_NAMES = ("Ann", "Bo", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun")
_ITEMS = ("apples", "books", "coins", "marbles", "stamps", "shells", "cards", "pens")
_CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with integers and + - *.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 12 * (3 + 4)"}},
            "required": ["expression"],
        },
    },
}


def placeholder_corpus(n: int, seed: int = 0) -> list[str]:
    """PLACEHOLDER text for the base model until the mini worlds provide their own.

    ``n`` chat-rendered documents of three kinds: arithmetic word problems answered in the
    ``Answer: <value>`` convention (some with a ``<think>`` block), and calculator tool-call episodes
    (assistant ``<tool_call>``, ``<tool_response>``, final answer). Deterministic in ``seed``.
    """
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op = rng.choice("+-*")
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        kind = i % 3
        if kind == 0:
            question = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have?"
            value, work = a + b, f"{a} + {b} = {a + b}"
        else:
            question = f"What is {a} {op} {b}?"
            work = f"{a} {op} {b} = {value}"
        messages = [{"role": "system", "content": "Solve the problem. End with a line 'Answer: <value>'."}]
        messages.append({"role": "user", "content": question})
        tools = None
        if kind == 2:  # a calculator episode
            tools = [_CALCULATOR]
            arguments = json.dumps({"expression": f"{a} {op} {b}"})
            call = {"type": "function", "function": {"name": "calculator", "arguments": arguments}}
            messages += [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "calculator", "content": str(value)},
                {"role": "assistant", "content": f"Answer: {value}"},
            ]
        elif rng.random() < 0.5:
            messages.append({"role": "assistant", "content": f"<think>\n{work}\n</think>\n\nAnswer: {value}"})
        else:
            messages.append({"role": "assistant", "content": f"{work}\nAnswer: {value}"})
        docs.append(render_chat(messages, tools=tools))
    return docs


def base_corpus(cfg: Config) -> list[str]:
    """The documents the tokenizer is trained on and the base is pretrained on (see ``acl_lib.model.corpus``)."""
    return corpus_with_counts(cfg)[0]
