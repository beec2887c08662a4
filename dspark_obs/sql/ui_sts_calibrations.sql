-- Dashboard Calibration: stored STS calibration files (from `dspark-obs ingest --sts FILE`) with ECE before and after.
--
-- One row per imported file of the selected runs, newest first: the fitted
-- per-position temperatures, the ECE per position before and after STS as
-- the file reports them, and the file's text (for a download).
--
-- Parameters:
--   $runs   only these run ids (list); default NULL (every run)
-- Output columns:
--   run_id, path, dataset, num_samples, temperatures, ece_before, ece_after, raw_json, imported_at
SELECT run_id, path, dataset, num_samples, temperatures, ece_before, ece_after, raw_json, imported_at
FROM sts_calibrations
WHERE $runs IS NULL OR list_contains($runs, run_id)
ORDER BY imported_at DESC NULLS LAST, run_id, path;
