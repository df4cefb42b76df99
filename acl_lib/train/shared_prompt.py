"""GRPO's log-probabilities with each group's prompt encoded once (``SharedPromptGRPO``, the trainer of CPU runs).

TRL scores a batch of ``B = prompts x num_generations`` rows by running every row whole, prompt and completion:
the group's prompt goes through the model once per generation. At the mini profile's math stage the prompt is about
83% of a row's tokens. Here the distinct prompts (``U`` of them) run once, their keys and values are expanded to
the ``B`` rows (an index: the backward pass sums each prompt's gradient over its generations), and only the
completions run per row, over that cache:

    prompts (U, P) --backbone--> keys/values (U, ...), last hidden (U, 1, d)
        expand to rows (B, ...) --> completions (B, C) --backbone over the cache--> hidden (B, C, d)
    log-probabilities of completion token t from hidden position t - 1 (the prompt's last for t = 0)

Positions, padding and the attention mask are TRL's (positions count from the row's first column, pads included,
as in its one-pass forward), so the per-token log-probabilities and entropies are the same function of the same
inputs up to floating point: ``tests/test_train_shared_prompt.py`` compares them, the loss and its gradient with
TRL's own on a batch. The log-probabilities are computed at the trainer's temperature over the full vocabulary
(the mini model's 2,048 tokens: its logits are small); where the shortcut does not apply (DeepSpeed, activation
checkpointing, images, a mixture-of-experts auxiliary loss, a model without a ``base_model`` backbone) TRL's own
computation runs.

The loss also leaves out the rows whose advantage is 0 (a group whose rewards all agree: at the mini profile's
math stage often a third of a batch or more), which carry no gradient in the clipped objectives when there is no
KL term or entropy bonus (``zero_advantage_rows``); the loss keeps its normalisation, and the training log counts
the share skipped (``zero_advantage_rows_skipped``).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def _inner(model):
    """The causal LM inside a PEFT wrapper (the model itself without one)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _backbone_and_head(model):
    """The transformer backbone (``Qwen3Model``) and output layer of a causal LM, through a PEFT wrapper."""
    inner = _inner(model)
    backbone = getattr(inner, "base_model", None)
    if backbone is None or backbone is inner:
        return None, None
    return backbone, inner.get_output_embeddings()


def _checkpointing(model) -> bool:
    """Whether activation checkpointing is on (transformers then refuses the key-value cache the shortcut needs)."""
    return bool(getattr(_inner(model), "is_activation_checkpointing", False))


def shared_prompt_logps(backbone, head, input_ids, attention_mask, logits_to_keep: int, temperature: float,
                        compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities (and entropies) of the last ``logits_to_keep`` tokens of each row of
    ``input_ids`` (B, P + C), the rows' prompts (the first P columns, with their mask) each encoded once.
    Positions whose mask is 0 get 0, as TRL's fused head gives them."""
    from transformers import DynamicCache

    P = input_ids.size(1) - logits_to_keep
    prompts, prompt_mask = input_ids[:, :P], attention_mask[:, :P]
    keys = torch.cat([prompts, prompt_mask], dim=1)
    uniq, inverse = torch.unique(keys, dim=0, return_inverse=True)
    first = torch.full((uniq.size(0),), input_ids.size(0), dtype=torch.long, device=input_ids.device)
    first = first.scatter_reduce(0, inverse, torch.arange(input_ids.size(0), device=input_ids.device), "amin")
    cache = DynamicCache(config=backbone.config)
    out = backbone(input_ids=prompts[first], attention_mask=prompt_mask[first], past_key_values=cache, use_cache=True)
    expanded = DynamicCache(config=backbone.config)
    for i, layer in enumerate(cache.layers):
        expanded.update(layer.keys.index_select(0, inverse), layer.values.index_select(0, inverse), i)
    last = out.last_hidden_state[:, -1:].index_select(0, inverse)  # (B, 1, d): predicts completion token 0
    comp = backbone(input_ids=input_ids[:, P:], attention_mask=attention_mask, past_key_values=expanded,
                    use_cache=True).last_hidden_state  # (B, C, d)
    hidden = torch.cat([last, comp[:, :-1]], dim=1)  # position t - 1 predicts token t
    logits = F.linear(hidden, head.weight, head.bias).float() / temperature
    logp_all = logits.log_softmax(-1)
    labels = input_ids[:, P:]
    valid = attention_mask[:, P:] != 0
    logps = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1).masked_fill(~valid, 0.0)
    entropy = None
    if compute_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1).masked_fill(~valid, 0.0)
    return logps, entropy


