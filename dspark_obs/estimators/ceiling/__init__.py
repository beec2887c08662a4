"""The hidden ceiling: how many drafts a full block would have accepted, per request-step.

The public face of the ceiling estimator; each concept has its module:

* :mod:`.walk` -- the walk over a step's drafts and the ceiling from acceptance factors;
* :mod:`.evidence` -- the committed tokens as evidence per drafted position;
* :mod:`.prior`, :mod:`.drafter` -- the acceptance model and the drafter map fitted on verified drafts;
* :mod:`.estimate` -- :func:`estimate_ceiling`, the pure computation;
* :mod:`.inputs`, :mod:`.io` -- a run's arrays from the store, and :func:`estimate_run`, which
  plans its chunks, estimates them and writes the result tables (:mod:`.run`);
* :mod:`.partial` -- the chunk sums the summary (:mod:`.stats`, with its bootstrap) and the validation
  against truth (:mod:`.validation`) add up;
* :mod:`.fit` -- the fit saved for a later run (``estimate --fit-out``); :mod:`.jsonl` -- SGLang's JSONL;
* :mod:`.ray` -- the chunks as Ray tasks.
"""

from dspark_obs.estimators.ceiling.estimate import (
                                                    CEILING,
                                                    CEILING_SUMMARY,
                                                    CEILING_VALIDATION,
                                                    METHODS,
                                                    CeilingEstimate,
                                                    drafter_explains_better,
                                                    estimate_ceiling,
)
from dspark_obs.estimators.ceiling.evidence import Evidence, draft_evidence, token_index
from dspark_obs.estimators.ceiling.fit import CeilingFit
from dspark_obs.estimators.ceiling.io import RESULT_TABLES, CeilingRun
from dspark_obs.estimators.ceiling.jsonl import logprobs_from_sglang_jsonl
from dspark_obs.estimators.ceiling.run import estimate_run

__all__ = ["METHODS", "drafter_explains_better", "CeilingEstimate", "estimate_ceiling", "estimate_run", "CeilingRun",
           "CeilingFit", "RESULT_TABLES", "Evidence", "token_index", "draft_evidence", "logprobs_from_sglang_jsonl",
           "CEILING", "CEILING_SUMMARY", "CEILING_VALIDATION"]
