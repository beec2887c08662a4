"""Fit SGLang's additive step-time table ``T(bs, K) = bias + alpha(bs) + theta(M)`` from logged steps.

What SGLang's profiler does (``sglang/benchmark/dspark_sps_profiler.py``, off-diagonal
``--fracs`` sweep): hold a batch size, pin the budget, take the *median* step time of
the steady steps as one cell ``(bs, M, T)``, and fit the cells by least squares with
``alpha(bs_probes[0]) = 0`` and ``theta(m_probes[0]) = 0`` so that ``bias`` carries the
level.  Here the cells come from a run's own steps instead of pinned rounds:

* **M is what the target ran.**  ``compact``: ``num_verify_tokens`` (the replayed
  CUDA-graph tier); ``static``: ``num_verify_tokens = bs * (gamma + 1)``;
  ``cap-accept``: ``bs * (gamma + 1)`` — its ``num_verify_tokens`` is ``sum(verify_len)``
  (the window it *commits*), but the target verified the whole block.
* **Cells**: steps grouped by exact ``(bs, M)`` (optionally M binned), median time per cell
  (the emulator's lognormal noise has median 1, so the median is unbiased), each cell
  weighted by its step count.
* **Bases**: SGLang's profiler uses one dummy per probe (a step function); here alpha and
  theta are piecewise-linear "hat" bases on the probe grids, so the coefficients *are* an
  ``SpsAdditiveCostTable`` (linear interpolation, clamped) and the fitted function is
  exactly what SGLang evaluates when it loads the exported JSON.  A probe whose hat has no
  data under it is dropped from the grid (its neighbours interpolate); ``bias > 0`` is
  enforced (bounded least squares) because SGLang rejects a non-positive bias.
* **Timer**: ``step_gpu_ms`` by default (device time of the step).  SGLang's profiler
  fits ``step_cpu_ms`` (host time between consecutive decode steps, so host overhead lands
  in ``bias``; absent after a prefill); pass ``timer="step_cpu_ms"`` for a table that
  plans like the profiler's.  ``target_verify_gpu_ms`` leaves the draft out.
* **Context term**: ``+ c * sum(prefix_len)`` per step, the KV-read cost SGLang's table
  cannot express.  ``sum(prefix_len)`` grows with the batch, so across cells it is
  confounded with ``alpha(bs)``; ``c`` is estimated from the variation *within* cells
  (:func:`context_slope`), then the table is refitted to the times net of it.  The fit
  reports ``c`` with its standard error and the MAPE with and without it
  (:attr:`CostModelReport.context_helps`).

Pure functions take arrays (:mod:`.additive`); :func:`fit_runs` and :func:`write_results` are the thin
layer over the SQL views and the store (:mod:`.io`).  Result tables: ``costmodel_fit`` and ``costmodel_error``.
"""

from dspark_obs.estimators.costmodel.additive import (
                                                       MODELS,
                                                       TIMERS,
                                                       AdditiveFit,
                                                       Cells,
                                                       bin_cells,
                                                       context_slope,
                                                       error_summary,
                                                       fit_additive,
                                                       hat_basis,
                                                       probe_grid,
                                                       target_tokens,
)
from dspark_obs.estimators.costmodel.io import CostModelReport, fit_runs, fitted_table_of, load_steps, write_results

__all__ = [
    "TIMERS", "MODELS", "Cells", "AdditiveFit", "target_tokens", "bin_cells", "context_slope", "hat_basis",
    "probe_grid", "fit_additive", "error_summary", "CostModelReport", "load_steps", "fit_runs",
    "write_results", "fitted_table_of",
]
