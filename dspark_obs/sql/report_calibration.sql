-- Report: calibration of survival S_k per run, label kind, workload and position (from `dspark-obs calibrate`).
--
-- Rows of the calibration table for one binning; labels says where the truth
-- came from (observed | reconstructed | companion).  '*' = all workloads.
--
-- Parameters:
--   $runs      these run ids (list); default NULL (every run)
--   $binning   width15 | width20 | mass15; default 'width15'
-- Output columns:
--   run_id, mode, workload, position, labels, label_source, n, n_requests,
--   mean_predicted, observed_rate, ece, ece_ci_lo, ece_ci_hi, debiased_ece,
--   mce, brier, log_loss, auroc, bootstrap, auroc_se, observed_rate_se
SELECT run_id, mode, workload, position, labels, label_source, n, n_requests, mean_predicted, observed_rate,
       ece, ece_ci_lo, ece_ci_hi, debiased_ece, mce, brier, log_loss, auroc, bootstrap, auroc_se, observed_rate_se
FROM calibration
WHERE binning = $binning AND ($runs IS NULL OR list_contains($runs, run_id))
ORDER BY run_id, labels, workload = '*' DESC, workload, position;
