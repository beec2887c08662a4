"""Built-in workload profiles: how predictable each kind of traffic is.

The numbers are logits of the drafter's true conditional acceptance per block
position; they were tuned so that the default mixed traffic reproduces the
shape of SGLang's DSpark write-up at gamma 6 and concurrency 48: mean window
5.24 / 3.78 / 2.91 for gsm8k / arena-hard / poetry, about 55% of gsm8k steps at
the full window and 80% of poetry steps at 3 or fewer. gsm8k and poetry are
confident early and fall off steeply (a high start, a steep slope, little
block-to-block spread), which is what puts their windows where the write-up
has them; arena-hard's wide spread gives its flat window distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WorkloadProfile:
    name: str
    # Logit of the true conditional acceptance at depth k (1-based), before noise.
    acceptance_logit_start: float
    acceptance_logit_slope: float
    # Spread of a block-wide "how easy is this stretch" offset and of per-position noise.
    block_sigma: float
    position_sigma: float
    # Target's peakedness: larger means lower-entropy target distributions.
    target_sharpness: float
    output_len_mean: int
    output_len_sd: int
    prompt_len_range: tuple[int, int]

    def acceptance_logits(self, gamma: int) -> np.ndarray:
        return self.acceptance_logit_start + self.acceptance_logit_slope * np.arange(gamma)


PROFILES: dict[str, WorkloadProfile] = {
    "gsm8k": WorkloadProfile("gsm8k", 5.5, -1.0, 1.5, 0.3, 4.0, 220, 60, (60, 220)),
    "arena-hard": WorkloadProfile("arena-hard", 2.4, -0.4, 2.2, 0.5, 3.0, 260, 80, (120, 600)),
    "poetry": WorkloadProfile("poetry", 4.8, -2.0, 1.0, 0.3, 2.0, 180, 50, (30, 120)),
}

DEFAULT_PROFILE = "arena-hard"


def profile_for(prompt: str | None, rid: str | None) -> WorkloadProfile:
    """Pick the profile named in the prompt (e.g. ``[gsm8k] ...``), else in the rid."""
    for text in (prompt or "", rid or ""):
        for name, profile in PROFILES.items():
            if name in text:
                return profile
    return PROFILES[DEFAULT_PROFILE]
