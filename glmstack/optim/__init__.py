"""Optimisers and schedules: Muon (+ 3-D banks, Muon Split hook) with AdamW groups; pure per-step schedules."""

from glmstack.optim.groups import Optimizers, assign_groups, build_optimizer
from glmstack.optim.muon import Muon, zeropower_via_newtonschulz

__all__ = ["Muon", "Optimizers", "assign_groups", "build_optimizer", "zeropower_via_newtonschulz"]
