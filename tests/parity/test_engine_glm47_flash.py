"""GLM-4.7-Flash (MLA, no indexer, one MTP layer) through the inference engine: the KV cache holds MLA's latent and
rope key, and cached greedy decoding (absorbed and plain) and MTP speculative decoding equal a full recompute."""

import pytest
import torch

from glmstack.inference import Engine
from glmstack.model import GLM, ModelConfig

PROMPTS = [[5, 17, 300, 2, 9, 41, 7], [11], [400, 3, 3, 8]]
N_NEW = 12


@pytest.fixture(scope="module", params=[{}, {"q_lora_rank": None, "first_k_dense_replace": 0}],
                ids=["base", "no_q_lora"])
def model(request):
    return GLM(ModelConfig.preset("tiny-glm47-flash", **request.param)).init_weights(seed=0).eval()


@torch.inference_mode()
def naive(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_greedy_one_by_one_equals_naive(model):
    engine = Engine(model)
    assert engine.fast  # MLA: its attention module as it is, the rest on the fast path
    for p in PROMPTS:
        assert engine.generate([p], N_NEW, stop_ids=[]).tokens[0] == naive(model, p, N_NEW)


def test_batched_plain_and_speculative_equal_naive(model):
    ref = [naive(model, p, N_NEW) for p in PROMPTS]
    engine = Engine(model)
    assert engine.generate(PROMPTS, N_NEW, stop_ids=[]).tokens == ref
    assert engine.generate(PROMPTS, N_NEW, stop_ids=[], speculative="mtp", draft_k=2).tokens == ref
    for attn in model.attentions():  # the plain (MHA-mode) reference through the cache
        attn.absorb = False
    try:
        assert engine.generate(PROMPTS, N_NEW, stop_ids=[]).tokens == ref
    finally:
        for attn in model.attentions():
            attn.absorb = True


def test_kv_cache_holds_latent_and_rope_key_only(model):
    cfg = model.cfg
    assert all(a.cache_dims() == (cfg.kv_lora_rank, cfg.qk_rope_head_dim) for a in model.attentions())
    n_layers = cfg.num_hidden_layers + cfg.num_nextn_predict_layers
    assert model.kv_cache_bytes_per_token() == n_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2


def test_cli_loads_a_glm47_flash_folder(tmp_path, capsys, monkeypatch):
    """`glmstack generate` / `glmstack chat <folder>` on a GLM-4.7-Flash-layout folder (save_hf + a tokenizer)."""
    import io
    import sys

    from glmstack.inference.cli import chat_main, generate_main
    from glmstack.model import load_hf, save_hf
    from glmstack.tokenizer import Tokenizer

    save_hf(GLM(ModelConfig.preset("tiny-glm47-flash")).init_weights(seed=0), tmp_path)
    tok = Tokenizer.train(["hello world, the quick brown fox jumps over the lazy dog. " * 20], vocab_size=320)
    tok.save(tmp_path)
    assert generate_main([str(tmp_path), "--prompt", "hello world", "--max-new-tokens", "6"]) == 0
    ref = Engine(load_hf(tmp_path, dtype=torch.float32), Tokenizer.load(tmp_path)).generate(["hello world"], 6)
    assert capsys.readouterr().out == ref.text[0] + "\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n/exit\n"))
    assert chat_main([str(tmp_path), "--max-new-tokens", "4", "--temperature", "0"]) == 0
