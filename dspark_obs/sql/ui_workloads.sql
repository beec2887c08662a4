-- Dashboard Overview: per run and workload, accept length against the full-block ceiling, window, censoring and ECE.
--
-- One row per (run, workload) plus a '*' row per run for all workloads.
-- mean_acc_len is committed tokens per request-step (correct_drafts + 1).
-- The ceiling is what a full-block verify would commit per request-step:
-- exact in cap-accept (correct_drafts + cap_trim + 1) and static runs
-- (ceiling_source 'exact'), estimated for compact runs from the ceiling
-- table of `dspark-obs estimate` (mean of mid + 1, with the means of lo + 1
-- and hi + 1 as its interval; ceiling_source 'estimate'), null otherwise.
-- utilisation = accepted / ceiling.  censored_share counts compact steps
-- that accepted their whole window below gamma.  ece is the mean over
-- positions of the 15-bin ECE of survival from `dspark-obs calibrate`, with
-- the best labels stored (companion, else reconstructed, else observed);
-- it is per run and ignores the DP-rank and time filters.  Request-step
-- filters: run, workload, DP rank, and the request's submission time.
-- Request-steps come summed per request and window from the table macros
-- request_windows and ceiling_request_windows (sql/macros/request_windows.sql).
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list); default NULL
--   $dp_ranks    only these DP ranks (list); default NULL
--   $t0          requests submitted at or after this time; default NULL
--   $t1          requests submitted at or before this time; default NULL
-- Output columns:
--   run_id, mode, workload, requests, request_steps, mean_acc_len,
--   mean_window, full_window_share, censored_share, ceiling_len,
--   ceiling_len_lo, ceiling_len_hi, ceiling_source, utilisation, ece,
--   ece_labels
WITH x AS (SELECT * FROM request_windows($runs, $workloads, $dp_ranks, $t0, $t1)),
cx AS (SELECT * FROM ceiling_request_windows($runs, $workloads, $dp_ranks, $t0, $t1)),
base AS (
    SELECT
        run_id,
        CASE WHEN grouping(workload) = 1 THEN '*' ELSE workload END AS workload,
        any_value(mode) AS mode,
        count(DISTINCT rid) AS requests,
        CAST(sum(n) AS BIGINT) AS request_steps,
        sum(acc) / sum(n) AS mean_acc_len,
        sum("window" * n) / sum(n) AS mean_window,
        coalesce(sum(n) FILTER (WHERE "window" = gamma), 0) / sum(n) AS full_window_share,
        coalesce(sum(all_accepted) FILTER (WHERE mode = 'compact' AND "window" < gamma), 0) / sum(n) AS censored_share,
        sum(exact_tokens) / sum(n) AS exact_len
    FROM x
    GROUP BY GROUPING SETS ((run_id, workload), (run_id))
),
ce_w AS (
    SELECT run_id, CASE WHEN grouping(workload) = 1 THEN '*' ELSE workload END AS workload,
           sum(mid) / sum(n) AS len_mid, sum(lo) / sum(n) AS len_lo, sum(hi) / sum(n) AS len_hi,
           sum(acc) / sum(mid) AS utilisation
    FROM cx
    GROUP BY GROUPING SETS ((run_id, workload), (run_id))
),
cal AS (
    SELECT run_id, workload, labels, avg(ece) AS ece
    FROM calibration
    WHERE binning = 'width15' AND ($runs IS NULL OR list_contains($runs, run_id))
    GROUP BY run_id, workload, labels
),
calp AS (
    SELECT run_id, workload,
           arg_min(ece, CASE labels WHEN 'companion' THEN 0 WHEN 'reconstructed' THEN 1 ELSE 2 END) AS ece,
           arg_min(labels, CASE labels WHEN 'companion' THEN 0 WHEN 'reconstructed' THEN 1 ELSE 2 END) AS ece_labels
    FROM cal
    GROUP BY run_id, workload
)
SELECT
    b.run_id,
    b.mode,
    b.workload,
    b.requests,
    b.request_steps,
    b.mean_acc_len,
    b.mean_window,
    b.full_window_share,
    b.censored_share,
    coalesce(b.exact_len, ce.len_mid) AS ceiling_len,
    coalesce(b.exact_len, ce.len_lo) AS ceiling_len_lo,
    coalesce(b.exact_len, ce.len_hi) AS ceiling_len_hi,
    CASE WHEN b.exact_len IS NOT NULL THEN 'exact' WHEN ce.len_mid IS NOT NULL THEN 'estimate' END AS ceiling_source,
    coalesce(b.mean_acc_len / b.exact_len, ce.utilisation) AS utilisation,
    calp.ece,
    calp.ece_labels
FROM base AS b
LEFT JOIN ce_w AS ce ON ce.run_id = b.run_id AND ce.workload = b.workload
LEFT JOIN calp ON calp.run_id = b.run_id AND calp.workload = b.workload
ORDER BY b.run_id, b.workload = '*' DESC, b.workload;
