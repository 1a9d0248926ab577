"""glmstack: the GLM-4.5 -> GLM-5 recipe (data, MoE+MTP pre-training, mid-training, SFT, RL, serving) as one
hackable PyTorch stack. See README.md and ARCHITECTURE.md; `glmstack --help` lists the commands."""

__version__ = "0.1.0"
