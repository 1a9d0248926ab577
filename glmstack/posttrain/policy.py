"""The policy that samples rollouts: one interface for every RL path, in process (text or VL) or on a server.

Every RL path (reasoning RL `rl/rollouts.py`, agentic workers `agentic/worker.py`, VL RL `multimodal/rl.py`, the
held-out evaluation of each) asks a `Policy` for rollouts and pushes the trainer's weights to it; none of them
knows where the sampler runs:

    policy = make_policy(plain_copy, tokenizer)                                   # in process
    policy = make_policy(None, tokenizer, server=(url, name, key), weights_dir=D)  # `glmstack serve` / SGLang
    policy.push(full_state_dict, version=step)      # the unsharded weights; the version is the trainer step
    res = policy.generate(prompts, max_new_tokens, temperature=1.0, seeds=[...], media=None)
    res.logprobs          # the sampler's own, under its sampling transform (never re-scored)
    res.weight_versions   # per row: the version of the weights that generated it (a server reports its own)
    policy.generate(..., return_routes=True).routes   # per row: the experts it routed to (routing replay, rl/replay.py)

`EnginePolicy` holds a single-device copy of the policy: text models decode in inference.Engine, a GLMV (VL) in
inference.vision.generate_batch with each row's pixels (`media`); `dtype` (rl.rollout_dtype) and `perturb`
(rl.rollout_noise) make a controlled train/inference mismatch. `ServerPolicy` talks to an OpenAI-compatible server
(rl/remote.py's client): a push writes the weights to a disk the server reads (inside its --weight-root) and POSTs
/update_weights_from_disk, from rank 0 only, then every rank waits (no rank samples before the server runs them);
a LoRA policy pushes its adapters alone (`AdapterPush`, /v1/load_lora_adapter under the rollout model's name).
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from glmstack.inference.engine import GenerationResult
from glmstack.posttrain.rl.remote import ServerEngine
from glmstack.train import dist


def full_state(model) -> dict:
    """The trainer's whole policy state, a copy of its own on this rank: what every push sends (collective with
    several ranks: FSDP / expert shards gathered)."""
    if dist.is_dist():
        return dist.full_state_dict(model, everywhere=True)
    return {k: v.detach().cpu().clone() for k, v in dist.unwrap(model).state_dict().items()}


@dataclass
class AdapterPush:
    """A LoRA policy's adapters as a PEFT folder's contents (model/lora_peft.py): what a push to a server that
    serves LoRA sends instead of the whole model."""

    tensors: dict
    config: dict


def served_state(model, state: dict, lora: str = "adapter") -> dict | AdapterPush:
    """What a push to a rollout SERVER sends for a LoRA policy: its adapters alone (`lora` "adapter": the server
    loads them beside its base, /v1/load_lora_adapter, a few MB instead of the model) or `state` with the adapters
    folded into their base weights ("merged": W + s·BA, for servers without LoRA); `state` itself for a policy
    without LoRA. An in-process copy takes `state` as it is (it carries the adapters)."""
    from glmstack.model.lora import has_lora, merged_state_dict
    from glmstack.model.lora_peft import adapter_files

    inner = dist.unwrap(model)
    if not has_lora(inner):
        return state
    return AdapterPush(*adapter_files(inner, state=state)) if lora == "adapter" else merged_state_dict(inner, state)


def plain_copy(model, state: dict, cpu: bool = False):
    """A single-device copy of the trainer's policy holding `state` (never the trainer's tensors): the model an
    EnginePolicy samples with (a sharded trainer's copy is a fresh GLM). On the trainer's device unless `cpu` (an
    agentic worker, which may live in another process)."""
    import copy

    inner = dist.unwrap(model)
    if dist.optimizer_is_sharded(model):  # FSDP2 / expert shards: a fresh GLM, with the policy's adapters if any
        from glmstack.model import GLM
        from glmstack.model.lora import apply_lora, has_lora

        out = GLM(inner.cfg)
        if has_lora(inner):
            apply_lora(out, inner.lora_config)
        out.load_state_dict({k: v.clone() for k, v in state.items()}, assign=True)  # GLM() builds on meta
        return out
    out = copy.deepcopy(inner)  # whole on every rank (one process, DDP): a copy, a GLMV too
    return out.cpu() if cpu else out


class EnginePolicy:
    """The policy in this process (see the module docstring). `model`: its own copy (never the trainer's tensors)."""

    DECODE_ROWS = 32  # VL rows decoded together (their KV caches and pixels at once)

    def __init__(self, model, tokenizer=None, dtype: str = "float32", perturb=None, invariant: bool = False,
                 autocast: torch.dtype | None = None):  # fmt: skip
        """invariant (rl.true_on_policy): decode with the model's own forward in model/invariant.py's batch-invariant
        ops, so each sampled token's log-prob is the trainer's bit for bit; autocast: the trainer's autocast dtype
        (the same ops in the same precision on both sides)."""
        from glmstack.inference import Engine

        self.model = model.to(getattr(torch, dtype)).eval()
        self.tokenizer, self.perturb, self.version = tokenizer, perturb, None
        self.vision = hasattr(model, "visual")
        self.invariant, self.autocast = invariant, autocast
        if invariant and (self.vision or self.cfg.is_mla):
            raise ValueError("rl.true_on_policy: GQA text models only (MLA's absorbed decode and the VL decode have "
                             "kernels of their own that model/invariant.py does not cover)")  # fmt: skip
        self.engine = None if self.vision else Engine(self.model, tokenizer, fast=not invariant)

    @property
    def cfg(self):
        return self.model.cfg

    def push(self, state: dict, version: int | None) -> None:
        with torch.no_grad():
            self.model.load_state_dict(state)  # in place: the engine's fast path remakes its weight copies
        if self.perturb is not None:
            self.perturb(self.model)
        self.version = version

    def generate(self, prompts, max_new_tokens: int, *, temperature: float, top_p: float = 1.0, top_k: int = 0,
                 seeds, logprobs: bool = True, stop_ids=None, media=None, return_routes: bool = False,
                 budgets=None, stop_when=None) -> GenerationResult:  # fmt: skip
        """budgets / stop_when: per-row token budgets and an early stop (inference.engine.Request; partial
        rollouts), text models only."""
        if self.vision:
            if return_routes:
                raise ValueError("routing replay: a vision-language policy does not record its routes")
            res = self._generate_vision(prompts, max_new_tokens, temperature, top_p, top_k, seeds, media)
        else:
            if media is not None and any(m is not None for m in media):
                raise ValueError("this policy is a text model: it cannot take images")
            with self.numerics():
                res = self.engine.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                           top_p=top_p, top_k=top_k, seeds=seeds, logprobs=logprobs,
                                           stop_ids=stop_ids, return_routes=return_routes, budgets=budgets,
                                           stop_when=stop_when)  # fmt: skip
        res.weight_versions = [self.version] * len(prompts)
        return res

    def numerics(self) -> contextlib.ExitStack:
        """The trainer's numerics where true on-policy asks for them (batch-invariant ops, its autocast)."""
        return trainer_numerics(self.invariant, self.autocast, next(self.model.parameters()).device)

    def _generate_vision(self, prompts, max_new_tokens, temperature, top_p, top_k, seeds, media) -> GenerationResult:
        """Rows in chunks of DECODE_ROWS through inference.vision.generate_batch: prompts left-padded, each row's
        pixels (`media[i]`, a multimodal.processor.Media) concatenated in row order."""
        from glmstack.inference.vision import generate_batch
        from glmstack.multimodal.processor import Media

        eos, device = self.tokenizer.eos_ids, next(self.model.parameters()).device
        tokens, logps = [], []
        for k in range(0, len(prompts), self.DECODE_ROWS):
            rows = prompts[k : k + self.DECODE_ROWS]
            T = max(len(p) for p in rows)
            ids_BT, mask_BT = torch.zeros(len(rows), T, dtype=torch.long), torch.zeros(len(rows), T, dtype=torch.long)
            for b, p in enumerate(rows):
                ids_BT[b, T - len(p) :], mask_BT[b, T - len(p) :] = torch.tensor(p), 1
            pixels = Media.concat(media[k : k + len(rows)]).model_inputs()
            t, lp = generate_batch(self.model, ids_BT.to(device), **{n: v.to(device) for n, v in pixels.items()},
                                   max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                   seeds=seeds[k : k + len(rows)], stop_ids=eos, attention_mask=mask_BT.to(device),
                                   logprobs=True)  # fmt: skip
            tokens, logps = tokens + t, logps + lp
        stopped = [bool(t) and t[-1] in eos for t in tokens]
        text = [self.tokenizer.decode(t[:-1] if s else t) for t, s in zip(tokens, stopped)]
        return GenerationResult(tokens=tokens, text=text, finish_reason=["stop" if s else "length" for s in stopped],
                                logprobs=logps, seeds=list(seeds))  # fmt: skip


class ServerPolicy(ServerEngine):
    """The policy on an OpenAI-compatible server (see the module docstring); `weights_dir`: where pushes are
    written (inside the server's --weight-root), "" = a private temporary folder made on the first push."""

    def __init__(self, url: str, model: str, tokenizer=None, api_key: str | None = None, weights_dir: str = ""):
        super().__init__(url, model, tokenizer, api_key=api_key)
        self.weights_dir, self.folder, self.version = weights_dir, None, None

    def push(self, state: dict | None, version: int) -> None:
        """Rank 0 writes and posts the weights, every rank waits; `state` None: another process pushed them (an
        agentic worker only learns the version)."""
        if state is not None:
            if dist.rank() == 0:
                self._post(state, version)
            dist.barrier()
        self.version = version

    def _post(self, state: dict | AdapterPush, version: int) -> None:
        import httpx
        from safetensors.torch import save_file

        from glmstack.model.lora_peft import write_adapter

        if self.folder is None:
            self.folder = tempfile.TemporaryDirectory(prefix="glmstack-weights-", dir=self.weights_dir or None)
        if isinstance(state, AdapterPush):  # the adapters, served under this policy's model name
            path = str(write_adapter(Path(self.folder.name) / "adapter", state.tensors, state.config))
            route, body = "/v1/load_lora_adapter", {"lora_name": self.model, "lora_path": path, "load_inplace": True}
        else:
            path = str(Path(self.folder.name) / "weights.safetensors")
            save_file({k: v.detach().cpu().contiguous().clone() for k, v in state.items()}, path)
            route, body = "/update_weights_from_disk", {"model_path": path}
        auth = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        r = httpx.post(self.url + route, json=body | {"weight_version": version}, headers=auth, timeout=600)
        if r.status_code != 200:
            hint = (" (LoRA pushes load the adapters under the rollout model's name: start the server with "
                    "--enable-lora and give the adapters a name of their own, not the base's)"
                    if isinstance(state, AdapterPush) else "")  # fmt: skip
            raise RuntimeError(f"the rollout server refused the weights: {r.status_code} {r.text}{hint}")

    def generate(self, prompts, max_new_tokens: int, *, media=None, **kw) -> GenerationResult:
        if media is not None and any(m is not None for m in media):
            raise ValueError("server rollouts take token ids only: prompts with images roll out in process")
        res = super().generate(prompts, max_new_tokens, **kw)
        # a server that reports no version (vLLM) is taken at the pushed one
        res.weight_versions = [v if isinstance(v, int) else self.version for v in res.weight_versions]
        return res

    def close(self) -> None:
        if self.folder is not None:
            self.folder.cleanup()


def make_policy(model, tokenizer=None, *, server: tuple | None = None, weights_dir: str = "", dtype="float32",
                perturb=None, invariant: bool = False, autocast: torch.dtype | None = None):  # fmt: skip
    """`server` = (url, model name, API key or None): a ServerPolicy; else an EnginePolicy over `model` (a copy the
    caller made for it)."""
    if server:
        if invariant:
            raise ValueError("true on-policy rollouts run in process: a server's kernels are not the trainer's")
        return ServerPolicy(server[0], server[1], tokenizer, api_key=server[2], weights_dir=weights_dir)
    return EnginePolicy(model, tokenizer, dtype=dtype, perturb=perturb, invariant=invariant, autocast=autocast)


def trainer_numerics(invariant: bool, autocast: torch.dtype | None, device) -> contextlib.ExitStack:
    """A context with model/invariant.py's ops (when `invariant`) and the trainer's autocast (when given): what a
    true on-policy sampler and the trainer's forward both run under."""
    from glmstack.model.invariant import batch_invariant

    stack = contextlib.ExitStack()
    if invariant:
        stack.enter_context(batch_invariant())
    if autocast is not None:
        stack.enter_context(torch.autocast(torch.device(device).type, dtype=autocast))
    return stack
