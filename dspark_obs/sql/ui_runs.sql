-- Dashboard Overview: one row per run with its mode, method, source, duration and what was collected.
--
-- A run is listed when it has a runs, steps, step_reqs or requests row.
-- method is the run's 'method' label, else its mode.  duration_s is
-- ended_at - started_at on the wall clock (null while running); clock is the
-- clock of the run's latencies and step times (wall | virtual).  The counts honour the DP-rank
-- filter (steps, gaps) and the time filter (requests by submitted_at); the
-- time filter also drops runs whose [started_at, ended_at] misses the range.
-- missing_forward_cts is an upper bound on lost decode records (counts: the
-- run_counts macro, sql/macros/runs.sql).
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
SELECT
    c.run_id,
    r.mode,
    coalesce(r.method, r.labels['method'], r.mode) AS method,
    r.gamma,
    r.source,
    r.dp_size,
    r.started_at,
    epoch(r.ended_at - r.started_at) AS duration_s,
    c.requests,
    c.steps,
    c.request_steps,
    c.gaps,
    c.missing_forward_cts,
    c.dead_letters,
    r.companion_of,
    r.end_reason,
    coalesce(r.clock, 'wall') AS clock,
    r.sweep_id
FROM run_counts($dp_ranks, $t0, $t1) AS c
LEFT JOIN runs AS r ON r.run_id = c.run_id
WHERE list_has_any(c.seen_in, ['runs', 'steps', 'step_reqs', 'requests'])
  AND ($runs IS NULL OR list_contains($runs, c.run_id))
  AND ($t1 IS NULL OR r.started_at IS NULL OR r.started_at <= $t1)
  AND ($t0 IS NULL OR r.ended_at IS NULL OR r.ended_at >= $t0)
ORDER BY r.started_at NULLS LAST, c.run_id;
