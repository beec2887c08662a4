-- Report history: one figure over nights, from the latest report of each run (`dspark-obs report`).
--
-- Rows of the reports table: for every run, the figures of the newest report
-- that judged it, so a run reported twice counts once.  Plot value (with
-- ci_low / ci_high) against run_started_at; verdict is the figure's combined
-- verdict (pass | warn | fail | info | insufficient).
--
-- Parameters:
--   $metric     figure name, e.g. debiased_ece, ece, utilisation; default 'debiased_ece'
--   $workload   workload, '*' = all workloads; default '*'
--   $position   draft position k, or NULL for every position; default NULL
--   $runs       only these run ids (list); default NULL (every run)
-- Output columns:
--   run_id, run_started_at, report_id, generated_at, metric, workload, position,
--   labels, value, ci_low, ci_high, n, limit_kind, limit_value, threshold_verdict,
--   drift_verdict, verdict, report_status
SELECT run_id, run_started_at, report_id, generated_at, metric, workload, position, labels, value,
       ci_low, ci_high, n, limit_kind, limit_value, threshold_verdict, drift_verdict, verdict, report_status
FROM reports
WHERE metric = $metric
  AND (workload = $workload OR ($workload IS NULL AND workload IS NULL))
  AND ($position IS NULL OR position = $position)
  AND ($runs IS NULL OR list_contains($runs, run_id))
QUALIFY generated_at = max(generated_at) OVER (PARTITION BY run_id)
ORDER BY run_started_at NULLS LAST, run_id, position;
