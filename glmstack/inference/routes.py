"""The experts the engine's routers chose for every token: the record routing replay (R3) trains with.

Why: a MoE policy's rollout engine and its trainer can route the same token to different experts (other kernels,
bf16 rollout weights, other batch shapes): in Megatron-LM#4168 ~10% of routers disagree per forward and 94% of tokens
differ in at least one layer. Rollout Routing Replay (R3, arXiv 2510.11370) records the engine's choice and makes the
trainer route each token the same way (GLM.forward(routes=), docs/rl.md "Routing replay").

How: while a RouteRecorder is active, every trunk MoE router appends its top-k to its `record` list (moe.Router) —
on the engine's fast path (inference/fast.py calls Router.forward) and on the reference path (GLM.forward) alike.
After each forward the caller names the original rows of the batch it ran (`add`); `take` lays each row's forwards
end to end: row b's routes `(n_b, L, K)` int16, L = trunk MoE layers, position t = the routing of the row's token t
(its prompt without the left padding, then its generated tokens). The last generated token is never fed, so a row
that generated m tokens after a p-token prompt has n_b = p + m - 1 (vLLM's `routed_experts`: seq_len - 1). MTP
layers are not recorded: plain decoding does not run them (speculative decoding refuses routes).

    rec = RouteRecorder(model)
    with rec:
        run.forward(ids_BP, pos_BP, cache); rec.add(range(B), start_B)     # a left-padded prefill
        run.forward(tok_B1, pos_B1, cache); rec.add(alive)                 # a decode step of the rows still running
    routes = rec.take(new_tokens_per_row)                                  # [(p_b + m_b - 1, L, K) int16]
    encode_routes(routes[0]) -> {"shape", "dtype": "int16", "data": base64}; decode_routes(that) -> the tensor
"""

from __future__ import annotations

from typing import Self

import torch

from glmstack.model.moe import MoE


def trunk_routers(model) -> list:
    """The routers of the trunk's MoE layers, in layer order (the L axis of a routes tensor)."""
    return [b.mlp.gate for b in model.layers if isinstance(b.mlp, MoE)]


class RouteRecorder:
    def __init__(self, model):
        self.routers = trunk_routers(model)
        if not self.routers:
            raise ValueError("routing record: the model has no MoE layer")
        self.steps: list[tuple[list[int], torch.Tensor, list[int]]] = []  # (rows, (N, T, L, K) int16, pad per row)

    def __enter__(self) -> Self:
        for r in self.routers:
            r.record = []
        return self

    def __exit__(self, *exc) -> None:
        for r in self.routers:
            r.record = None

    def pop(self, batch_size: int) -> torch.Tensor:
        """The routes of the forward just run, (N, T, L, K) int16 on its device (the serve scheduler's per-step use)."""
        if any(len(r.record) != 1 for r in self.routers):
            raise RuntimeError("routing record: each router must run once per recorded forward")
        idx_LNK = [r.record.pop() for r in self.routers]
        L, K = len(idx_LNK), idx_LNK[0].shape[-1]
        return torch.stack(idx_LNK, dim=1).view(batch_size, -1, L, K).to(torch.int16)

    def add(self, rows, start=None) -> None:
        """The forward just run: its batch row j is row rows[j]; start (N,): left padding per row (dropped)."""
        rows = list(rows)
        pad = [0] * len(rows) if start is None else [int(s) for s in start]
        self.steps.append((rows, self.pop(len(rows)), pad))

    def take(self, new_tokens: list[int]) -> list[torch.Tensor]:
        """Each row's routes on the CPU, (prompt + new_tokens[b] - 1, L, K) int16 (see the module docstring)."""
        pieces: list[list[torch.Tensor]] = [[] for _ in new_tokens]
        for rows, idx_NTLK, pad in self.steps:
            idx_NTLK = idx_NTLK.cpu()
            for j, b in enumerate(rows):
                pieces[b].append(idx_NTLK[j, pad[j] :])
        prompt = [p[0].shape[0] for p in pieces]  # the first forward of a row is its prefill
        out = []
        for b, m in enumerate(new_tokens):
            n = prompt[b] + m - 1
            routes = torch.cat(pieces[b])
            if routes.shape[0] < n:
                raise RuntimeError(f"routing record: row {b} has {routes.shape[0]} recorded positions, needs {n}")
            out.append(routes[:n].clone())
        return out


def encode_routes(routes: torch.Tensor) -> dict:
    """A routes tensor as JSON: {"shape": [n, L, K], "dtype": "int16", "data": base64 of the int16 values,
    little-endian, row-major} (the server's `routed_experts`; vLLM's dtype and shape, SGLang's base64)."""
    import base64

    import numpy as np

    values = routes.to(torch.int16).cpu().numpy().astype("<i2", copy=False)
    return {"shape": list(values.shape), "dtype": "int16",
            "data": base64.b64encode(np.ascontiguousarray(values).tobytes()).decode("ascii")}  # fmt: skip


def decode_routes(obj: dict) -> torch.Tensor:
    """encode_routes' inverse -> (n, L, K) int16."""
    import base64

    import numpy as np

    if obj.get("dtype") != "int16":
        raise ValueError(f"routed_experts: expected dtype int16, got {obj.get('dtype')!r}")
    values = np.frombuffer(base64.b64decode(obj["data"]), dtype="<i2").reshape(obj["shape"])
    return torch.from_numpy(values.astype(np.int16))
