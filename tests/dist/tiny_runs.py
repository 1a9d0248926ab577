"""What the multi-process training tests share: the tiny recipe's fast settings and a free loopback port."""

import socket

# tiny recipe, a few steps of a short context, no progress bar, plots or validation; full batch and lr from step 1
TINY = [
    "seq_len=32",
    "micro_batch_size=2",
    "log.progress=false",
    "log.plots=false",
    "log.val_every=0",
    "schedule.batch_warmup_tokens=0",
    "schedule.warmup_steps=1",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
