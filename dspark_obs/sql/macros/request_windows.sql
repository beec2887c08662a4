-- Table macros over the store's views, created by dspark_obs.sql.connect (so `dspark-obs sql` has them too).
--
-- The dashboard's window queries (ui_workloads, ui_window_dist) read the
-- request-steps through these, so their filters and partial sums agree.
-- Every argument may be NULL (no filter): runs, workloads, dp_ranks are
-- lists; t0, t1 bound the request's submission time.

-- One row per request: its workload ('unknown' when none) and submission time.
CREATE OR REPLACE MACRO request_index(runs) AS TABLE
SELECT run_id, rid, coalesce(any_value(workload), 'unknown') AS workload, any_value(submitted_at) AS submitted_at
FROM requests
WHERE runs IS NULL OR list_contains(runs, run_id)
GROUP BY run_id, rid;

-- One estimator method per run of the ceiling table: 'default' when present.
CREATE OR REPLACE MACRO ceiling_method() AS TABLE
SELECT run_id, CASE WHEN bool_or(method = 'default') THEN 'default' ELSE min(method) END AS method
FROM ceiling GROUP BY run_id;

-- Request-steps summed per request and verify window (window = verify_len - 1),
-- with the run's mode and gamma and the request's workload: n request-steps,
-- acc (sum of acc_len), all_accepted (steps that accepted their whole
-- window), exact_tokens (what a full-block verify commits where the run's mode
-- shows it, mode_block_accept + 1 summed: cap-accept correct_drafts + cap_trim
-- + 1, static correct_drafts + 1; null in compact).
-- The one pass over step_reqs; the joins run on its partial sums.
CREATE OR REPLACE MACRO request_windows(runs, workloads, dp_ranks, t0, t1) AS TABLE
WITH pw AS (
    SELECT run_id, rid, verify_len - 1 AS "window", count(*) AS n, sum(acc_len) AS acc,
           count(*) FILTER (WHERE correct_drafts = verify_len - 1) AS all_accepted,
           sum(correct_drafts) AS correct, sum(cap_trim) AS cap, max(len(draft_tokens)) AS block
    FROM step_reqs
    WHERE (runs IS NULL OR list_contains(runs, run_id))
      AND (dp_ranks IS NULL OR list_contains(dp_ranks, dp_rank))
    GROUP BY run_id, rid, verify_len
)
SELECT pw.run_id, pw.rid, pw."window", pw.n, pw.acc, pw.all_accepted, r.mode,
       coalesce(r.gamma, max(pw.block) OVER (PARTITION BY pw.run_id)) AS gamma,
       coalesce(q.workload, 'unknown') AS workload,
       mode_block_accept(r.mode, pw.correct, pw.cap) + pw.n AS exact_tokens  -- the rule is linear: sums in, sum out
FROM pw
LEFT JOIN runs AS r ON r.run_id = pw.run_id
LEFT JOIN request_index(runs) AS q ON q.run_id = pw.run_id AND q.rid = pw.rid
WHERE (workloads IS NULL OR list_contains(workloads, coalesce(q.workload, 'unknown')))
  AND (t0 IS NULL OR q.submitted_at >= t0) AND (t1 IS NULL OR q.submitted_at <= t1);

-- The ceiling estimate (`dspark-obs estimate`) summed per request and window:
-- n request-steps, mid/lo/hi (sums of the accept lengths mid + 1, lo + 1,
-- hi + 1) and acc (sum of correct_drafts + 1), with the request's workload.
-- One estimator method per run (ceiling_method).
CREATE OR REPLACE MACRO ceiling_request_windows(runs, workloads, dp_ranks, t0, t1) AS TABLE
WITH ce AS (
    SELECT c.run_id, c.rid, c."window", count(*) AS n, sum(c.mid + 1) AS mid, sum(c.lo + 1) AS lo,
           sum(c.hi + 1) AS hi, sum(c.correct_drafts + 1) AS acc
    FROM ceiling AS c
    JOIN ceiling_method() AS m ON m.run_id = c.run_id AND m.method = c.method
    WHERE (runs IS NULL OR list_contains(runs, c.run_id))
      AND (dp_ranks IS NULL OR list_contains(dp_ranks, c.dp_rank))
    GROUP BY c.run_id, c.rid, c."window"
)
SELECT ce.*, coalesce(q.workload, 'unknown') AS workload
FROM ce
LEFT JOIN request_index(runs) AS q ON q.run_id = ce.run_id AND q.rid = ce.rid
WHERE (workloads IS NULL OR list_contains(workloads, coalesce(q.workload, 'unknown')))
  AND (t0 IS NULL OR q.submitted_at >= t0) AND (t1 IS NULL OR q.submitted_at <= t1);
