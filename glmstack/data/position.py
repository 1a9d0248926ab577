"""A resumable position counted in global batches, shared by the loaders whose every rank reads the same batch
index (the synthetic stream, packed SFT conversations): a run resumed on another number of ranks continues right
after the last batch any rank consumed (elastic resume, docs/training.md)."""

from __future__ import annotations


class GlobalBatchPosition:
    """Mixin: `self.position` (this rank's next batch index) and `self.world_size` <-> `{"global_batches": N}`;
    iterating yields `self.batch(index)` for index = position, position + 1, ..."""

    position: int
    world_size: int

    def __iter__(self):
        while True:
            out = self.batch(self.position)
            self.position += 1
            yield out

    def state_dict(self) -> dict:
        return {"global_batches": self.position * self.world_size}

    def load_state_dict(self, state: dict) -> None:
        consumed = int(state["global_batches"]) if "global_batches" in state else int(state["position"])
        if consumed % self.world_size:
            raise ValueError(
                f"the run consumed {consumed} global batches, which {self.world_size} ranks cannot "
                f"continue evenly; resume on a number of ranks that divides it"
            )
        self.position = consumed // self.world_size
