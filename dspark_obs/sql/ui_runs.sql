-- Dashboard Overview: one row per run with its mode, method, source, duration and what was collected.
--
-- A run is listed when it has a runs, steps, step_reqs or requests row.
-- method is the run's 'method' label, else its mode.  duration_s is
-- ended_at - started_at on the wall clock (null while running); clock is the
-- clock of the run's latencies and step times (wall | virtual).  The counts honour the DP-rank
-- filter (steps, gaps) and the time filter (requests by submitted_at); the
-- time filter also drops runs whose [started_at, ended_at] misses the range.
-- missing_forward_cts is an upper bound on lost decode records.
--
-- Parameters:
--   $runs       only these run ids (list); default NULL (every run)
--   $dp_ranks   only these DP ranks (list); default NULL
--   $t0         requests submitted at or after this time; default NULL
--   $t1         requests submitted at or before this time; default NULL
-- Output columns:
--   run_id, mode, method, gamma, source, dp_size, started_at, duration_s,
--   requests, steps, request_steps, gaps, missing_forward_cts, dead_letters,
--   companion_of, end_reason, clock, sweep_id
WITH ids AS (
    SELECT run_id FROM runs
    UNION SELECT run_id FROM steps
    UNION SELECT run_id FROM step_reqs
    UNION SELECT run_id FROM requests
),
st AS (
    SELECT run_id, count(*) AS n FROM steps
    WHERE $dp_ranks IS NULL OR list_contains($dp_ranks, dp_rank)
    GROUP BY run_id
),
sr AS (
    SELECT run_id, count(*) AS n FROM step_reqs
    WHERE $dp_ranks IS NULL OR list_contains($dp_ranks, dp_rank)
    GROUP BY run_id
),
rq AS (
    SELECT run_id, count(DISTINCT rid) AS n FROM requests
    WHERE ($t0 IS NULL OR submitted_at >= $t0) AND ($t1 IS NULL OR submitted_at <= $t1)
    GROUP BY run_id
),
gp AS (
    SELECT run_id, count(*) AS n,
           sum(last_missing_forward_ct - first_missing_forward_ct + 1) AS missing
    FROM gaps
    WHERE $dp_ranks IS NULL OR list_contains($dp_ranks, dp_rank)
    GROUP BY run_id
),
dl AS (SELECT run_id, count(*) AS n FROM dead_letters GROUP BY run_id)
SELECT
    ids.run_id,
    r.mode,
    coalesce(r.method, r.labels['method'], r.mode) AS method,
    r.gamma,
    r.source,
    r.dp_size,
    r.started_at,
    epoch(r.ended_at - r.started_at) AS duration_s,
    coalesce(rq.n, 0) AS requests,
    coalesce(st.n, 0) AS steps,
    coalesce(sr.n, 0) AS request_steps,
    coalesce(gp.n, 0) AS gaps,
    CAST(coalesce(gp.missing, 0) AS BIGINT) AS missing_forward_cts,
    coalesce(dl.n, 0) AS dead_letters,
    r.companion_of,
    r.end_reason,
    coalesce(r.clock, 'wall') AS clock,
    r.sweep_id
FROM ids
LEFT JOIN runs AS r ON r.run_id = ids.run_id
LEFT JOIN st ON st.run_id = ids.run_id
LEFT JOIN sr ON sr.run_id = ids.run_id
LEFT JOIN rq ON rq.run_id = ids.run_id
LEFT JOIN gp ON gp.run_id = ids.run_id
LEFT JOIN dl ON dl.run_id = ids.run_id
WHERE ($runs IS NULL OR list_contains($runs, ids.run_id))
  AND ($t1 IS NULL OR r.started_at IS NULL OR r.started_at <= $t1)
  AND ($t0 IS NULL OR r.ended_at IS NULL OR r.ended_at >= $t0)
ORDER BY r.started_at NULLS LAST, ids.run_id;
