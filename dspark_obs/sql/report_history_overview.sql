-- Report history overview: per run, the newest report's all-workload figures, positions averaged (history charts).
--
-- For every run its newest report in the reports table; per figure name the
-- all-workloads ('*') or per-run rows.  Per-position figures (ECE, ...) are
-- averaged over positions: value is that mean and ci_low / ci_high are null;
-- single rows keep their interval.  verdict is the worst of the rows.
--
-- Parameters:
--   $metrics   only these figure names (list); default NULL (every figure)
-- Output columns:
--   metric, run_id, run_started_at, report_id, value, ci_low, ci_high, positions, verdict
WITH latest AS (
    SELECT * FROM reports
    WHERE ($metrics IS NULL OR list_contains($metrics, metric)) AND (workload = '*' OR workload IS NULL)
    QUALIFY generated_at = max(generated_at) OVER (PARTITION BY run_id)
)
SELECT metric, run_id, any_value(run_started_at) AS run_started_at, any_value(report_id) AS report_id,
       avg(value) AS value,
       CASE WHEN count(*) = 1 THEN min(ci_low) END AS ci_low,
       CASE WHEN count(*) = 1 THEN min(ci_high) END AS ci_high,
       count(position) AS positions,
       CASE WHEN bool_or(verdict = 'fail') THEN 'fail' WHEN bool_or(verdict = 'warn') THEN 'warn'
            WHEN bool_or(verdict = 'pass') THEN 'pass' ELSE min(verdict) END AS verdict
FROM latest
GROUP BY metric, run_id
ORDER BY metric, run_started_at NULLS LAST, run_id;
