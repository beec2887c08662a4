-- Dashboard Cost model: the fitted additive step-time tables (from `dspark-obs costmodel`), in ms, for the selected runs.
--
-- One row per run, model, term and probe of costmodel_fit: bias (no probe),
-- alpha(bs) at the bs probes, theta(M) at the M probes, and the context
-- term (ms per 1000 prefix tokens).  timer is the step time fitted,
-- pooled_runs the runs whose steps the fit pooled.
--
-- Parameters:
--   $runs   only these run ids (list); default NULL (every run)
-- Output columns:
--   run_id, model, term, probe, value_ms, stderr_ms, covered, timer, pooled_runs
SELECT
    run_id, model, term, probe,
    CASE WHEN term = 'context' THEN value_seconds * 1e6 ELSE value_seconds * 1e3 END AS value_ms,
    CASE WHEN term = 'context' THEN stderr_seconds * 1e6 ELSE stderr_seconds * 1e3 END AS stderr_ms,
    covered, timer, pooled_runs
FROM costmodel_fit
WHERE $runs IS NULL OR list_contains($runs, run_id)
ORDER BY run_id, model, CASE term WHEN 'bias' THEN 0 WHEN 'alpha' THEN 1 WHEN 'theta' THEN 2 ELSE 3 END, probe;
