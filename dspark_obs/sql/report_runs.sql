-- Report: every run with its metadata and what it collected; `dspark-obs report` picks its runs here.
--
-- A run is listed when it has a runs, steps or step_reqs row.  companion_of
-- names the compact run a cap-accept companion replays (such runs are not
-- reported on their own).  server_info is the first /server_info body (JSON).
--
-- Parameters: none
-- Output columns:
--   run_id, mode, gamma, source, started_at, ended_at, companion_of, end_reason,
--   server_info, steps, request_steps, requests
WITH ids AS (
    SELECT run_id FROM runs
    UNION SELECT run_id FROM steps
    UNION SELECT run_id FROM step_reqs
),
st AS (SELECT run_id, count(*) AS n FROM steps GROUP BY run_id),
sr AS (SELECT run_id, count(*) AS n FROM step_reqs GROUP BY run_id),
rq AS (SELECT run_id, count(DISTINCT rid) AS n FROM requests GROUP BY run_id)
SELECT
    ids.run_id,
    r.mode,
    r.gamma,
    r.source,
    r.started_at,
    r.ended_at,
    r.companion_of,
    r.end_reason,
    r.server_info,
    coalesce(st.n, 0) AS steps,
    coalesce(sr.n, 0) AS request_steps,
    coalesce(rq.n, 0) AS requests
FROM ids
LEFT JOIN runs AS r ON r.run_id = ids.run_id
LEFT JOIN st ON st.run_id = ids.run_id
LEFT JOIN sr ON sr.run_id = ids.run_id
LEFT JOIN rq ON rq.run_id = ids.run_id
ORDER BY r.started_at NULLS FIRST, ids.run_id;
