"""`glmstack pretrain <recipe>`: pre-train a GLM MoE with MTP (Muon, loss-free balancing) from a recipe.

GLM-4.5 §2.4: 4K context, RoPE base 1e4, Muon with lr 2.5e-4 warm-up + cosine, batch warm-up, MTP weight 0.3,
balancing rate 1e-3, aux loss 1e-4. The recipe (glmstack/recipes/<name>.py, function `pretrain()`) holds the
numbers; this module only runs the shared stage code (glmstack/train/stage.py) and the one loop.

    glmstack pretrain tiny                                  # runs/tiny/pretrain/, resumes from `latest`
    glmstack pretrain tiny --set optim.lr=3e-4 --set steps=50
    torchrun --nproc_per_node 2 -m glmstack.train.pretrain tiny --set dist.dp=fsdp
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    # the command (recipe name -> config) is the commands' layer: training code does not import the recipes
    from glmstack.stage_cli import main_for

    return main_for("pretrain", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
