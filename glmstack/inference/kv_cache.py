"""Preallocated KV cache with per-row lengths: the one cache interface GQA and MLA attention write through.

Why: batched generation needs rows of different prompt lengths (left padding) and MTP speculative decoding
accepts a different number of draft tokens per row, so every row keeps its own length and can be rolled
back on its own. Buffers are allocated once per generate call (no torch.cat per step, which is quadratic).

How (see docs/CONTRACTS.md "KV cache"): attention layer `i` calls

    k_all, v_all = cache.update(i, k_new, v_new)   # (B, H, T_new, Dh) each -> (B, H, T_all, Dh) views
    mask = cache.attention_mask(i, T_new)          # after update: bool (B, 1, T_new, T_all), True = attend; or None

Each layer has its own lengths, so the main model (layers 0..L-1) and the MTP layers (L + d) can be at
different positions. The buffers' shapes come from the first update of each layer, so MLA stores its
latent (B, 1, T, kv_lora_rank) as "k" and its rope key (B, 1, T, rope_dim) as "v" through the same call.
`rewind(drop)` forgets the last `drop` positions of each row (int or (B,) tensor) — speculative rollback.

Row b's positions [0, start[b]) are left padding and never attended. Row b's query at cache index j attends
keys in [start[b], j]. Shape legend: B batch, H kv heads, S preallocated length, T new tokens, Dh head dim.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, batch_size: int, max_len: int, *, start: torch.Tensor | None = None, device=None, dtype=None):
        self.batch_size, self.max_len = batch_size, max_len
        self.device, self.dtype = device, dtype  # None: take them from the first update
        # (B,) number of left-pad positions per row; never attended
        self.start = start if start is not None else torch.zeros(batch_size, dtype=torch.long, device=device)
        self.padded = bool((self.start > 0).any()) if start is not None else False
        self._k: dict[int, torch.Tensor] = {}  # layer -> (B, H, S, Dh)
        self._v: dict[int, torch.Tensor] = {}
        self._len: dict[int, torch.Tensor] = {}  # layer -> (B,) long, positions stored per row
        self._max: dict[int, int] = {}  # host copy of max(_len[i]) so the hot path never syncs
        self._uniform: dict[int, bool] = {}  # all rows of layer i have the same length
        self._host: dict[int, list[int] | None] = {}  # host copy of _len[i] while rows differ (None: all _max)
        # layers with equal signatures have equal lengths, so they share one mask per forward. A signature is an
        # interned id of (previous signature, event): a tuple nested once per update made each mask lookup cost
        # O(steps) and overflowed Python's recursion limit after ~1000 speculative steps.
        self._sig: dict[int, int] = {}
        self._sig_ids: dict[tuple, int] = {}
        self._n_sigs = 0
        self._masks: dict[tuple, torch.Tensor] = {}
        self._n_rewinds = 0

    # ---- queries ----------------------------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        """Positions stored by the first layer (max over rows); 0 before any update."""
        return self._max[min(self._max)] if self._max else 0

    def length(self, i: int) -> int:
        return self._max.get(i, 0)

    def buffers(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """layer -> its (B, H, S, Dh) k and v buffers (read-only use: prefix_cache copies positions out)."""
        return {i: (self._k[i], self._v[i]) for i in self._k}

    def lengths(self, i: int) -> torch.Tensor:
        """(B,) positions stored per row of layer i."""
        if i not in self._len:
            return torch.zeros(self.batch_size, dtype=torch.long, device=self.start.device)
        return self._len[i]

    # ---- the contract -----------------------------------------------------------------------------------
    def _allocate(self, i: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        B, S = self.batch_size, self.max_len
        dtype, device = self.dtype or k_new.dtype, self.device or k_new.device
        # zeros, not empty: masked positions still enter the matmul and 0 * NaN would poison the output
        self._k[i] = torch.zeros(B, k_new.shape[1], S, k_new.shape[3], dtype=dtype, device=device)
        self._v[i] = torch.zeros(B, v_new.shape[1], S, v_new.shape[3], dtype=dtype, device=device)
        self._len[i] = torch.zeros(B, dtype=torch.long, device=device)
        self._max[i], self._uniform[i], self._sig[i], self._host[i] = 0, True, -1, None
        if self.start.device != device:
            self.start = self.start.to(device)

    def update(self, i: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, H, T, Dh) k/v at each row's length; return the (B, H, T_all, Dh) windows."""
        if i not in self._k:
            self._allocate(i, k_new, v_new)
        T, off = k_new.shape[2], self._max[i]
        if off + T > self.max_len:
            raise ValueError(f"KV cache full: layer {i} has {off} positions, +{T} > max_len {self.max_len}")
        k_buf, v_buf = self._k[i], self._v[i]
        if self._uniform[i]:  # fast path: one slice write
            k_buf[:, :, off : off + T] = k_new
            v_buf[:, :, off : off + T] = v_new
        else:  # rows at different lengths: scatter row b to [len_b, len_b + T)
            pos_BT = self._len[i][:, None] + torch.arange(T, device=k_buf.device)
            rows_BT = torch.arange(self.batch_size, device=k_buf.device)[:, None].expand(-1, T)
            k_buf[rows_BT, :, pos_BT] = k_new.transpose(1, 2).to(k_buf.dtype)  # (B, T, H, Dh) at [b, :, pos]
            v_buf[rows_BT, :, pos_BT] = v_new.transpose(1, 2).to(v_buf.dtype)
        self._len[i] += T
        self._max[i] = off + T
        if self._host[i] is not None:
            self._host[i] = [n + T for n in self._host[i]]
        self._advance(i, T)
        return k_buf[:, :, : off + T], v_buf[:, :, : off + T]

    def attention_mask(self, i: int, T_new: int) -> torch.Tensor | None:
        """Bool (B, 1, T_new, T_all) for the last update of layer i, or None when plain causal is exact.

        None is returned only when the new block is square-causal (a fresh unpadded prefill) or a single
        query that may see every stored key, so callers may use is_causal=(T_new > 1) with it.
        """
        T_all = self._max[i]
        if not self.padded and self._uniform[i] and (T_new == 1 or T_new == T_all):
            return None
        key = (self._sig[i], T_new)
        mask = self._masks.get(key)
        if mask is None:
            if len(self._masks) > 16:
                self._masks.clear()
            mask = self._build_mask(self._len[i], T_new, T_all)
            self._masks[key] = mask
        return mask

    def _build_mask(self, len_B: torch.Tensor, T_new: int, T_all: int) -> torch.Tensor:
        dev = len_B.device
        q_pos_BT = len_B[:, None] - T_new + torch.arange(T_new, device=dev)  # cache index of each new query
        k_pos_S = torch.arange(T_all, device=dev)
        causal_BTS = k_pos_S[None, None, :] <= q_pos_BT[:, :, None]
        not_pad_BS = k_pos_S[None, :] >= self.start[:, None]
        # a padding query sees only itself: an all-False row would give NaN, and NaN K/V poison later matmuls
        self_BTS = k_pos_S[None, None, :] == q_pos_BT[:, :, None]
        return ((causal_BTS & not_pad_BS[:, None, :]) | self_BTS)[:, None]  # (B, 1, T_new, T_all)

    def keep_rows(self, idx: torch.Tensor) -> None:
        """Keep only the rows `idx` (B',) in this order: the engine drops finished rows. Copies every buffer."""
        self.batch_size = len(idx)
        self.start = self.start[idx.to(self.start.device)]
        self.padded = bool((self.start > 0).any())
        self._n_rewinds += 1
        self._masks.clear()
        for i in list(self._k):
            self._k[i], self._v[i], self._len[i] = self._k[i][idx], self._v[i][idx], self._len[i][idx]
            self._set_host(i, self._len[i].tolist())
            self._advance(i, ("rows", self._n_rewinds))

    def _advance(self, i: int, event) -> None:
        """Layer i's history moved by `event`: equal histories get equal ids (ids are never reused)."""
        key = (self._sig[i], event)
        sig = self._sig_ids.get(key)
        if sig is None:
            if len(self._sig_ids) > 4096:  # forgetting old histories only costs sharing, never correctness
                self._sig_ids.clear()
            sig = self._sig_ids[key] = self._n_sigs
            self._n_sigs += 1
        self._sig[i] = sig

    def _set_host(self, i: int, lens: list[int]) -> None:
        self._max[i], self._uniform[i] = max(lens, default=0), len(set(lens)) <= 1
        self._host[i] = None if self._uniform[i] else lens

    # ---- rollback -----------------------------------------------------------------------------------------
    def rewind(self, drop: int | torch.Tensor, layers=None) -> None:
        """Forget the last `drop` positions (int, or (B,) per row) of the given layers (default: all)."""
        layers = list(self._k) if layers is None else [i for i in layers if i in self._k]
        self._n_rewinds += 1
        drop_B = [drop] * self.batch_size if isinstance(drop, int) else drop.tolist()  # one sync per call
        new = {}
        for i in layers:  # the host copies decide everything: no per-layer device reads
            lens = self._host[i] or [self._max[i]] * self.batch_size
            new[i] = [n - d for n, d in zip(lens, drop_B)]
            if min(new[i]) < 0:
                raise ValueError(f"rewind below zero on layer {i}")
        drop_t = drop if isinstance(drop, int) else drop.to(self.start.device)
        for i in layers:
            self._len[i] -= drop_t
            self._set_host(i, new[i])
            self._advance(i, ("rewind", self._n_rewinds))

    # ---- continuous batching (glmstack.serve.scheduler): rows join and the front is reclaimed ------------
    def append_rows(self, other: KVCache, max_len: int | None = None) -> int:
        """Add `other`'s rows after ours. Both must hold one length over all rows and layers (plain decoding
        does). Rows are right-aligned: the shorter side's rows move right and their `start` grows to match, so each
        row still attends exactly its own positions; the leading positions none of our rows attends are dropped on
        the way. New buffers of `max_len` (default: unchanged). Returns how many leading positions were dropped."""
        front = int(self.start.min()) if self.batch_size else 0
        ours, theirs = self._common_len() - front, other._common_len()
        n = max(ours, theirs)
        if max_len is not None:
            self.max_len = max_len
        self._rebuild([(self, n - ours - front), (other, n - theirs)], n)
        return front

    def drop_front(self) -> int:
        """Forget the leading positions that no row attends (min over rows of `start`); returns how many."""
        n = int(self.start.min()) if self.batch_size else 0
        if n:
            self._rebuild([(self, -n)], self._common_len() - n)
        return n

    def _common_len(self) -> int:
        lens = set(self._max.values())
        if len(lens) > 1 or any(not u for u in self._uniform.values()):
            raise ValueError("rows or layers at different lengths: only plain-decoding caches can be re-batched")
        return lens.pop() if lens else 0

    def _rebuild(self, parts: list[tuple[KVCache, int]], new_len: int) -> None:
        """New buffers of `self.max_len` holding each part's rows, positions moved by its shift."""
        if new_len > self.max_len:
            raise ValueError(f"KV cache full: {new_len} positions > max_len {self.max_len}")
        parts = [(c, s) for c, s in parts if c.batch_size]
        B = sum(c.batch_size for c, _ in parts)
        layers = sorted({i for c, _ in parts for i in c._k})
        device = next(c.start.device for c, _ in parts) if parts else self.start.device
        starts = [(c.start.to(device) + s).clamp_min(0) for c, s in parts]
        for i in layers:
            src = next(c for c, _ in parts if i in c._k)
            k0, v0 = src._k[i], src._v[i]
            k = torch.zeros(B, k0.shape[1], self.max_len, k0.shape[3], dtype=k0.dtype, device=k0.device)
            v = torch.zeros(B, v0.shape[1], self.max_len, v0.shape[3], dtype=v0.dtype, device=v0.device)
            row = 0
            for c, s in parts:
                n_src = c._max[i]
                lo = max(0, -s)  # source positions moved before index 0 are dropped
                k[row : row + c.batch_size, :, lo + s : n_src + s] = c._k[i][:, :, lo:n_src]
                v[row : row + c.batch_size, :, lo + s : n_src + s] = c._v[i][:, :, lo:n_src]
                row += c.batch_size
            self._k[i], self._v[i] = k, v
            self._len[i] = torch.full((B,), new_len, dtype=torch.long, device=k.device)
            self._set_host(i, [new_len] * B)
            self._sig.setdefault(i, -1)
        self.batch_size = B
        self.start = torch.cat(starts) if starts else self.start[:0]
        self.padded = bool((self.start > 0).any())
        self._n_rewinds += 1
        self._masks.clear()
        for i in layers:
            self._advance(i, ("rebatch", self._n_rewinds))
