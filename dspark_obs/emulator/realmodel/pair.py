"""The target and its layer-dropped drafter, sharing one set of weights.

The target is SmolLM2-135M-Instruct (30 decoder layers).  The drafter is the
same model with decoder layers ``DEFAULT_DROP`` = (16, 17) removed (zero-based):
a genuinely weaker copy, measured on greedy chat continuations to agree with
the target's argmax on about 77% of tokens (per-token acceptance about 0.75 at
t = 0.7).  Dropping more is much weaker: 4 middle layers give 0.65, 8 give
0.2-0.4; dropping the top layers (early exit) is worst.

Both run on the same token sequence (the anchor, then each draft), so the
layers below the first removed one compute identical keys and values for both:
they run once, in the target's cache, and the drafter keeps its own cache for
its layers above the gap.  ``step`` feeds one token per request and returns
the target's and the drafter's logits for the next position.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from dspark_obs.emulator.realmodel import weights
from dspark_obs.emulator.realmodel.llama import Batch, KVCache, LlamaShape, LlamaStack

DEFAULT_DROP = (16, 17)
_LOADED: dict[tuple, "ModelPair"] = {}
_LOCK = threading.Lock()


@dataclass
class Caches:
    """One request's caches: the target's (all layers) and the drafter's (its layers above the gap)."""

    target: KVCache
    drafter: KVCache

    @property
    def length(self) -> int:
        return self.target.length

    def truncate(self, length: int) -> None:
        self.target.length = self.drafter.length = length


class ModelPair:
    """Weights, tokenizer and the layer split of target and drafter."""

    def __init__(self, loaded: weights.LoadedModel, drop: Sequence[int] = DEFAULT_DROP) -> None:
        self.shape = LlamaShape.from_config(loaded.config)
        n = self.shape.num_layers
        drop = sorted(set(int(i) for i in drop))
        if not drop or drop[0] < 1 or drop[-1] >= n:
            raise ValueError(f"drafter layers to drop must lie in 1..{n - 1}, got {drop}")
        self.drop = tuple(drop)
        self.stack = LlamaStack(loaded.state, self.shape)
        self.tokenizer = loaded.tokenizer
        self.source = loaded.source
        self.shared = list(range(drop[0]))
        self.target_top = list(range(drop[0], n))
        self.drafter_top = [i for i in range(drop[0], n) if i not in drop]
        eos = {int(loaded.config.get("eos_token_id") or 2)}
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_ids = frozenset(eos)

    @classmethod
    def get(cls, *, drop: Sequence[int] = DEFAULT_DROP, cache_dir: Optional[Path] = None) -> "ModelPair":
        """Load once per process (weights are read-only; engines and restarts share them)."""
        key = (tuple(sorted(drop)), str(cache_dir))
        with _LOCK:
            if key not in _LOADED:
                _LOADED[key] = cls(weights.load(cache_dir), drop)
            return _LOADED[key]

    @property
    def drafter_layers(self) -> list[int]:
        return self.shared + self.drafter_top

    def new_caches(self, capacity: int) -> Caches:
        return Caches(self.stack.new_cache(self.shape.num_layers, capacity),
                      self.stack.new_cache(len(self.drafter_top), capacity))

    def encode(self, text: str) -> list[int]:
        """Chat text as the model expects it: one user turn with the chat template,
        unless the text already carries the template's markers."""
        if "<|im_start|>" in text:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(t) for t in ids if int(t) >= 0], skip_special_tokens=True)

    def forward(self, tokens: Sequence[Sequence[int]], caches: Sequence[Caches], *, drafter: bool = True,
                last_only: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor], float]:
        """Feed each request's ``tokens`` after its caches; target and drafter logits of the fed rows.

        Returns ``(target [T, V], drafter [T, V] or None, seconds spent on the drafter's own layers
        and head)``; with ``last_only`` only each request's last row.  Cache lengths advance.
        """

        st = self.stack
        batch: Batch = st.batch([len(t) for t in tokens], [c.length for c in caches])
        tcaches = [c.target for c in caches]
        x = st.layers(st.embed_tokens(tokens), batch, self.shared, tcaches, slot=0)
        rows = None
        if last_only:
            rows = torch.tensor([sum(batch.counts[:i + 1]) - 1 for i in range(len(tokens))])
        ht = st.layers(x, batch, self.target_top, tcaches, slot=len(self.shared))
        target = st.logits(ht if rows is None else ht[rows])
        t0 = time.perf_counter()
        dcaches = [c.drafter for c in caches]
        hd = st.layers(x, batch, self.drafter_top, dcaches, slot=0)
        draft = None
        if drafter:
            draft = st.logits(hd if rows is None else hd[rows])
        drafter_s = time.perf_counter() - t0
        batch.commit_lengths(tcaches)
        batch.commit_lengths(dcaches)
        return target, draft, drafter_s
