"""Model builder, save/reload, the notebook-00 step, and TRL's trainers with our tokenizer."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from acl_lib.chat import format_tool_call
from acl_lib.config import load_config
from acl_lib.model import (
    BASE_SECTIONS,
    apply_chat_convention,
    base_checkpoint,
    build_model,
    count_parameters,
    load_model_and_tokenizer,
    placeholder_corpus,
    save,
    train_tokenizer,
)
from acl_lib.model.chat_template import IM_END, PAD_TOKEN, RESPONSE_TEMPLATE
from acl_lib.pipeline import build_base

torch.set_num_threads(1)


VOCAB = 384  # the placeholder corpus has enough pairs to fill this vocabulary


@pytest.fixture(scope="module")
def cfg():
    return load_config("smoke")


@pytest.fixture(scope="module")
def tok(cfg):
    return train_tokenizer(placeholder_corpus(200, seed=0), VOCAB)


@pytest.fixture(scope="module")
def model(cfg, tok):
    torch.manual_seed(0)
    return build_model(cfg.model, tok)


def test_build_model_matches_config_and_tokenizer(cfg, tok, model):
    c = model.config
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert c.vocab_size == len(tok) == VOCAB
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        cfg.model.hidden_size, cfg.model.num_hidden_layers, cfg.model.num_attention_heads,
        cfg.model.num_key_value_heads, cfg.model.head_dim,
    )
    im_end, pad = tok.convert_tokens_to_ids([IM_END, PAD_TOKEN])
    assert c.eos_token_id == model.generation_config.eos_token_id == im_end
    assert c.pad_token_id == model.generation_config.pad_token_id == pad
    assert model.get_input_embeddings().weight.shape == (len(tok), cfg.model.hidden_size)
    # Parameter count from the architecture: tied embeddings + per layer (attention, MLP, 4 norms) + final norm.
    h, i, L = cfg.model.hidden_size, cfg.model.intermediate_size, cfg.model.num_hidden_layers
    q, kv, d = cfg.model.num_attention_heads, cfg.model.num_key_value_heads, cfg.model.head_dim
    per_layer = h * q * d + 2 * h * kv * d + q * d * h + 3 * h * i + 2 * h + 2 * d
    assert count_parameters(model) == len(tok) * h + L * per_layer + h
    logits = model(torch.tensor([tok("What is 2+2?")["input_ids"]])).logits
    assert logits.shape[-1] == len(tok) and torch.isfinite(logits).all()


def test_generation_stops_at_im_end(cfg, tok):
    # All logits 0 except a bias on <|im_end|>: generate must emit it once and stop (generation_config eos).
    model = build_model(cfg.model, tok)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(torch.zeros_like(model.lm_head.weight))  # untied, zero
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**prompt, max_new_tokens=10, do_sample=False, sequence_bias={(tok.eos_token_id,): 5.0})
    assert out[0, prompt["input_ids"].shape[1] :].tolist() == [tok.eos_token_id]


def test_save_and_reload_gives_identical_logits(tok, model, tmp_path):
    save(model, tok, tmp_path)
    ids = torch.tensor([tok("<|im_start|>user\nWhat is 17 * 3?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]])
    with torch.no_grad():
        before = model(ids).logits
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
        after = reloaded(ids).logits
        m2, t2 = load_model_and_tokenizer(tmp_path)
        after2 = m2(ids).logits
    assert torch.equal(before, after) and torch.equal(before, after2)
    assert type(AutoTokenizer.from_pretrained(tmp_path)).__name__ == type(t2).__name__
    assert t2.response_template == RESPONSE_TEMPLATE and t2.eos_token == IM_END
    assert m2.generation_config.eos_token_id == t2.eos_token_id


def test_apply_chat_convention_fixes_a_base_style_tokenizer(tok, tmp_path):
    # Qwen3-8B-Base ships eos = <|endoftext|> (= pad) and no response template; emulate that.
    tok.save_pretrained(tmp_path)
    base_like = AutoTokenizer.from_pretrained(tmp_path)
    base_like.eos_token = PAD_TOKEN
    base_like.padding_side = "right"
    base_like.response_template = None
    apply_chat_convention(None, base_like)
    assert base_like.eos_token == IM_END and base_like.pad_token == PAD_TOKEN
    assert base_like.padding_side == "left" and base_like.response_template == RESPONSE_TEMPLATE


@pytest.mark.slow
def test_build_base_smoke_writes_a_complete_run_once(tmp_path):
    cfg = load_config("smoke", [f"output_dir={tmp_path}", "pretrain.corpus_chars=60000"])
    path = build_base(cfg)
    assert path == base_checkpoint(cfg) == str(tmp_path / "smoke" / "seed0" / "base" / "model")
    run_dir = tmp_path / "smoke" / "seed0" / "base"
    assert (run_dir / "COMPLETE.json").exists()
    info = json.loads((run_dir / "base.json").read_text())
    assert info["built_here"] and info["vocab_size"] <= cfg.model.vocab_size
    mix = cfg.pretrain.mix
    for domain, share in mix.items():  # every world got at least its share of the corpus
        assert info["corpus_sources"][domain]["chars"] >= cfg.pretrain.corpus_chars * share / sum(mix.values())
    model, tok = load_model_and_tokenizer(path)
    assert count_parameters(model) == info["parameters"] and len(tok) == info["vocab_size"]
    assert not list(run_dir.glob(".tmp-*"))  # the atomic dir was renamed into place
    stamp = (run_dir / "model" / "model.safetensors").stat().st_mtime_ns
    build_base(cfg)  # complete with the same config: skipped
    assert (run_dir / "model" / "model.safetensors").stat().st_mtime_ns == stamp
    assert BASE_SECTIONS == ("model", "pretrain", "worlds")


def test_build_base_paper_records_the_hub_id_and_trains_nothing(tmp_path):
    cfg = load_config("paper", [f"output_dir={tmp_path}"])
    # evaluate=False: scoring Qwen3-8B-Base needs the model from the Hub and a GPU (vLLM)
    assert build_base(cfg, evaluate=False) == "Qwen/Qwen3-8B-Base"
    run_dir = tmp_path / "paper" / "seed0" / "base"
    assert json.loads((run_dir / "base.json").read_text()) == {"base_model": "Qwen/Qwen3-8B-Base", "built_here": False}
    assert not (run_dir / "model").exists()


def test_placeholder_corpus_is_deterministic_chat_text():
    a, b = placeholder_corpus(30, seed=1), placeholder_corpus(30, seed=1)
    assert a == b and a != placeholder_corpus(30, seed=2) and len(a) == 30
    joined = "".join(a)
    for marker in ("<|im_start|>assistant\n", "<|im_end|>", "<tool_call>", "<tool_response>", "<think>", "Answer: "):
        assert marker in joined


def _tool_conversation(a: int, b: int) -> dict:
    # Arguments as a JSON string: Arrow would merge dict arguments of different rows into one struct.
    arguments = json.dumps({"expression": f"{a} * {b}"})
    call = {"type": "function", "function": {"name": "calculator", "arguments": arguments}}
    return {
        "messages": [
            {"role": "user", "content": f"What is {a} * {b}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": str(a * b)},
            {"role": "assistant", "content": f"Answer: {a * b}"},
        ]
    }


@pytest.mark.slow
def test_sft_trainer_assistant_only_loss_one_step(cfg, tok, tmp_path):
    from trl import SFTConfig, SFTTrainer

    torch.manual_seed(0)
    model = build_model(cfg.model, tok)
    data = Dataset.from_list([_tool_conversation(a, a + 3) for a in range(2, 10)])
    args = SFTConfig(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, assistant_only_loss=True,
        report_to=[], use_cpu=True, bf16=False, activation_checkpointing=False, save_strategy="no", logging_steps=1,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    row = trainer.train_dataset[0]
    # TRL turns the template's assistant mask into labels: -100 outside the assistant spans.
    trained = [(t, lab) for t, lab in zip(row["input_ids"], row["labels"]) if lab != -100]
    assert all(t == lab for t, lab in trained)
    masked = tok.decode([t for t, _ in trained])
    assert masked == format_tool_call("calculator", {"expression": "2 * 5"}) + "<|im_end|>Answer: 10<|im_end|>"
    before = [p.detach().clone() for p in model.parameters()]
    result = trainer.train()
    assert result.training_loss > 0 and torch.isfinite(torch.tensor(result.training_loss))
    assert any(not torch.equal(p0, p) for p0, p in zip(before, model.parameters()))


@pytest.mark.slow
def test_grpo_trainer_accepts_our_tokenizer_and_tools(cfg, tok, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: integers with + - * and parentheses.
        """
        return str(eval(expression, {"__builtins__": {}}))  # test-only tool on test-made strings

    def reward(completions, **kwargs):
        return [float("Answer:" in str(c)) for c in completions]

    torch.manual_seed(0)
    model = build_model(cfg.model, tok)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a} * 3?"}]} for a in range(4)])
    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=8, report_to=[], use_cpu=True, bf16=False, activation_checkpointing=False,
        save_strategy="no", beta=0.0, loss_type="dapo", logging_steps=1,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, tools=[calculator]
    )
    assert trainer.processing_class.response_template == RESPONSE_TEMPLATE  # ours kept, nothing guessed
    trainer.train()
    assert trainer.state.global_step == 1


