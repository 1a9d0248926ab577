"""ModelConfig: the GLM-4.5 family's architecture, with Hugging Face `glm4_moe` field names, and its presets.

Three HF model types share it: `glm4_moe` (GLM-4.5/4.6/4.7, GQA), `glm4_moe_lite` (GLM-4.7-Flash: the same MoE
with DeepSeek-V2 MLA attention, no indexer) and `glm_moe_dsa` (GLM-5: MLA + the DSA indexer).

Field names are exactly those of `config.json` (`transformers.Glm4MoeConfig`), so `from_hf` / `to_hf` are a flat
map; RoPE is kept flat here (`rope_theta`, `partial_rotary_factor`) and folded into transformers 5's
`rope_parameters` on the way out. A few glmstack-only training fields (`mtp_loss_weight`, ...) follow the HF
fields and never reach `config.json`. Released values: arXiv 2508.06471 Table 1 and the zai-org config files
(config.json of zai-org/GLM-4.5, GLM-4.5-Air, GLM-4.7-Flash and GLM-5 on the Hugging Face Hub).

    cfg = ModelConfig.preset("glm-4.5-air")
    cfg = ModelConfig.from_hf("path/to/checkpoint")      # folder, config.json path or dict
    d = cfg.to_hf()                                      # what save_hf writes as config.json
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmstack.config import ConfigError, from_dict

# HF keys that describe the file, not the architecture: kept verbatim in `hf_metadata` and written back.
HF_METADATA_KEYS = {
    "architectures", "torch_dtype", "dtype", "transformers_version", "bos_token_id", "eos_token_id",
    "pad_token_id", "_name_or_path", "use_cache", "output_attentions", "output_hidden_states",
    "output_router_logits", "return_dict", "id2label", "label2id", "problem_type", "chunk_size_feed_forward",
    "is_encoder_decoder", "tie_encoder_decoder", "quantization_config", "router_aux_loss_coef",
}
# HF keys we accept only with the one value our model implements (anything else would silently compute wrong).
HF_FIXED_KEYS = {
    "hidden_act": "silu", "attention_dropout": 0.0, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "moe_router_dtype": "float32", "rope_scaling": None, "moe_layer_freq": 1, "ep_size": 1, "pretraining_tp": 1,
}
HF_ALIASES = {"num_mtp_layers": "num_nextn_predict_layers", "num_local_experts": "n_routed_experts"}
HF_ALIAS_OF = {v: k for k, v in HF_ALIASES.items()}
# Fields a config.json must state (transformers' defaults for them describe some other model): the shape of every
# tensor depends on them, so a default would only fail later, on tensor shapes, naming no field.
REQUIRED_HF_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                      "num_hidden_layers", "num_attention_heads", "n_routed_experts", "num_experts_per_tok")
MODEL_TYPES = ("glm4_moe", "glm4_moe_lite", "glm_moe_dsa")  # GQA / MLA (mla.py) / MLA + DSA (mla.py, dsa.py)
MLA_TYPES = ("glm4_moe_lite", "glm_moe_dsa")
TRAINING_FIELDS = ("mtp_loss_weight", "aux_loss_weight", "use_grouped_mm", "num_mtp_depths", "dsa_stage",
                   "dsa_loss_weight", "fused_lm_loss", "embedding_grad_shrink")
# glmstack-only architecture options (GLM 2021, GLM-130B; glmstack/model/glm_options.py): written to config.json only
# when not at their default, so a default model's config.json is exactly transformers' (no key it does not know)
GLM_FAMILY_FIELDS = ("position_2d", "deepnorm")
# fields only some model types write to config.json
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_interleave")
DSA_FIELDS = ("indexer_rope_interleave", "index_topk", "index_head_dim", "index_n_heads", "indexer_types")
GQA_FIELDS = ("use_qk_norm",)
ARCHITECTURES = {"glm4_moe": "Glm4MoeForCausalLM", "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
                 "glm_moe_dsa": "GlmMoeDsaForCausalLM"}


@dataclass(kw_only=True)
class ModelConfig:
    model_type: str = "glm4_moe"  # HF model_type; selects the attention kind (see model.make_attention)
    vocab_size: int = 151552  # embedding rows (= LM-head rows)
    hidden_size: int = 4096  # residual width D
    intermediate_size: int = 10944  # SwiGLU width of the dense MLP in the first `first_k_dense_replace` layers
    moe_intermediate_size: int = 1408  # SwiGLU width of each routed expert (shared expert: x n_shared_experts)
    num_hidden_layers: int = 46  # decoder layers, MTP layers not counted
    num_attention_heads: int = 96  # query heads (GLM-4.5 uses 2.5x more heads than usual for its width)
    num_key_value_heads: int = 8  # GQA key/value heads
    head_dim: int = 128  # per-head width; q width = heads * head_dim may differ from hidden_size
    partial_rotary_factor: float = 0.5  # RoPE rotates the first partial_rotary_factor * head_dim dims of a head
    rope_theta: float = 1_000_000.0  # RoPE base (GLM-4.5 pre-trains at 1e4 and moves to 1e6 at 32K context)
    rms_norm_eps: float = 1e-5  # epsilon of every RMSNorm (incl. QK-Norm)
    attention_bias: bool = True  # bias on q/k/v projections (never on o_proj)
    use_qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (GLM-4.5/4.6/4.7 yes, Air no)
    n_routed_experts: int = 128  # routed experts E per MoE layer
    n_shared_experts: int = 1  # always-on experts, fused into one SwiGLU of width moe_intermediate_size * this
    num_experts_per_tok: int = 8  # experts K chosen per token
    n_group: int = 1  # expert groups for group-limited routing (DeepSeek-V3: 8; every GLM: 1)
    topk_group: int = 1  # groups kept per token
    norm_topk_prob: bool = True  # renormalise the K gate values to sum to 1 before scaling
    routed_scaling_factor: float = 1.0  # multiplies the routed gate values (GLM-4.5: 2.5, Air: 1.0)
    first_k_dense_replace: int = 1  # the first k layers use a dense MLP, the rest MoE
    num_nextn_predict_layers: int = 1  # MTP layers, stored in HF at layer index num_hidden_layers + d
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    max_position_embeddings: int = 131072  # longest context the checkpoint was trained for (metadata for RoPE)
    initializer_range: float = 0.02  # std of the normal init of every matrix
    # --- MLA (DeepSeek-V2 §2.1; glm4_moe_lite, glm_moe_dsa) + DSA indexer (DeepSeek-V3.2; glm_moe_dsa) = GLM-5 ---
    q_lora_rank: int | None = 2048  # MLA query latent width (q_a_proj -> RMSNorm -> q_b_proj); None: one q_proj
    kv_lora_rank: int = 512  # MLA key/value latent width: what the KV cache stores per token (+ the rope key)
    qk_nope_head_dim: int = 192  # per-head q/k dims without RoPE (decompressed from the latent)
    qk_rope_head_dim: int = 64  # per-head q dims with RoPE; the one shared decoupled rope key has this width
    v_head_dim: int = 256  # per-head value width
    rope_interleave: bool = True  # MLA RoPE on pairs (2i, 2i+1) (GLM-5) instead of half-split
    indexer_rope_interleave: bool = True  # same for the DSA indexer (GLM-5 yes; DeepSeek-V3.2 no)
    index_topk: int = 2048  # keys each query attends to under DSA
    index_head_dim: int = 128  # DSA indexer head width
    index_n_heads: int = 32  # DSA indexer heads
    indexer_types: list[str] | None = None  # per layer "full" (own indexer) / "shared" (IndexShare); None = all full
    hf_metadata: dict[str, Any] = field(default_factory=dict)  # eos/pad ids, dtype, ... : kept, written back
    # --- glmstack training fields (never written to config.json) ---
    mtp_loss_weight: float = 0.3  # lambda on mean MTP loss (GLM-4.5: 0.3 for 15T tokens, then 0.1)
    aux_loss_weight: float = 1e-4  # alpha on the sequence-wise balance loss (GLM-4.5: 1e-4)
    use_grouped_mm: bool = True  # experts via torch._grouped_mm (False: the plain per-expert loop reference)
    fused_lm_loss: bool = True  # LM/MTP loss fused with the head's matmul, no logits kept (loss.py; False: reference)
    num_mtp_depths: int = 0  # MTP depths in loss/drafting; past num_nextn_predict_layers the last MTP layer is
    #                          reused with shared parameters (GLM-5: 1 layer x 3 depths); 0 = one per layer
    dsa_stage: str = "select"  # DSA: dense | warmup (only indexers train) | sparse | select | frozen (dsa.py)
    dsa_loss_weight: float = 1.0  # gradient weight of the indexer KL in warmup/sparse (MCORE dsa_indexer_loss_coeff)
    embedding_grad_shrink: float = 1.0  # GLM-130B: emb = a*emb + (1-a)*emb.detach(); 1 = off, GLM-130B 0.1
    # --- GLM-family options (glm_options.py); at their defaults the model is GLM-4.5's ---
    position_2d: bool = False  # GLM (2021) blank infilling: position_ids (B, 2, T), 2D RoPE (glm_options.py)
    deepnorm: bool = False  # GLM-130B DeepNorm: Post-LN blocks x = norm(alpha*x + f(x)), beta-scaled init

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ConfigError("invalid ModelConfig: " + "; ".join(problems))

    # ---------------------------------------------------------------- validation
    def problems(self) -> list[str]:
        """One message per bad field (empty when the config is consistent)."""
        p = []
        positive = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim", "n_routed_experts",
                    "num_experts_per_tok", "n_group", "topk_group", "max_position_embeddings")
        p += [f"{k} must be > 0, got {getattr(self, k)}" for k in positive if getattr(self, k) <= 0]
        if p:
            return p
        if self.model_type not in MODEL_TYPES:
            p.append(f"model_type {self.model_type!r} is not supported (supported: {', '.join(MODEL_TYPES)})")
        if self.is_mla:
            p += self._mla_problems()
        if self.has_dsa:
            p += self._dsa_problems()
        if self.num_attention_heads % self.num_key_value_heads:
            p.append(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                     f"num_key_value_heads ({self.num_key_value_heads})")
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
            p.append(f"partial_rotary_factor ({self.partial_rotary_factor}) must give an even rotary dim in "
                     f"(0, head_dim={self.head_dim}], got {self.rotary_dim}")
        if self.n_routed_experts % self.n_group:
            p.append(f"n_routed_experts ({self.n_routed_experts}) must be divisible by n_group ({self.n_group})")
        if self.topk_group > self.n_group:
            p.append(f"topk_group ({self.topk_group}) must be <= n_group ({self.n_group})")
        if self.num_experts_per_tok > self.n_routed_experts:
            p.append(f"num_experts_per_tok ({self.num_experts_per_tok}) must be <= n_routed_experts "
                     f"({self.n_routed_experts})")
        elif self.num_experts_per_tok > self.topk_group * (self.n_routed_experts // self.n_group):
            p.append(f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds the experts in topk_group "
                     f"({self.topk_group}) groups")
        if self.n_group > 1 and self.n_routed_experts // self.n_group < 2:
            p.append(f"n_group ({self.n_group}) leaves fewer than 2 experts per group (group score = top-2 sum)")
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            p.append(f"first_k_dense_replace ({self.first_k_dense_replace}) must be in [0, num_hidden_layers]")
        for k in ("n_shared_experts", "num_nextn_predict_layers"):
            if getattr(self, k) < 0:
                p.append(f"{k} must be >= 0, got {getattr(self, k)}")
        if not 0 < self.embedding_grad_shrink <= 1:
            p.append(f"embedding_grad_shrink must be in (0, 1], got {self.embedding_grad_shrink}")
        if self.position_2d and (self.is_mla or self.rotary_dim % 4):
            p.append(f"position_2d needs GQA attention and a rotary dim divisible by 4, got {self.rotary_dim}")
        for k in ("rope_theta", "rms_norm_eps", "routed_scaling_factor", "initializer_range"):
            if getattr(self, k) <= 0:
                p.append(f"{k} must be > 0, got {getattr(self, k)}")
        return p

    # ---------------------------------------------------------------- derived sizes
    @property
    def rotary_dim(self) -> int:
        return self.qk_rope_head_dim if self.is_mla else int(self.head_dim * self.partial_rotary_factor)

    @property
    def is_mla(self) -> bool:
        """MLA attention (glmstack.model.mla: GLM-4.7-Flash, GLM-5) instead of GQA."""
        return self.model_type in MLA_TYPES

    @property
    def has_dsa(self) -> bool:
        """MLA with the DSA indexer (GLM-5)."""
        return self.model_type == "glm_moe_dsa"

    @property
    def mtp_depths(self) -> int:
        return self.num_mtp_depths or self.num_nextn_predict_layers

    def _mla_problems(self) -> list[str]:
        sizes = {k: getattr(self, k) for k in MLA_FIELDS[:5]}
        if self.q_lora_rank is None:  # no query latent: one q_proj
            del sizes["q_lora_rank"]
        p = [f"{k} must be > 0" for k, v in sizes.items() if v <= 0]
        if self.qk_rope_head_dim % 2:
            p.append("qk_rope_head_dim must be even")
        if self.num_key_value_heads != self.num_attention_heads:  # HF's MLA would repeat the decompressed heads
            p.append(f"num_key_value_heads ({self.num_key_value_heads}) must equal num_attention_heads "
                     f"({self.num_attention_heads}) in MLA (each head decompresses its own key and value)")
        if self.num_mtp_depths and not self.num_nextn_predict_layers:
            p.append("num_mtp_depths needs num_nextn_predict_layers >= 1")
        return p

    def _dsa_problems(self) -> list[str]:
        p = [f"{k} must be > 0" for k in DSA_FIELDS[1:4] if getattr(self, k) <= 0]
        if self.q_lora_rank is None:
            p.append("q_lora_rank must be set with the DSA indexer (it reads the query latent)")
        if self.index_head_dim < self.qk_rope_head_dim:
            p.append("qk_rope_head_dim must be <= index_head_dim")
        types = self.indexer_types
        if types is not None and (len(types) != self.num_hidden_layers or set(types) - {"full", "shared"}
                                  or types[0] != "full"):
            p.append(f"indexer_types must list 'full'/'shared' per layer, starting with 'full'; got {types}")
        if self.dsa_stage not in ("dense", "warmup", "sparse", "select", "frozen"):
            p.append(f"dsa_stage {self.dsa_stage!r} is not one of dense, warmup, sparse, select, frozen")
        return p

    @property
    def n_moe_layers(self) -> int:
        """MoE layers in the trunk plus one per MTP layer (MTP blocks are always MoE)."""
        return self.num_hidden_layers - self.first_k_dense_replace + self.num_nextn_predict_layers

    def is_moe_layer(self, layer_idx: int) -> bool:
        return layer_idx >= self.first_k_dense_replace

    # ---------------------------------------------------------------- HF conversion
    @classmethod
    def from_hf(cls, source: str | Path | dict, **overrides) -> ModelConfig:
        """Read an HF `config.json` (dict, file or checkpoint folder); harmless metadata is kept in hf_metadata.
        A file must name every REQUIRED_HF_FIELDS entry: the defaults describe one GLM, never the file's."""
        if not isinstance(source, dict):
            source = read_hf_config(source)
        data, meta = _split_hf_dict(copy.deepcopy(source))
        data["hf_metadata"] = meta
        return from_dict(cls, {**data, **overrides})

    def to_hf(self) -> dict:
        """The `config.json` dict as transformers 5 writes it (RoPE inside `rope_parameters`)."""
        drop = TRAINING_FIELDS + ("hf_metadata",) + (GQA_FIELDS if self.is_mla else MLA_FIELDS)
        drop += () if self.has_dsa else DSA_FIELDS
        drop += tuple(k for k in GLM_FAMILY_FIELDS if getattr(self, k) is False)  # default: transformers' keys only
        d = {k: v for k, v in dataclasses.asdict(self).items() if k not in drop}
        rope = {"rope_theta": d.pop("rope_theta"), "partial_rotary_factor": d.pop("partial_rotary_factor"),
                "rope_type": "default"}
        if self.is_mla:  # HF derives head_dim = qk_rope_head_dim and rotates all of it
            del rope["partial_rotary_factor"]
            d["head_dim"] = self.qk_rope_head_dim
        if self.has_dsa:
            d["indexer_types"] = self.indexer_types or ["full"] * self.num_hidden_layers
        if self.model_type == "glm4_moe_lite":  # Glm4MoeLiteConfig reads only this, never first_k_dense_replace
            k, n = self.first_k_dense_replace, self.num_hidden_layers
            d["mlp_layer_types"] = ["dense"] * k + ["sparse"] * (n - k)
        out = {"architectures": [ARCHITECTURES[self.model_type]], **d, "rope_parameters": rope, "hidden_act": "silu",
               "attention_dropout": 0.0}
        out.update({k: v for k, v in self.hf_metadata.items() if k not in out})
        return json.loads(json.dumps(out))

    # ---------------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str, **overrides) -> ModelConfig:
        if name not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
        return cls.from_hf(PRESETS[name], **overrides)


