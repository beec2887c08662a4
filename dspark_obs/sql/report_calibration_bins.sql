-- Report: reliability-diagram bins of survival S_k per run, label kind, workload and position.
--
-- Non-empty bins of the calibration_bins table for one binning: mean
-- predicted survival against the observed rate of "the first k drafts
-- survive a full block", with the request-steps in each bin.
--
-- Parameters:
--   $runs      these run ids (list); default NULL (every run)
--   $binning   width15 | width20 | mass15; default 'width15'
-- Output columns:
--   run_id, workload, position, labels, bin, bin_lo, bin_hi, mean_predicted,
--   observed_rate, count
SELECT run_id, workload, position, labels, bin, bin_lo, bin_hi, mean_predicted, observed_rate, count
FROM calibration_bins
WHERE binning = $binning AND ($runs IS NULL OR list_contains($runs, run_id))
ORDER BY run_id, labels, workload, position, bin;
