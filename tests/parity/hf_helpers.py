"""Shared helpers for the transformers parity tests: random tiny configs and fully randomised HF models."""

from __future__ import annotations

import torch

from glmstack.model import ModelConfig

# Six tiny configs that together cover: n_group > 1, norm_topk_prob false, QK-Norm on/off, attention bias on/off,
# first_k_dense_replace 0/1/2, tied and untied embeddings.
CASES = {
    "base": dict(),
    "groups_no_norm_topk": dict(n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
                                norm_topk_prob=False, first_k_dense_replace=0),
    "no_qknorm_no_bias": dict(use_qk_norm=False, attention_bias=False, first_k_dense_replace=2),
    "tied": dict(tie_word_embeddings=True, routed_scaling_factor=1.0),
    "mha_full_rope": dict(num_key_value_heads=4, partial_rotary_factor=1.0, n_shared_experts=2,
                          first_k_dense_replace=0),
    "groups_tied_2dense": dict(n_routed_experts=16, n_group=4, topk_group=1, num_experts_per_tok=4,
                               tie_word_embeddings=True, use_qk_norm=False, first_k_dense_replace=2,
                               num_hidden_layers=4),
}


def tiny_config(case: str, **extra) -> ModelConfig:
    return ModelConfig.preset("tiny", **{**CASES[case], **extra})


# model_type -> transformers (config class, model class) names
HF_CLASSES = {
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM"),
    "glm4_moe_lite": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM"),
    "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM"),
}


def hf_model(cfg: ModelConfig, seed: int = 0):
    """transformers' model for cfg.model_type with every tensor random (incl. norms, biases, correction bias)."""
    import transformers

    config_cls, model_cls = (getattr(transformers, n) for n in HF_CLASSES[cfg.model_type])
    torch.manual_seed(seed)
    model = model_cls(config_cls(**cfg.to_hf())).eval()
    randomise_(model)
    return model


def random_ids(cfg: ModelConfig, B: int = 2, T: int = 20, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def randomise_(model: torch.nn.Module, seed: int = 1) -> None:
    """HF inits norms to 1 and biases to 0; perturb them (and the balancing bias) so every path is exercised."""
    gen = torch.Generator().manual_seed(seed)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype)
        if name.endswith("norm.weight"):
            t.copy_(1 + 0.2 * noise)
        elif name.endswith(("bias", "e_score_correction_bias")):
            t.copy_(0.1 * noise)
        elif t.is_floating_point() and t.dim() >= 2:
            t.copy_(0.08 * noise)


def shifted_labels(ids: torch.Tensor) -> torch.Tensor:
    """glmstack's labels are already shifted: labels[:, t] = ids[:, t + 1], last = -100."""
    return torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)


def assert_lm_grads_match(ours, hf, ids: torch.Tensor, no_grad=lambda name: False) -> None:
    """Backward of both LM losses on `ids`; every parameter's gradient equals transformers' (the names map by the
    `model.` prefix), except those `no_grad(name)` says get none from the LM loss."""
    hf(ids, labels=ids).loss.backward()
    ours(ids, labels=shifted_labels(ids)).lm_loss.backward()
    for name, p in ours.named_parameters():
        if no_grad(name):
            assert p.grad is None, name
            continue
        hf_name = name if name == "lm_head.weight" else "model." + name
        torch.testing.assert_close(p.grad, hf.get_parameter(hf_name).grad, atol=1e-5, rtol=1e-4, msg=name)