def read_hf_config(source: str | Path) -> dict:
    """The dict of a `config.json` (or a folder holding one); not JSON, not a mapping or a missing required field
    -> ConfigError naming the file and the field."""
    path, data = read_config_json(source)
    absent = [k for k in REQUIRED_HF_FIELDS if k not in data and HF_ALIAS_OF.get(k) not in data]
    if absent:
        raise ConfigError(f"{path}: missing required field(s) {', '.join(absent)}")
    return data


def read_config_json(source: str | Path) -> tuple[Path, dict]:
    """(path, dict) of a `config.json` or a folder holding one; missing, not JSON or not an object -> ConfigError."""
    path = Path(source)
    path = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (a checkpoint folder needs config.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return path, data


def _split_hf_dict(d: dict) -> tuple[dict, dict]:
    """Split an HF config dict into ModelConfig fields and metadata; a wrong fixed value is an error."""
    meta = {k: d.pop(k) for k in list(d) if k in HF_METADATA_KEYS}
    model_type = d.get("model_type")
    split_keys = {"glm_moe_dsa": _split_mla_keys, "glm4_moe_lite": _split_lite_keys}.get(model_type)
    bad = split_keys(d) if split_keys else []
    for key, want in HF_FIXED_KEYS.items():
        if key in d:
            got = d.pop(key)
            if got != want and not (key == "rope_scaling" and isinstance(got, dict) and _default_rope(got)):
                bad.append(f"{key}={got!r} is not supported (only {want!r})")
    for alias, name in HF_ALIASES.items():
        if alias in d:
            value = d.pop(alias)
            if name in d and d[name] != value:
                bad.append(f"{alias}={value!r} contradicts {name}={d[name]!r}")
            d[name] = value
    rope = d.pop("rope_parameters", None)
    if rope is not None:
        if not _default_rope(rope):
            bad.append(f"rope_parameters {rope!r}: only rope_type 'default' is supported")
        for k in ("rope_theta", "partial_rotary_factor"):
            if k in rope and k in d and d[k] != rope[k]:
                bad.append(f"{k}={d[k]!r} contradicts rope_parameters.{k}={rope[k]!r}")
            if k in rope:
                d[k] = rope[k]
    if model_type == "glm4_moe_lite" and d.pop("partial_rotary_factor", 1.0) != 1.0:
        bad.append("partial_rotary_factor must be 1.0 in a glm4_moe_lite config (RoPE covers qk_rope_head_dim)")
    if bad:
        raise ConfigError("unsupported HF config: " + "; ".join(bad))
    return d, meta


def _split_mla_keys(d: dict) -> list[str]:
    """glm_moe_dsa keys HF derives from others: check them and drop them; the IndexShare schedule -> indexer_types."""
    from glmstack.model.dsa import indexer_types_from_pattern

    bad, n = [], d.get("num_hidden_layers", 78)
    derived = {"qk_head_dim": d.get("qk_nope_head_dim", 192) + d.get("qk_rope_head_dim", 64),
               "head_dim": d.get("qk_rope_head_dim", 64), "mlp_bias": False,
               "layer_types": ["indexed_attention"] * n}
    k_dense = min(d.get("first_k_dense_replace", 1), n)
    derived["mlp_layer_types"] = ["dense"] * k_dense + ["sparse"] * (n - k_dense)
    for key, want in derived.items():
        if key in d and d.pop(key) != want:
            bad.append(f"{key} must be {want!r} (derived) in a glm_moe_dsa config")
    d["head_dim"] = derived["head_dim"]
    schedule = {k: d.pop(k) for k in ("index_topk_freq", "index_skip_topk_offset", "index_topk_pattern") if k in d}
    if d.get("indexer_types") is None and schedule:
        d["indexer_types"] = indexer_types_from_pattern(
            n, schedule.get("index_topk_freq", 1), schedule.get("index_skip_topk_offset", 2),
            schedule.get("index_topk_pattern"))
    return bad


def _split_lite_keys(d: dict) -> list[str]:
    """glm4_moe_lite keys HF derives from others: check and drop them; `mlp_layer_types` <-> first_k_dense_replace.

    transformers builds the dense/MoE pattern from `mlp_layer_types` alone (default: layer 0 dense), while the
    release's config.json also carries `first_k_dense_replace` (what vLLM reads): both must agree."""
    bad, n = [], d.get("num_hidden_layers", 47)
    rope_dim = d.get("qk_rope_head_dim", 64)
    derived = {"qk_head_dim": d.get("qk_nope_head_dim", 192) + rope_dim, "head_dim": rope_dim}
    for key, want in derived.items():
        if key in d and d.pop(key) != want:
            bad.append(f"{key} must be {want!r} (derived) in a glm4_moe_lite config")
    d["head_dim"] = rope_dim
    types = d.pop("mlp_layer_types", None)
    if types is not None:
        k = types.count("dense")
        if types != ["dense"] * k + ["sparse"] * (n - k):
            bad.append(f"mlp_layer_types must be {n} entries, 'dense' then 'sparse'; got {types}")
        elif d.setdefault("first_k_dense_replace", k) != k:
            bad.append(f"first_k_dense_replace={d['first_k_dense_replace']!r} contradicts mlp_layer_types ({k} dense)")
    return bad


def _default_rope(rope: dict) -> bool:
    return rope.get("rope_type", rope.get("type", "default")) == "default"


# ---------------------------------------------------------------- presets (HF dicts, exact released values)
_GLM_EOS = {"eos_token_id": [151329, 151336, 151338], "pad_token_id": 151329}
_GLM45 = dict(
    model_type="glm4_moe", vocab_size=151552, hidden_size=5120, intermediate_size=12288, moe_intermediate_size=1536,
    num_hidden_layers=92, num_attention_heads=96, num_key_value_heads=8, head_dim=128, partial_rotary_factor=0.5,
    rope_theta=1000000, rms_norm_eps=1e-5, attention_bias=True, use_qk_norm=True, n_routed_experts=160,
    n_shared_experts=1, num_experts_per_tok=8, n_group=1, topk_group=1, norm_topk_prob=True,
    routed_scaling_factor=2.5, first_k_dense_replace=3, num_nextn_predict_layers=1, tie_word_embeddings=False,
    max_position_embeddings=131072, initializer_range=0.02, torch_dtype="bfloat16", **_GLM_EOS,
)
_TINY = dict(
    model_type="glm4_moe", vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5,
    rope_theta=10000, rms_norm_eps=1e-5, attention_bias=True, use_qk_norm=True, n_routed_experts=8,
    n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=True,
    routed_scaling_factor=2.5, first_k_dense_replace=1, num_nextn_predict_layers=1, tie_word_embeddings=False,
    max_position_embeddings=4096, initializer_range=0.02,
)
# GLM-5: zai-org/GLM-5's config.json (arXiv 2602.15763); 744B total / 40B active
_GLM5 = dict(
    model_type="glm_moe_dsa", vocab_size=154880, hidden_size=6144, intermediate_size=12288, moe_intermediate_size=2048,
    num_hidden_layers=78, num_attention_heads=64, num_key_value_heads=64, head_dim=64, rope_theta=1000000,
    rms_norm_eps=1e-5, attention_bias=False, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
    n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=3,
    num_nextn_predict_layers=1, tie_word_embeddings=False, max_position_embeddings=202752, initializer_range=0.02,
    q_lora_rank=2048, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256,
    rope_interleave=True, indexer_rope_interleave=True, index_topk=2048, index_head_dim=128, index_n_heads=32,
    num_mtp_depths=3, torch_dtype="bfloat16", eos_token_id=[154820, 154827, 154829], pad_token_id=154820,
)
_TINY_GLM5 = {**{k: v for k, v in _GLM5.items() if k not in ("eos_token_id", "pad_token_id")}, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
              "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8,
              "rope_theta": 10000, "n_routed_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
              "max_position_embeddings": 4096, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
              "qk_rope_head_dim": 8, "v_head_dim": 16, "index_topk": 8, "index_head_dim": 16, "index_n_heads": 4}
# GLM-4.7-Flash: zai-org/GLM-4.7-Flash's config.json; "30B-A3B"
_GLM47_FLASH = dict(
    model_type="glm4_moe_lite", vocab_size=154880, hidden_size=2048, intermediate_size=10240,
    moe_intermediate_size=1536, num_hidden_layers=47, num_attention_heads=20, num_key_value_heads=20,
    rope_theta=1000000, partial_rotary_factor=1.0, rms_norm_eps=1e-5, attention_bias=False, n_routed_experts=64,
    n_shared_experts=1, num_experts_per_tok=4, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.8,
    first_k_dense_replace=1, num_nextn_predict_layers=1, tie_word_embeddings=False, max_position_embeddings=202752,
    initializer_range=0.02, q_lora_rank=768, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64,
    v_head_dim=256, rope_interleave=True, torch_dtype="bfloat16", eos_token_id=[154820, 154827, 154829],
    pad_token_id=154820,
)
_TINY_GLM47_FLASH = {**{k: v for k, v in _GLM47_FLASH.items() if k not in ("eos_token_id", "pad_token_id")},
                     "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
                     "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "rope_theta": 10000,
                     "n_routed_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 4096,
                     "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                     "v_head_dim": 16}
PRESETS: dict[str, dict] = {
    "glm-4.5": _GLM45,
    "glm-4.5-air": {**_GLM45, "hidden_size": 4096, "num_hidden_layers": 46, "first_k_dense_replace": 1,
                    "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 128,
                    "routed_scaling_factor": 1.0, "use_qk_norm": False},
    "glm-4.6": {**_GLM45, "max_position_embeddings": 202752},
    "glm-4.7": {**_GLM45, "max_position_embeddings": 202752},
    "tiny": _TINY,
    "glm-5": _GLM5,
    "tiny-glm5": _TINY_GLM5,
    "glm-4.7-flash": _GLM47_FLASH,
    "tiny-glm47-flash": _TINY_GLM47_FLASH,
    # the benchmark model (bench/model_throughput.py): wide enough that matmuls, not overheads, dominate
    "tiny-moe": {**_TINY, "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768,
                 "moe_intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8,
                 "num_key_value_heads": 2, "head_dim": 32, "n_routed_experts": 16, "num_experts_per_tok": 4},
}
