"""MMOPD's frozen teachers (``TeacherPool``): resident on the training device or offloaded to the CPU."""

from __future__ import annotations

from collections.abc import Mapping

from acl_lib.envs.llm_user import outside_zero3


class TeacherPool:
    """Frozen teacher models by name. ``placement``: "resident" (on ``device`` from the start) or "offload" (kept
    on the CPU; ``logits`` moves the routed teacher to ``device`` for its rows and back).

    Every rank holds its teachers whole. They are loaded outside ZeRO-3 (``llm_user.outside_zero3``): the MMOPD job
    builds its ``GRPOConfig(deepspeed=...)`` first, which registers the ZeRO-3 config with transformers, and a
    ``from_pretrained`` after it gets ``zero.Init`` placeholders that no DeepSpeed engine ever gathers (the first
    teacher forward failed: "'weight' must be 2-D"). A teacher is not trained: its forward needs no collective."""

    def __init__(self, model_dirs: Mapping[str, str], device, placement: str = "resident", dtype: str = "float32"):
        from acl_lib.model import load_model_and_tokenizer  # acl_lib.model.build loads torch and transformers

        if placement not in ("resident", "offload"):
            raise ValueError(f"teacher placement must be resident or offload, got {placement!r}")
        self.placement, self.device = placement, device
        self.models = {}
        for name, path in model_dirs.items():
            with outside_zero3():
                model, _ = load_model_and_tokenizer(path, dtype=dtype)
            model.eval().requires_grad_(False)
            self.models[name] = model.to(device if placement == "resident" else "cpu")

    def vocab_size(self, name: str) -> int:
        return self.models[name].config.get_text_config().vocab_size

    def head(self, name: str):
        """The teacher's output-embedding module, on the training device (an offloaded teacher's head stays there:
        the chunked loss's backward recomputes its logits after the body has gone back to the CPU)."""
        head = self.models[name].get_output_embeddings()
        if self.placement == "offload":
            head.to(self.device)
        return head

    def _on_device(self, name: str):
        model = self.models[name]
        if self.placement == "offload":
            model.to(self.device)
        return model

    def _back(self, name: str) -> None:
        if self.placement == "offload":
            model = self.models[name]
            head = model.get_output_embeddings()
            model.to("cpu")
            head.to(self.device)  # tied or not, the head is needed on the device by the chunked loss

    def logits(self, name: str, input_ids, attention_mask, logits_to_keep: int):
        """The teacher's logits at the last ``logits_to_keep`` positions (no gradient)."""
        import torch

        model = self._on_device(name)
        try:
            with torch.no_grad():
                return model(input_ids=input_ids, attention_mask=attention_mask,
                             logits_to_keep=logits_to_keep).logits
        finally:
            self._back(name)

    def hidden(self, name: str, input_ids, attention_mask, keep: int):
        """The teacher's final hidden states (after its last norm) at the last ``keep`` positions (no gradient)."""
        import torch

        model = self._on_device(name)
        try:
            with torch.no_grad():
                return model.get_decoder()(input_ids=input_ids,
                                           attention_mask=attention_mask).last_hidden_state[:, -keep:]
        finally:
            self._back(name)
