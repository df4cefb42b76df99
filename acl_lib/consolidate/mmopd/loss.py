"""MMOPD's loss: the routed hybrid KL at the student's policy tokens, and the routing of rows to teachers.

At each policy position t with student distribution p and teacher q:

    reverse(t) = sum_v p(v) (log p(v) - log q(v))                         (every position)
    forward(t) = sum_{v in top_q(q)} q~(v) (log q~(v) - log p(v))         (q~: q renormalised over its top q tokens)
    loss       = mean_t [ reverse(t) + forward_weight * 1{H(q)_t > alpha} * forward(t) ]

alpha = None is infinity: no position qualifies and the loss is plain reverse KL. Each row is scored by the one
teacher that owns its domain (``route``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def hybrid_terms(student_logits, teacher_logits, alpha: float | None, top_q: int, forward_weight: float):
    """Per position (any leading shape, vocabulary last): ``(per_token, reverse, forward, high, entropy)`` of the
    mixed KL (module docstring); ``high`` is 1 where the teacher's entropy exceeds ``alpha`` (0 everywhere for
    alpha None or no forward weight), ``forward`` the forward term there."""
    import torch

    log_p = torch.log_softmax(student_logits.float(), dim=-1)
    with torch.no_grad():
        log_q = torch.log_softmax(teacher_logits.float(), dim=-1)
        entropy = -(log_q.exp() * log_q).sum(-1)
    reverse = (log_p.exp() * (log_p - log_q)).sum(-1)
    if alpha is None or forward_weight == 0.0:
        high = torch.zeros_like(entropy)
        forward = torch.zeros_like(reverse)
    else:
        high = (entropy > alpha).to(entropy.dtype)
        k = min(int(top_q), log_q.size(-1))
        top_logq, top_idx = log_q.topk(k, dim=-1)
        log_qt = top_logq - torch.logsumexp(top_logq, dim=-1, keepdim=True)  # the teacher renormalised over top q
        forward = (log_qt.exp() * (log_qt - log_p.gather(-1, top_idx))).sum(-1)
    return reverse + forward_weight * high * forward, reverse, forward, high, entropy


def _stats(sums, n, n_high) -> dict:
    """The logged statistics from sums over masked positions (``reverse``, ``forward`` over high ones, ``entropy``)."""
    return {"reverse": float(sums["reverse"] / max(n, 1.0)),
            "forward": float(sums["forward"] / max(n_high, 1.0)),
            "high_entropy_share": float(n_high / max(n, 1.0)),
            "teacher_entropy": float(sums["entropy"] / max(n, 1.0))}


def hybrid_kl(student_logits, teacher_logits, mask, alpha: float | None, top_q: int, forward_weight: float):
    """The mixed KL of the module docstring on whole logits. ``*_logits``: (B, T, V) at the positions predicting
    the completion tokens; ``mask``: (B, T), 1 at policy tokens. Returns ``(loss, stats)``: the mean over masked
    positions, and floats ``reverse`` (mean reverse KL), ``forward`` (mean forward term where it applies, 0 if
    nowhere), ``high_entropy_share`` (share of masked positions above ``alpha``), ``teacher_entropy``. The trainer
    uses ``chunked_hybrid_kl`` (the same loss without the full logits)."""
    per_token, reverse, forward, high, entropy = hybrid_terms(student_logits, teacher_logits, alpha, top_q,
                                                              forward_weight)
    m = mask.to(per_token.dtype)
    high = high * m
    n = float(m.sum())
    loss = (per_token * m).sum() / max(n, 1.0)
    sums = {"reverse": float((reverse.detach() * m).sum()), "forward": float((forward.detach() * high).sum()),
            "entropy": float((entropy * m).sum())}
    return loss, _stats(sums, n, float(high.sum()))


def chunked_hybrid_kl(student_hidden, student_head, teacher_hidden, teacher_heads, row_teacher, mask,
                      alpha: float | None, top_q: int, forward_weight: float, chunk_tokens: int):
    """``hybrid_kl`` from hidden states: the (B, T, V) logits of student and teacher never exist whole.

    ``*_hidden``: (B, T, H) final hidden states (after the last norm) at the positions predicting the completion
    tokens; ``student_head``: the student's output-embedding module; ``teacher_heads``: teacher name -> its head
    module; ``row_teacher``: each row's teacher name; ``mask``: (B, T). The masked positions of each teacher's rows
    are projected ``chunk_tokens`` at a time through both heads, inside activation checkpointing, so the backward
    recomputes a chunk's logits instead of keeping them: memory is a chunk's (chunk_tokens x V) logits, not the
    batch's (the paper profile's memory plan counts it). The heads are called as modules, so ZeRO-3 gathers the
    student's head for each call as it does in a plain forward. Same loss and gradients as ``hybrid_kl``."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def chunk_sums(hs, ht, head_t):
        logits_s = student_head(hs)
        with torch.no_grad():
            logits_t = head_t(ht.to(head_t.weight.dtype))
        per_token, reverse, forward, high, entropy = hybrid_terms(logits_s, logits_t, alpha, top_q, forward_weight)
        detached = torch.stack([reverse.detach().sum(), (forward.detach() * high).sum(), entropy.sum(), high.sum()])
        return per_token.sum(), detached

    n = float(mask.sum())
    total = student_hidden.new_zeros((), dtype=torch.float32)
    sums = {"reverse": 0.0, "forward": 0.0, "entropy": 0.0}
    n_high = 0.0
    for name in dict.fromkeys(row_teacher):
        rows = torch.tensor([i for i, t in enumerate(row_teacher) if t == name], device=mask.device)
        sub = torch.zeros_like(mask, dtype=torch.bool)
        sub[rows] = mask[rows].bool()
        pos = sub.nonzero(as_tuple=True)
        for start in range(0, len(pos[0]), chunk_tokens):
            b, t = pos[0][start:start + chunk_tokens], pos[1][start:start + chunk_tokens]
            hs = student_hidden[b, t]
            ht = teacher_hidden[b, t]
            part, d = checkpoint(chunk_sums, hs, ht, teacher_heads[name], use_reentrant=False)
            total = total + part
            sums["reverse"] += float(d[0])
            sums["forward"] += float(d[1])
            sums["entropy"] += float(d[2])
            n_high += float(d[3])
    return total / max(n, 1.0), _stats(sums, n, n_high)

def route(domains: Sequence[str], teacher_of: Mapping[str, str]) -> dict[str, list[int]]:
    """``{teacher: [row indices]}``: each row goes to the one teacher that owns its domain (no ensembling). A row
    whose domain has no teacher is an error naming it (a prompt mixture and a teacher map that disagree)."""
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(domains):
        if d not in teacher_of:
            raise KeyError(f"row {i} has domain {d!r} and no teacher owns it (teachers: {dict(teacher_of)})")
        groups.setdefault(teacher_of[d], []).append(i)
    return groups
