-- Dashboard: one run's stored metadata (mode, gamma, labels, companion, server info JSON).
--
-- The runs row of $run_id; no row when the run has none.  labels is the
-- map of free-form labels as JSON text.
--
-- Parameters:
--   $run_id   the run; default NULL (no rows)
-- Output columns:
--   run_id, mode, gamma, source, companion_of, labels, server_version, server_info
SELECT run_id, mode, gamma, source, companion_of, CAST(to_json(labels) AS VARCHAR) AS labels, server_version,
       server_info
FROM runs
WHERE run_id = $run_id;
