"""Rollout Routing Replay (R3, arXiv 2510.11370): train a MoE policy on the experts its rollout engine routed to.

Why: the rollout engine and the trainer compute the same policy with different kernels, batch shapes and (with
`rl.rollout_dtype=bfloat16`) weights, and a MoE router's top-k is discontinuous: a tiny difference flips an expert,
and the trainer's log-prob of a sampled token is then another function's (~10% of routers disagree per forward,
94% of tokens in at least one layer; three of three GRPO runs without replay collapsed: Megatron-LM#4168). R3
records which experts the engine chose for every token (inference/routes.py, the server's `routed_experts`) and the
trainer's forward uses them (GLM.forward(routes=)); the router's scores are still computed, so the gates (read from
the FULL sigmoid scores, moe.Router.gates) and the router's gradient stay.

`rl.routing_replay` (and `agentic.episode.routing_replay`):
  off      nothing is recorded
  record   the engine's routes are recorded and compared with the trainer's own top-k; the trainer routes as usual
  replay   the trainer routes every token to the recorded experts (-1 rows: its own top-k)
Both record and replay report (rl_loss's stats, the dashboard's rl_routing panel), over trained tokens whose routes
are known: `routing_diff_frac`, the fraction whose trainer top-k set differs from the recorded one in at least one
MoE layer, and `routing_layer_diff_frac`, the fraction of (token, layer) pairs that differ. In replay mode they
compare the trainer's OWN top-k (still computed) with the record: the disagreement the replay removed.
"""

from __future__ import annotations

import torch

from glmstack.config import ConfigError
from glmstack.inference.routes import trunk_routers


def check_model(mode: str, model, field: str = "rl.routing_replay") -> None:
    """Routing replay needs a policy with MoE layers (a ConfigError naming `field` otherwise)."""
    if mode != "off" and not trunk_routers(model):
        raise ConfigError(f"{field}={mode}: the policy has no MoE layer to record or replay; set it to off")


def model_routes(mode: str, batch: dict, rows=None, device=None, own: bool = False) -> dict:
    """GLM.forward's keyword arguments for this batch (rows: a subset of its rows): `routes` when replaying, and with
    `own` `return_routes` in record and replay mode (the trainer's own top-k, for routing_diff); {} without routes."""
    if mode == "off" or "routes" not in batch:
        return {}
    out = {"return_routes": True} if own else {}
    if mode == "replay":
        routes = batch["routes"] if rows is None else batch["routes"][rows]
        out["routes"] = routes if device is None else routes.to(device)
    return out


def routing_diff(own_BTLK: torch.Tensor, recorded_BTLK: torch.Tensor, mask_BT: torch.Tensor) -> dict:
    """`routing_diff_frac` and `routing_layer_diff_frac` (module docstring) over the positions where mask_BT > 0 and
    the recorded routes are known (not -1); the order of the K experts does not matter."""
    known_BT = (recorded_BTLK >= 0).all(-1).all(-1) & (mask_BT > 0)
    differ_BTL = (own_BTLK.sort(-1).values != recorded_BTLK.to(own_BTLK.dtype).sort(-1).values).any(-1)
    differ_BTL = differ_BTL & known_BT[..., None]
    n = float(known_BT.sum())
    if n == 0:
        return {"routing_diff_frac": 0.0, "routing_layer_diff_frac": 0.0}
    return {"routing_diff_frac": float(differ_BTL.any(-1).sum()) / n,
            "routing_layer_diff_frac": float(differ_BTL.sum()) / (n * differ_BTL.shape[-1])}  # fmt: skip
