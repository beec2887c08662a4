-- Dashboard Calibration: held-out ECE and Brier of each recalibration map per position (from `dspark-obs calibrate --recalibrate`).
--
-- Rows of the recalibration table: each map (none | sts | platt | isotonic |
-- beta) fitted on one half of the requests and scored on the other half.
-- The '*' workload (all workloads) is always kept; the workload filter
-- selects the others.
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list) besides '*'; default NULL
-- Output columns:
--   run_id, workload, position, method, split, labels, n, n_fit, ece, ece_ci_lo, ece_ci_hi, brier, seed
SELECT run_id, workload, position, method, split, labels, n, n_fit, ece, ece_ci_lo, ece_ci_hi, brier, seed
FROM recalibration
WHERE ($runs IS NULL OR list_contains($runs, run_id))
  AND ($workloads IS NULL OR workload = '*' OR list_contains($workloads, workload))
ORDER BY run_id, labels, workload = '*' DESC, workload,
         CASE method WHEN 'none' THEN 0 WHEN 'sts' THEN 1 WHEN 'platt' THEN 2 WHEN 'isotonic' THEN 3 ELSE 4 END,
         position;
