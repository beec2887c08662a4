-- Report: the bootstrap resamples behind the calibration intervals (from `dspark-obs calibrate`).
--
-- One row per run, label kind, workload, position and resample for one binning:
-- the resample's ECE, debiased ECE and Brier score.  Their spread is each
-- figure's standard error; the report's drift tests difference a run's resamples
-- with its baseline's.
--
-- Parameters:
--   $runs      these run ids (list); default NULL (every run)
--   $binning   width15 | width20 | mass15; default 'width15'
-- Output columns:
--   run_id, labels, workload, position, resample, ece, debiased_ece, brier
SELECT run_id, labels, workload, position, resample, ece, debiased_ece, brier
FROM calibration_resamples
WHERE binning = $binning AND ($runs IS NULL OR list_contains($runs, run_id))
ORDER BY run_id, labels, workload, position, resample;
