-- Run overview: one row per run with its source, mode, gamma, start time and row counts.
--
-- Lists every run that has a runs row or any steps, step_reqs, requests or
-- gaps rows (run metadata is NULL when the runs row is missing).
-- request_steps counts step_reqs rows; requests counts distinct rids
-- (the run_counts macro, sql/macros/runs.sql).
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
-- Output columns:
--   run_id, source, mode, gamma, started_at, steps, request_steps, requests, gaps
SELECT c.run_id, r.source, r.mode, r.gamma, r.started_at, c.steps, c.request_steps, c.requests, c.gaps
FROM run_counts(NULL, NULL, NULL) AS c
LEFT JOIN runs AS r ON r.run_id = c.run_id
WHERE $run_id IS NULL OR c.run_id = $run_id
ORDER BY r.started_at NULLS LAST, c.run_id;
