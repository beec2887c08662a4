-- Report: every run with its metadata and what it collected; `dspark-obs report` picks its runs here.
--
-- A run is listed when it has a runs, steps or step_reqs row (counts: the
-- run_counts macro, sql/macros/runs.sql).  companion_of
-- names the compact run a cap-accept companion replays (such runs are not
-- reported on their own).  server_info is the first /server_info body (JSON).
--
-- Parameters: none
-- Output columns:
--   run_id, mode, gamma, source, started_at, ended_at, companion_of, end_reason,
--   server_info, steps, request_steps, requests
SELECT c.run_id, r.mode, r.gamma, r.source, r.started_at, r.ended_at, r.companion_of, r.end_reason,
       r.server_info, c.steps, c.request_steps, c.requests
FROM run_counts(NULL, NULL, NULL) AS c
LEFT JOIN runs AS r ON r.run_id = c.run_id
WHERE list_has_any(c.seen_in, ['runs', 'steps', 'step_reqs'])
ORDER BY r.started_at NULLS FIRST, c.run_id;
