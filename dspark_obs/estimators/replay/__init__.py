"""Schedule replay: re-plan logged steps with ``dspark_obs.scheduler`` and ask "what if".

**Conformance.**  For every decode step of a run, rebuild what the server's planner saw
and run the one scheduler implementation on it:

* confidences are the recorded (4-decimal) ones; survival is their float32 ``cumprod``;
* the budget uses the survivals of the step ``lag_steps`` *decode* steps earlier on the
  same DP rank and server segment (ordered by ``forward_ct``; prefill batches between
  steps do not count); a request absent from that step is fresh and gets ones; the first
  ``lag_steps`` steps of a segment see only fresh requests;
* windows come from the current survivals and the replayed budget; ties between requests
  follow the batch order, which is the order of a record's ``reqs`` (the store keeps it).

A step *matches* when every replayed ``verify_len`` equals the logged one.  A step whose
lag window straddles a collection gap (a clear or a deque wrap may have swallowed a decode
step) has unknown history; it is counted apart, not as a mismatch.

**What-if.**  Re-plan the same steps with recalibrated confidences (an STS JSON:
``c' = sigmoid(logit(c) * T_current / T_new)`` per position) or another cost table, and
price the outcome: per request-step the committed tokens are ``min(block, w') + 1`` where
``block`` is the full-block acceptance (drafts a full verify would accept) and ``w'`` the
new window.  ``block`` comes, in order of preference, from the truth (emulator
``emu_block_accept``, a static or cap-accept step, a step whose window rejected a draft, a
cap-accept companion), else from a ``ceiling`` result table ``[lo, mid, hi]``, else from the
survival-based expectation ``w + sum_{k>w} S_k / S_w`` within ``[w, gamma]``.  Step time
comes from a cost table at the tokens the target would run (compact: the smallest observed
graph tier above ``sum(verify_len')``; static and cap-accept: the full block).  The batches
are the logged ones: a what-if does not re-simulate who is running when.
"""

from dspark_obs.estimators.replay.io import ReplayReport, load_step_log, planning_table, replay_run, write_results
from dspark_obs.estimators.replay.pricing import block_acceptance, expected_block_accept, logged_outcome, price_schedule
from dspark_obs.estimators.replay.schedule import (
                                                  DEFAULT_LAG_STEPS,
                                                  SOURCES,
                                                  StepLog,
                                                  confidence_from_survival,
                                                  conformance,
                                                  lag_indices,
                                                  recalibrate,
                                                  replay_schedule,
)

__all__ = [
    "SOURCES", "StepLog", "recalibrate", "lag_indices", "replay_schedule", "conformance", "block_acceptance",
    "price_schedule", "ReplayReport", "load_step_log", "replay_run", "write_results", "DEFAULT_LAG_STEPS",
    "confidence_from_survival", "expected_block_accept", "logged_outcome", "planning_table",
]