@functools.cache
def trainer_class():
    """``SharedPromptGRPO``: TRL's ``GRPOTrainer`` whose log-probability passes encode each prompt once."""
    from trl import GRPOTrainer

    class SharedPromptGRPO(GRPOTrainer):
        """``GRPOTrainer`` with ``shared_prompt_logps`` for its log-probability passes where it applies."""

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                               **multimodal):
            unwrapped = self.accelerator.unwrap_model(model)
            backbone, head = _backbone_and_head(unwrapped)
            if (backbone is None or compute_aux_loss or self.is_deepspeed_enabled
                    or _checkpointing(unwrapped)
                    or any(v is not None for v in multimodal.values())):
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                    compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
            rows = batch_size or input_ids.size(0)
            logps, entropies = [], []
            with self.accelerator.autocast():
                for start in range(0, input_ids.size(0), rows):
                    lp, ent = shared_prompt_logps(backbone, head, input_ids[start:start + rows],
                                                  attention_mask[start:start + rows], logits_to_keep,
                                                  self.temperature, compute_entropy)
                    logps.append(lp)
                    entropies.append(ent)
            return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

        def _compute_loss(self, model, inputs):
            """TRL's loss over the rows whose advantage is not 0 (see ``zero_advantage_rows``), scaled so that it
            is the loss of the whole micro-batch; the share of rows skipped goes to the training log."""
            mode = "train" if self.model.training else "eval"
            keep = zero_advantage_rows(self, inputs)
            if keep is None:
                return super()._compute_loss(model, inputs)
            rows = inputs["advantages"].size(0)
            self._metrics[mode]["zero_advantage_rows_skipped"].append(1.0 - keep.numel() / rows)
            if keep.numel() == 0:
                # Every row's loss is 0: zero gradients (not none, so that Adam's moments move as TRL's do)
                return sum((p * 0).sum() for p in model.parameters() if p.requires_grad)
            sub = {k: (v.index_select(0, keep) if torch.is_tensor(v) and v.dim() and v.size(0) == rows else v)
                   for k, v in inputs.items()}
            loss = super()._compute_loss(model, sub)
            if self.loss_type == "bnpo":  # a token mean over the micro-batch's completion tokens
                mask = _loss_mask(inputs)
                return loss * (_loss_mask(sub).sum().clamp(min=1.0) / mask.sum().clamp(min=1.0))
            if self.loss_type in ("grpo", "dr_grpo"):  # a mean over the micro-batch's rows
                return loss * (keep.numel() / rows)
            return loss  # dapo: normalised by the generation batch's token count, whichever rows run

    return SharedPromptGRPO


_SKIPPABLE_LOSSES = ("dapo", "grpo", "bnpo", "dr_grpo")


def _loss_mask(inputs) -> torch.Tensor:
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask


def zero_advantage_rows(trainer, inputs) -> torch.Tensor | None:
    """Indices of the rows of a micro-batch whose loss can be nonzero, or None where every row must run.

    With the clipped objectives (``_SKIPPABLE_LOSSES``) a row whose advantage is 0 (a group whose rewards are all
    equal) has a per-token loss of ``-min(r * 0, clip(r) * 0) = 0`` whatever its ratio ``r``, hence no gradient,
    unless a KL term (``beta``), an entropy bonus, an entropy mask (a quantile over the whole batch) or a mixture-
    of-experts auxiliary loss adds to it: those cases run every row. Only in one process: under DDP or DeepSpeed
    a rank that skips its forward would leave its peers waiting in a collective."""
    adv = inputs.get("advantages")
    if (adv is None or trainer.loss_type not in _SKIPPABLE_LOSSES or trainer.beta != 0.0
            or trainer.aux_loss_enabled or getattr(trainer, "_entropy_bonus_enabled", False)
            or trainer.top_entropy_quantile < 1.0 or trainer.accelerator.num_processes != 1
            or any(k in inputs for k in ("pixel_values", "image_grid_thw", "token_type_ids"))):
        return None
    nonzero = adv.reshape(adv.size(0), -1).ne(0).any(dim=1)
    if bool(nonzero.all()):
        return None
    return nonzero.nonzero().squeeze(1)
