-- Dashboard Ceiling: per run, workload and draft position k, the share of request-steps whose first k drafts were committed vs would survive a full block.
--
-- committed_share: correct_drafts >= k (what the run committed).
-- full_block_share: the first k drafts would survive a full-block verify -
-- exact for cap-accept (correct_drafts + cap_trim >= k) and static runs
-- (the mode_block_accept macro; source 'exact'); for compact runs the
-- expectation from the ceiling table of `dspark-obs estimate`,
-- clamp(mid - (k - 1), 0, 1), with lo and hi in
-- place of mid for full_block_lo / full_block_hi (source 'estimate').
-- Compact runs without a ceiling table give no rows.  k runs 1..gamma.
-- Rows are summed per request first; workload and time filters apply to those sums.
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list); default NULL
--   $dp_ranks    only these DP ranks (list); default NULL
--   $t0          requests submitted at or after this time; default NULL
--   $t1          requests submitted at or before this time; default NULL
-- Output columns:
--   run_id, mode, workload, position, request_steps, committed_share,
--   full_block_share, full_block_lo, full_block_hi, source
WITH exact_runs AS (
    SELECT run_id, mode, gamma FROM runs WHERE mode IN ('cap-accept', 'static')
),
exact_req AS (  -- cap-accept/static request-steps counted per request and outcome
    SELECT run_id, rid, correct_drafts, cap_trim, max(len(draft_tokens)) AS block_size, count(*) AS n
    FROM step_reqs
    WHERE run_id IN (SELECT run_id FROM exact_runs)
      AND ($runs IS NULL OR list_contains($runs, run_id))
      AND ($dp_ranks IS NULL OR list_contains($dp_ranks, dp_rank))
    GROUP BY run_id, rid, correct_drafts, cap_trim
),
exact_pos AS (
    SELECT e.run_id, any_value(r.mode) AS mode, coalesce(q.workload, 'unknown') AS workload, k AS position,
           CAST(sum(e.n) AS BIGINT) AS request_steps,
           sum(e.n) FILTER (WHERE e.correct_drafts >= k) / sum(e.n) AS committed_share,
           sum(e.n) FILTER (WHERE mode_block_accept(r.mode, e.correct_drafts, e.cap_trim) >= k)
               / sum(e.n) AS full_block_share
    FROM exact_req AS e
    JOIN exact_runs AS r ON r.run_id = e.run_id
    LEFT JOIN request_index($runs) AS q ON q.run_id = e.run_id AND q.rid = e.rid
    CROSS JOIN range(1, 65) AS g(k)
    WHERE ($workloads IS NULL OR list_contains($workloads, coalesce(q.workload, 'unknown')))
      AND ($t0 IS NULL OR q.submitted_at >= $t0) AND ($t1 IS NULL OR q.submitted_at <= $t1)
      AND k <= coalesce(r.gamma, e.block_size)
    GROUP BY e.run_id, coalesce(q.workload, 'unknown'), k
),
est_req AS (  -- compact request-steps: the estimate's survival share per request and position
    SELECT c.run_id, c.rid, k, count(*) AS n,
           sum(CASE WHEN c.correct_drafts >= k THEN 1 ELSE 0 END) AS committed,
           sum(greatest(least(c.mid - (k - 1), 1.0), 0.0)) AS mid,
           sum(greatest(least(c.lo - (k - 1), 1.0), 0.0)) AS lo,
           sum(greatest(least(c.hi - (k - 1), 1.0), 0.0)) AS hi
    FROM (
        SELECT c.*, unnest(generate_series(1, coalesce(r.gamma, 6))) AS k
        FROM ceiling AS c
        JOIN ceiling_method() AS m ON m.run_id = c.run_id AND m.method = c.method
        LEFT JOIN runs AS r ON r.run_id = c.run_id
        WHERE coalesce(r.mode, 'compact') NOT IN ('cap-accept', 'static')
          AND ($runs IS NULL OR list_contains($runs, c.run_id))
          AND ($dp_ranks IS NULL OR list_contains($dp_ranks, c.dp_rank))
    ) AS c
    GROUP BY c.run_id, c.rid, k
),
est_pos AS (
    SELECT e.run_id, coalesce(q.workload, 'unknown') AS workload, e.k AS position,
           CAST(sum(e.n) AS BIGINT) AS request_steps,
           sum(e.committed) / sum(e.n) AS committed_share, sum(e.mid) / sum(e.n) AS full_block_share,
           sum(e.lo) / sum(e.n) AS full_block_lo, sum(e.hi) / sum(e.n) AS full_block_hi
    FROM est_req AS e
    LEFT JOIN request_index($runs) AS q ON q.run_id = e.run_id AND q.rid = e.rid
    WHERE ($workloads IS NULL OR list_contains($workloads, coalesce(q.workload, 'unknown')))
      AND ($t0 IS NULL OR q.submitted_at >= $t0) AND ($t1 IS NULL OR q.submitted_at <= $t1)
    GROUP BY e.run_id, coalesce(q.workload, 'unknown'), e.k
)
SELECT run_id, mode, workload, position, request_steps, committed_share, full_block_share,
       full_block_share AS full_block_lo, full_block_share AS full_block_hi, 'exact' AS source
FROM exact_pos
UNION ALL
SELECT p.run_id, coalesce(r.mode, 'compact'), p.workload, p.position, p.request_steps, p.committed_share,
       p.full_block_share, p.full_block_lo, p.full_block_hi, 'estimate' AS source
FROM est_pos AS p
LEFT JOIN runs AS r ON r.run_id = p.run_id
ORDER BY run_id, workload, position;
