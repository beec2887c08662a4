-- Dashboard Windows: request-steps per verify window (drafts checked) per run and workload, with utilisation against the full-block ceiling.
--
-- window = verify_len - 1 (0..gamma).  share is within the (run, workload).
-- accepted_tokens sums acc_len; ceiling_tokens sums what a full-block
-- verify would commit (block + 1) over the ceiling_steps where it is known:
-- exact in cap-accept and static runs (ceiling_source 'exact'), the mid
-- estimate of `dspark-obs estimate` in compact runs ('estimate'; no
-- ceiling table: null).  utilisation = accepted / ceiling over those steps.
-- Only windows that occur are listed.  Request-steps are summed per request
-- and window first, so the joins with runs and requests run on partial sums.
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list); default NULL
--   $dp_ranks    only these DP ranks (list); default NULL
--   $t0          requests submitted at or after this time; default NULL
--   $t1          requests submitted at or before this time; default NULL
-- Output columns:
--   run_id, mode, workload, gamma, window, request_steps, share,
--   accepted_tokens, ceiling_tokens, ceiling_steps, utilisation, ceiling_source
WITH rq AS (  -- one row per request: its workload and submission time
    SELECT run_id, rid, coalesce(any_value(workload), 'unknown') AS workload, any_value(submitted_at) AS submitted_at
    FROM requests
    WHERE $runs IS NULL OR list_contains($runs, run_id)
    GROUP BY run_id, rid
),
pw AS (  -- the one pass over step_reqs: partial sums per request and window
    SELECT run_id, rid, verify_len - 1 AS "window", count(*) AS n, sum(acc_len) AS acc,
           count(*) FILTER (WHERE correct_drafts = verify_len - 1) AS all_accepted,
           sum(correct_drafts + cap_trim + 1) AS cap_len, sum(correct_drafts + 1) AS static_len,
           max(len(draft_tokens)) AS block
    FROM step_reqs
    WHERE ($runs IS NULL OR list_contains($runs, run_id))
      AND ($dp_ranks IS NULL OR list_contains($dp_ranks, dp_rank))
    GROUP BY run_id, rid, verify_len
),
x AS (  -- with the run's mode and gamma and the request's workload; workload and time filters
    SELECT pw.*, r.mode, coalesce(r.gamma, max(pw.block) OVER (PARTITION BY pw.run_id)) AS gamma,
           coalesce(q.workload, 'unknown') AS workload,
           CASE WHEN r.mode = 'cap-accept' THEN pw.cap_len WHEN r.mode = 'static' THEN pw.static_len END AS exact_tokens
    FROM pw
    LEFT JOIN runs AS r ON r.run_id = pw.run_id
    LEFT JOIN rq AS q ON q.run_id = pw.run_id AND q.rid = pw.rid
    WHERE ($workloads IS NULL OR list_contains($workloads, coalesce(q.workload, 'unknown')))
      AND ($t0 IS NULL OR q.submitted_at >= $t0) AND ($t1 IS NULL OR q.submitted_at <= $t1)
),
meth AS (  -- one estimator method per run: 'default' when present
    SELECT run_id, CASE WHEN bool_or(method = 'default') THEN 'default' ELSE min(method) END AS method
    FROM ceiling GROUP BY run_id
),
ce AS (  -- the ceiling estimate, summed per request and window
    SELECT c.run_id, c.rid, c."window", count(*) AS n, sum(c.mid + 1) AS mid, sum(c.lo + 1) AS lo,
           sum(c.hi + 1) AS hi, sum(c.correct_drafts + 1) AS acc
    FROM ceiling AS c
    JOIN meth AS m ON m.run_id = c.run_id AND m.method = c.method
    WHERE ($runs IS NULL OR list_contains($runs, c.run_id))
      AND ($dp_ranks IS NULL OR list_contains($dp_ranks, c.dp_rank))
    GROUP BY c.run_id, c.rid, c."window"
),
cx AS (
    SELECT ce.*, coalesce(q.workload, 'unknown') AS workload
    FROM ce
    LEFT JOIN rq AS q ON q.run_id = ce.run_id AND q.rid = ce.rid
    WHERE ($workloads IS NULL OR list_contains($workloads, coalesce(q.workload, 'unknown')))
      AND ($t0 IS NULL OR q.submitted_at >= $t0) AND ($t1 IS NULL OR q.submitted_at <= $t1)
),
dist AS (
    SELECT run_id, any_value(mode) AS mode, workload, max(gamma) AS gamma, "window",
           CAST(sum(n) AS BIGINT) AS request_steps, sum(acc) AS accepted_tokens,
           sum(exact_tokens) AS exact_tokens,
           sum(acc) FILTER (WHERE exact_tokens IS NOT NULL) AS exact_accepted,
           CAST(coalesce(sum(n) FILTER (WHERE exact_tokens IS NOT NULL), 0) AS BIGINT) AS exact_steps
    FROM x
    GROUP BY run_id, workload, "window"
),
est AS (
    SELECT run_id, workload, "window", sum(mid) AS ceiling_tokens, sum(acc) AS accepted, sum(n) AS steps
    FROM cx
    GROUP BY run_id, workload, "window"
)
SELECT
    d.run_id,
    d.mode,
    d.workload,
    d.gamma,
    d."window",
    d.request_steps,
    d.request_steps / sum(d.request_steps) OVER (PARTITION BY d.run_id, d.workload) AS share,
    CAST(d.accepted_tokens AS BIGINT) AS accepted_tokens,
    CASE WHEN d.exact_steps > 0 THEN CAST(d.exact_tokens AS DOUBLE) ELSE e.ceiling_tokens END AS ceiling_tokens,
    CAST(CASE WHEN d.exact_steps > 0 THEN d.exact_steps ELSE e.steps END AS BIGINT) AS ceiling_steps,
    CASE WHEN d.exact_steps > 0 THEN d.exact_accepted / d.exact_tokens
         ELSE e.accepted / e.ceiling_tokens END AS utilisation,
    CASE WHEN d.exact_steps > 0 THEN 'exact' WHEN e.steps IS NOT NULL THEN 'estimate' END AS ceiling_source
FROM dist AS d
LEFT JOIN est AS e ON e.run_id = d.run_id AND e.workload = d.workload AND e."window" = d."window"
ORDER BY d.run_id, d.workload, d."window";
