-- Dashboard Calibration: ECE, Brier, AUROC and log loss of survival S_k per run, workload, position and label mode (from `dspark-obs calibrate`).
--
-- Rows of the calibration table for one binning.  labels says where the
-- truth came from (observed | reconstructed | companion); comparing them
-- shows the survivorship bias of a compact run's observed labels.  The
-- '*' workload (all workloads) is always kept; the workload filter selects
-- the others.  ece_ci_lo / ece_ci_hi are request-bootstrap bounds (null
-- without a bootstrap).
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list) besides '*'; default NULL
--   $binning     width15 | width20 | mass15; default 'width15'
-- Output columns:
--   run_id, mode, workload, position, labels, label_source, n, n_requests,
--   mean_predicted, observed_rate, ece, ece_ci_lo, ece_ci_hi, debiased_ece,
--   mce, brier, log_loss, auroc
SELECT run_id, mode, workload, position, labels, label_source, n, n_requests,
       mean_predicted, observed_rate, ece, ece_ci_lo, ece_ci_hi, debiased_ece,
       mce, brier, log_loss, auroc
FROM calibration
WHERE binning = $binning
  AND ($runs IS NULL OR list_contains($runs, run_id))
  AND ($workloads IS NULL OR workload = '*' OR list_contains($workloads, workload))
ORDER BY run_id, workload = '*' DESC, workload,
         CASE labels WHEN 'observed' THEN 0 WHEN 'reconstructed' THEN 1 ELSE 2 END, position;
