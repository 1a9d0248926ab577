"""Training: the one loop (loop.py), checkpoints, metrics, loss-free balancing, torchrun parallelism, and the
pretrain / midtrain stages built on them. See docs/training.md."""
