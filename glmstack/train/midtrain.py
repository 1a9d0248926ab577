"""`glmstack midtrain <recipe>`: mid-training from a pre-training checkpoint at a longer context.

GLM-4.5 §2.4: load the pre-trained model, raise the sequence length (4K -> 32K -> 128K) together with the RoPE base
(1e4 -> 1e6), switch the data mixture (repo-level code, synthetic reasoning, long documents) and the packing mode
(best-fit packing instead of concatenation), and continue the same cosine decay to 10% of the peak lr. All of
that is data in the recipe's `midtrain()` (init_from, seq_len, rope_theta, data.path, data.packing,
schedule.step_offset); this module runs the shared stage code and the one loop.

    glmstack midtrain tiny                      # reads runs/tiny/pretrain/latest, writes runs/tiny/midtrain/
    glmstack midtrain tiny --set seq_len=256
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    # the command (recipe name -> config) is the commands' layer: training code does not import the recipes
    from glmstack.stage_cli import main_for

    return main_for("midtrain", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
