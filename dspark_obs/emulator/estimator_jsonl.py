"""SGLang's block-accept estimator JSONL, as the emulator writes it.

With ``SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH`` set (and
``SGLANG_DSPARK_FOLDED_PROPOSAL=0``) an SGLang DSpark server records, for every
censored step of a sampled request, the drafts its trim cut off and their draft
logprobs ``q``, then settles them against the tokens realised at those
positions in later steps.  The ceiling estimator reads these rows
(``dspark-obs ingest --estimator-jsonl``); the emulator writes the same rows,
row for row, so that path is tested without a GPU.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import numpy as np

from dspark_obs.records import BlockAcceptEosRow, BlockAcceptRow

__all__ = ["BlockAcceptRecorder"]


def _f32(x: float) -> float:
    """A float as SGLang's float32 tensors hand it to ``json.dumps`` (``.tolist()``)."""
    return float(np.float32(x))


class BlockAcceptRecorder:
    """SGLang's ``BlockAcceptEstimateRecorder`` (synchronous path), file output only.

    Per request-step of a non-greedy request it writes
    ``{rid, fct, w, cl, ct[, trimmed_tokens, q_lp][, pg]}``: a censored step
    (``cl == w < gamma``) opens a block of trimmed drafts, and each later row
    settles the open blocks' next offsets against the tokens realised there
    (``pg`` entries ``[block_fct, offset, p_lp, token, realized]``) until a
    trimmed draft diverges or the block ends.  A request that stops at EOS
    with blocks still open gets an ``{rid, eos_end: [fct...]}`` marker.
    """

    FLUSH_EVERY_STEPS = 16

    def __init__(self, path: str, *, gamma: int) -> None:
        self.gamma = gamma
        self._file = open(path, "w")
        self._states: dict[str, dict[str, Any]] = {}
        self._steps_since_flush = 0

    def observe_step(self, forward_ct: int, rows: list[dict[str, Any]]) -> None:
        """``rows``: per batch row ``rid, greedy, seq_len, window, cl, ct, bonus, drafts, q_all, p_lp``
        where ``p_lp(row, token)`` is the target's logprob of ``token`` at verify row ``row``."""
        for row in rows:
            self._settle_row(forward_ct, row)
        self._steps_since_flush += 1
        if self._steps_since_flush >= self.FLUSH_EVERY_STEPS:
            self.flush()

    def _settle_row(self, forward_ct: int, r: dict[str, Any]) -> None:
        gamma, cl, window, seq_len = self.gamma, r["cl"], r["window"], r["seq_len"]
        state = self._states.setdefault(r["rid"], {"expected_seq_len": -1, "pending": []})
        if state["expected_seq_len"] >= 0 and seq_len != state["expected_seq_len"]:
            state["pending"] = []  # SGLang's seq-len continuity check
        state["expected_seq_len"] = seq_len + cl + 1
        if r["greedy"]:
            state["pending"] = []
            return
        trimmed = q_lps = None
        if cl == window and window < gamma:
            trimmed = [int(t) for t in r["drafts"][window:gamma]]
            q_lps = [_f32(q) for q in r["q_all"][window:gamma]]
            state["pending"].append({"forward_ct": forward_ct, "anchor_pos": seq_len - 1, "window": window,
                                     "trimmed": trimmed, "next_offset": window + 1})
        realized = [int(t) for t in r["drafts"][:cl]] + [int(r["bonus"])]
        gathers: list[list] = []
        kept = []
        for block in state["pending"]:
            diverged = False
            while block["next_offset"] <= gamma:
                row = block["anchor_pos"] + block["next_offset"] - seq_len
                if row > cl:
                    break
                token = block["trimmed"][block["next_offset"] - block["window"] - 1]
                gathers.append([block["forward_ct"], block["next_offset"], _f32(r["p_lp"](row, token)), token,
                                realized[row]])
                block["next_offset"] += 1
                if realized[row] != token:
                    diverged = True
                    break
            if not diverged and block["next_offset"] <= gamma:
                kept.append(block)
        state["pending"] = kept
        self._write(BlockAcceptRow(r["rid"], forward_ct, window, cl, r["ct"], trimmed_tokens=trimmed, q_lp=q_lps,
                                   pg=gathers or None))

    def note_request_finished(self, rid: str, *, natural_stop: bool) -> None:
        state = self._states.pop(rid, None)
        if state is not None and natural_stop and state["pending"]:
            self._write(BlockAcceptEosRow(rid, [b["forward_ct"] for b in state["pending"]]))

    def _write(self, row: BlockAcceptRow | BlockAcceptEosRow) -> None:
        """One line as SGLang writes it: ``json.dumps`` of the row, so a ``-inf`` logprob is ``-Infinity``."""
        self._file.write(json.dumps(msgspec.to_builtins(row)) + "\n")

    def flush(self) -> None:
        self._file.flush()
        self._steps_since_flush = 0

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            self._file.close()
