"""The one held-out rule of every generated set: a text's split is a hash of the text (one in `TEST_EVERY` is
"test"). The SFT sets, the RL tasks, the agentic environments, the reward-model pairs and the VQA scenes all use it,
so a prompt held out by one is held out by every other: a card that scores SFT's held-out tool prompts is not
scoring prompts agentic RL trained on.
"""

from __future__ import annotations

import zlib

TEST_EVERY = 5


def split_of(key: str) -> str:
    """"test" for one key in TEST_EVERY (crc32 of its UTF-8 bytes), else "train"."""
    return "test" if zlib.crc32(key.encode()) % TEST_EVERY == 0 else "train"