def test_a_shipped_base_is_checked_against_its_card_before_use(tmp_path, cfg, tok, model):
    from acl_lib.model import shipped

    built = tmp_path / "built"
    save(model, tok, built)
    ship = tmp_path / "ship"
    config = {"model": cfg.model.model_dump(), "pretrain": cfg.pretrain.model_dump(), "worlds": {}}
    config["model"]["vocab_size"] = cfg.model.vocab_size
    card = shipped.write_shipped(built, ship, {
        "config": config, "parameters": count_parameters(model), "vocab_size": len(tok), "corpus_tokens": 1000,
        "tokens_seen": 4000, "wall_s": 60.0, "machine": "test", "built_at": "2026-12-01", "command": "pytest",
        "recipe_config_hash": "0" * 16, "context_copy": {"gain": 0.1}, "scores": {"aime26": 0.0}})
    assert "pytest" in (ship / "MODEL_CARD.md").read_text()
    assert card["sha256"] == shipped.sha256(ship / "model.safetensors")
    over = [f"output_dir={tmp_path / 'out'}", "pretrain.source=shipped", f"pretrain.shipped_dir={ship}"]
    shipped_cfg = load_config("smoke", over)
    path = build_base(shipped_cfg, evaluate=False)
    info = json.loads((tmp_path / "out" / "smoke" / "seed0" / "base" / "base.json").read_text())
    assert info["built_here"] is False and info["card"]["sha256"] == card["sha256"]
    weights = tmp_path / "out" / "smoke" / "seed0" / "base" / "model" / "model.safetensors"
    assert shipped.sha256(weights) == card["sha256"]
    assert path == base_checkpoint(shipped_cfg)
    # a shipped base does not depend on the worlds: changing them keeps it complete
    from acl_lib.model import base_run

    assert base_run(load_config("smoke", [*over, "worlds.seed=5"])).is_complete()
    # another architecture than the shipped one: refused before anything is copied
    with pytest.raises(ValueError, match="hidden_size"):
        shipped.verify(load_config("smoke", [*over, "model.hidden_size=96"]))
    # tampered weights: refused, naming the file
    data = bytearray((ship / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (ship / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="model.safetensors has sha256"):
        shipped.verify(shipped_cfg)
    (ship / "card.json").unlink()
    with pytest.raises(FileNotFoundError, match="model card"):
        shipped.read_card(shipped_cfg)
