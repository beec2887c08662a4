-- Dashboard Ceiling: request-steps per estimate category (SGLang's analyzer categories) per run and workload.
--
-- From the ceiling table of `dspark-obs estimate`: exact_in_window (the
-- window rejected a draft, or covered the block), censored_resolved_exact,
-- censored_diverged, censored_eos, censored_at_end.  share is within the
-- (run, workload).  A cap-accept run's ceiling is observed (correct_drafts +
-- cap_trim), never censored: its steps count as observed_cap_accept.
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list); default NULL
--   $dp_ranks    only these DP ranks (list); default NULL
--   $t0          requests submitted at or after this time; default NULL
--   $t1          requests submitted at or before this time; default NULL
-- Output columns:
--   run_id, workload, category, request_steps, share, mean_width
WITH per_req AS (
    SELECT c.run_id, c.rid,
           CASE WHEN r.mode = 'cap-accept' THEN 'observed_cap_accept' ELSE c.category END AS category,
           count(*) AS n, sum(CASE WHEN r.mode = 'cap-accept' THEN 0 ELSE c.hi - c.lo END) AS width
    FROM ceiling AS c
    JOIN ceiling_method() AS m ON m.run_id = c.run_id AND m.method = c.method
    LEFT JOIN runs AS r ON r.run_id = c.run_id
    WHERE ($runs IS NULL OR list_contains($runs, c.run_id))
      AND ($dp_ranks IS NULL OR list_contains($dp_ranks, c.dp_rank))
    GROUP BY ALL
),
per_wl AS (
    SELECT p.run_id, coalesce(q.workload, 'unknown') AS workload, p.category, sum(p.n) AS n, sum(p.width) AS width
    FROM per_req AS p
    LEFT JOIN request_index($runs) AS q ON q.run_id = p.run_id AND q.rid = p.rid
    WHERE ($workloads IS NULL OR list_contains($workloads, coalesce(q.workload, 'unknown')))
      AND ($t0 IS NULL OR q.submitted_at >= $t0) AND ($t1 IS NULL OR q.submitted_at <= $t1)
    GROUP BY p.run_id, coalesce(q.workload, 'unknown'), p.category
)
SELECT
    run_id,
    workload,
    category,
    CAST(n AS BIGINT) AS request_steps,
    n / sum(n) OVER (PARTITION BY run_id, workload) AS share,
    width / n AS mean_width
FROM per_wl
ORDER BY run_id, workload, category;
