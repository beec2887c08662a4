-- Figure 6 data: the fitted additive cost table per run (from `dspark-obs costmodel`), in ms.
--
-- One row per term and probe of the costmodel_fit result table: bias (no
-- probe), alpha(bs) at the bs probes, theta(M) at the M probes, and the
-- context term (ms per 1000 prefix tokens) of the fitted+context model.
-- covered says whether steps lie near the probe.
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
--   $model    fitted | fitted+context; default 'fitted'
-- Output columns:
--   run_id, model, term, probe, value_ms, stderr_ms, covered
SELECT
    run_id, model, term, probe,
    CASE WHEN term = 'context' THEN value_seconds * 1e6 ELSE value_seconds * 1e3 END AS value_ms,
    CASE WHEN term = 'context' THEN stderr_seconds * 1e6 ELSE stderr_seconds * 1e3 END AS stderr_ms,
    covered
FROM costmodel_fit
WHERE ($run_id IS NULL OR run_id = $run_id) AND model = $model
ORDER BY run_id, CASE term WHEN 'bias' THEN 0 WHEN 'alpha' THEN 1 WHEN 'theta' THEN 2 ELSE 3 END, probe;
