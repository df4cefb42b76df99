"""The decode engine (acl_lib/eval/engine.py) against transformers' ``model.generate``: the same greedy transcripts
in every world of the suite, rows whose samples do not depend on their batch, the sampling rule, LoRA rows as PEFT
computes them, and clear errors for bad requests."""

from __future__ import annotations

import json

import pytest
import torch

from acl_lib.eval.engine import Engine, Row


@pytest.fixture(scope="module")
def base():
    """The shipped mini base (a real trained Qwen3, 2M parameters) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from acl_lib.config import load_config
    from acl_lib.model.shipped import shipped_dir

    d = shipped_dir(load_config("mini"))
    return AutoModelForCausalLM.from_pretrained(d).eval(), AutoTokenizer.from_pretrained(d)


@pytest.fixture(scope="module")
def tiny_model(base):
    return base[0]


@pytest.fixture(scope="module")
def prompts(base):
    """Chat prompts of many lengths, as the worlds render them."""
    tok = base[1]
    texts = ["What is 7 plus 5? End with Answer: N", "Write a haiku about tea, in lowercase.",
             "Find the capital of the country where the river Ondra rises.", "hi",
             "Cancel order #W123 for me, please: I ordered it twice by mistake and the card was charged.",
             "List three prime numbers above 40 as JSON."]
    out = []
    for i, t in enumerate(texts * 2):
        msgs = ([{"role": "system", "content": "You are helpful. " * (i % 4)}] if i % 3 else []) + \
            [{"role": "user", "content": t}]
        out.append(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
    return [tok(p, add_special_tokens=False)["input_ids"] for p in out]


@pytest.fixture(scope="module")
def stops(base):
    from acl_lib.eval.policies import stop_token_ids

    return stop_token_ids(base[1])


def _reference(model, ids, n, stops):
    seq = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=stops)[0, len(ids):].tolist()
    end = next((j for j, t in enumerate(seq) if t in stops), None)
    return seq[: end + 1] if end is not None else seq


def test_greedy_rows_of_every_length_generate_what_generate_does(tiny_model, prompts, stops):
    eng = Engine(tiny_model, stops, max_rows=5)
    res = eng.generate([Row(p) for p in prompts], max_new_tokens=40)
    for p, r in zip(prompts, res):
        assert r.tokens == _reference(tiny_model, p, 40, stops)
        assert r.stopped == (r.tokens[-1] in stops)
        assert r.kv[0][0].shape[1] == len(p) + len(r.tokens) - 1  # every token fed but the last
    lengths = {len(r.tokens) for r in res}
    assert len(lengths) >= 3 and eng.stats["compactions"] > 0  # rows ended at different steps and left the batch


def test_a_cached_prefix_continues_as_the_whole_prompt_does(tiny_model, stops):
    g = torch.Generator().manual_seed(1)
    system = torch.randint(3, 250, (30,), generator=g).tolist()
    tails = [torch.randint(3, 250, (int(n),), generator=g).tolist() for n in (1, 4, 9)]
    eng = Engine(tiny_model, stops)
    kv = eng.encode(system)
    assert kv[0][0].shape == (2, 30, 48)
    cached = eng.generate([Row(t, prefix=kv) for t in tails], max_new_tokens=10)
    whole = eng.generate([Row(system + t) for t in tails], max_new_tokens=10)
    for t, a, b in zip(tails, cached, whole):
        assert a.tokens == b.tokens == _reference(tiny_model, system + t, 10, stops)
        # the next turn starts from the row's own cache
        nxt = eng.generate([Row([7, 8], prefix=a.kv)], 6)[0].tokens
        assert nxt == _reference(tiny_model, system + t + a.tokens[:-1] + [7, 8], 6, stops)


def test_each_row_samples_from_its_own_stream_whatever_shares_its_batch(tiny_model, stops):
    eng = Engine(tiny_model, stops, max_rows=64)
    prompt = list(range(10, 40))

    def draw(seed, others):
        rows = [Row(list(range(50, 50 + k)), generator=torch.Generator().manual_seed(100 + k)) for k in others]
        at = len(rows) // 2
        rows.insert(at, Row(prompt, generator=torch.Generator().manual_seed(seed)))
        return eng.generate(rows, max_new_tokens=12, temperature=1.0, top_p=0.9)[at].tokens

    alone = draw(7, [])
    assert draw(7, [3, 9, 17]) == alone == draw(7, [5, 40, 2, 2, 11, 30])
    assert draw(8, []) != alone
    # the k samples of one prompt are encoded once and still differ
    rows = [Row(prompt, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    before = eng.stats["prefill_rows_shared"]
    outs = eng.generate(rows, max_new_tokens=12, temperature=1.0)
    assert eng.stats["prefill_rows_shared"] - before == 3
    assert len({tuple(o.tokens) for o in outs}) > 1
    with pytest.raises(ValueError, match="generator for every row"):
        eng.generate([Row(prompt)], 4, temperature=0.7)


def test_sampling_draws_from_the_temperature_and_top_p_distribution():
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    n = 20000
    uniforms = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    picks = Engine._pick(logits.expand(n, -1), uniforms, temperature=0.7, top_p=0.8)
    scores = TopPLogitsWarper(0.8)(None, logits / 0.7)
    want = scores.softmax(-1)[0]
    got = torch.bincount(picks, minlength=6).float() / n
    assert torch.all(got[want == 0] == 0)  # outside the nucleus: never drawn
    assert torch.allclose(got, want, atol=0.015), (got, want)
    assert torch.equal(Engine._pick(logits, None, 0.0, 1.0), torch.tensor([0]))
    # a nucleus wider than the top-k shortcut (a flat distribution): drawn over the whole vocabulary
    flat = torch.zeros(n, 300)
    wide = Engine._pick(flat, uniforms, temperature=1.0, top_p=0.9)
    assert wide.max() > Engine.NUCLEUS_K and len(set(wide.tolist())) > 250


def test_bad_requests_fail_clearly(tiny_model, stops):
    eng = Engine(tiny_model, stops)
    with pytest.raises(ValueError, match="empty prompt"):
        eng.generate([Row([])], 4)
    with pytest.raises(ValueError, match="exceed the model's context of 4096"):
        eng.generate([Row(list(range(3, 2003)) * 2)], 200)
    with pytest.raises(ValueError, match="exceed the model's context"):
        eng.generate([Row([5], prefix=eng.encode(list(range(3, 2003)) * 2))], 100)
    with pytest.raises(ValueError, match="adapter 'math' is not loaded"):
        eng.generate([Row([5, 6], adapter="math")], 4)
    with pytest.raises(ValueError, match="at least 1"):
        eng.generate([Row([5, 6])], 0)


def test_lora_rows_are_computed_as_peft_computes_them(tiny_model, prompts, stops):
    import copy

    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(tiny_model), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
                           adapter_name="expert_x")
    model.add_adapter("expert_y", LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # PEFT starts B at zero: give the adapters an effect
    model.eval()
    prompts = prompts[:4]
    names = ["expert_x", "expert_y", "__base__", "expert_x"]
    eng = Engine(model, stops)
    res = eng.generate([Row(p, adapter=n) for p, n in zip(prompts, names)], max_new_tokens=10)
    for p, n, r in zip(prompts, names, res):
        seq = model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=stops,
                             adapter_names=[n])[0, len(p):].tolist()
        end = next((j for j, t in enumerate(seq) if t == 255), None)
        assert r.tokens == (seq[: end + 1] if end is not None else seq), n
    assert len({tuple(r.tokens) for r in res[:3]}) == 3  # the adapters change what is generated


@pytest.mark.slow
def test_engine_greedy_transcripts_equal_generate_in_every_world(tmp_path):
    """The harness with the engine and with transformers' ``generate`` (one row at a time, whole prompts), on the
    shipped mini base, in every world of the suite: the same transcripts, episode by episode."""
    from acl_lib.config import load_config
    from acl_lib.eval.harness import evaluate
    from acl_lib.eval.policies import HFPolicy
    from acl_lib.model.shipped import shipped_dir

    cfg = load_config("smoke", [f"output_dir={tmp_path}", "worlds.n_test=3", "worlds.n_ood=2", "eval.max_turns=4",
                                "eval.temperature=0", "eval.limits={}"])
    base = str(shipped_dir(load_config("mini")))
    outs = {}
    for reference in (True, False):
        out = tmp_path / f"ref{reference}"
        evaluate(cfg, base, out, policy=HFPolicy(base, max_new_tokens=24, batch_size=8, reference=reference))
        outs[reference] = out
    keys = sorted(p.stem for p in (outs[True] / "records").glob("*.jsonl"))
    assert len(keys) == 11
    for key in keys:
        a, b = ((outs[r] / "records" / f"{key}.jsonl").read_text().splitlines() for r in (True, False))
        for x, y in zip(a, b, strict=True):
            assert json.loads(x)["messages"] == json.loads(y)["messages"], key
