-- Run overview: one row per run with its source, mode, gamma, start time and row counts.
--
-- Lists every run that has a runs row or any steps, step_reqs, requests or
-- gaps rows (run metadata is NULL when the runs row is missing).
-- request_steps counts step_reqs rows; requests counts distinct rids.
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
-- Output columns:
--   run_id, source, mode, gamma, started_at, steps, request_steps, requests, gaps
WITH ids AS (
    SELECT run_id FROM runs
    UNION SELECT run_id FROM steps
    UNION SELECT run_id FROM step_reqs
    UNION SELECT run_id FROM requests
    UNION SELECT run_id FROM gaps
),
st AS (SELECT run_id, count(*) AS n FROM steps GROUP BY run_id),
sr AS (SELECT run_id, count(*) AS n FROM step_reqs GROUP BY run_id),
rq AS (SELECT run_id, count(DISTINCT rid) AS n FROM requests GROUP BY run_id),
gp AS (SELECT run_id, count(*) AS n FROM gaps GROUP BY run_id)
SELECT
    ids.run_id,
    r.source,
    r.mode,
    r.gamma,
    r.started_at,
    coalesce(st.n, 0) AS steps,
    coalesce(sr.n, 0) AS request_steps,
    coalesce(rq.n, 0) AS requests,
    coalesce(gp.n, 0) AS gaps
FROM ids
LEFT JOIN runs AS r ON r.run_id = ids.run_id
LEFT JOIN st ON st.run_id = ids.run_id
LEFT JOIN sr ON sr.run_id = ids.run_id
LEFT JOIN rq ON rq.run_id = ids.run_id
LEFT JOIN gp ON gp.run_id = ids.run_id
WHERE $run_id IS NULL OR ids.run_id = $run_id
ORDER BY r.started_at NULLS LAST, ids.run_id;
