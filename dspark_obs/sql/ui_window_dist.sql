-- Dashboard Windows: request-steps per verify window (drafts checked) per run and workload, with utilisation against the full-block ceiling.
--
-- window = verify_len - 1 (0..gamma).  share is within the (run, workload).
-- accepted_tokens sums acc_len; ceiling_tokens sums what a full-block
-- verify would commit (block + 1) over the ceiling_steps where it is known:
-- exact in cap-accept and static runs (ceiling_source 'exact'), the mid
-- estimate of `dspark-obs estimate` in compact runs ('estimate'; no
-- ceiling table: null).  utilisation = accepted / ceiling over those steps.
-- Only windows that occur are listed.  Request-steps come summed per request
-- and window from the table macros request_windows and ceiling_request_windows
-- (sql/macros/request_windows.sql).
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
WITH x AS (SELECT * FROM request_windows($runs, $workloads, $dp_ranks, $t0, $t1)),
cx AS (SELECT * FROM ceiling_request_windows($runs, $workloads, $dp_ranks, $t0, $t1)),
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
