-- Dashboard Throughput: total throughput vs per-user tok/s per run, method and driver concurrency, for all workloads and per workload.
--
-- From finished requests (completion_tokens > 0, e2e_latency_s > 0), every
-- figure on the run's clock (runs.clock: wall, or the emulator's virtual
-- cost-table clock; 'wall' when unrecorded).  per_user_tok_s is the mean over
-- requests of completion_tokens / e2e_latency_s.  throughput_tok_s is what the
-- selected requests produced over the run's busy time: by Little's law
-- sum(e2e_latency_s) / concurrency over every request of the run and
-- concurrency in the time range, whatever the workload filter, so a subset is
-- never extrapolated (filtering out a workload lowers the total).  Without a
-- recorded concurrency it is tokens over the wall span, on wall-clock runs
-- only (null on a virtual clock: the two clocks are never mixed).  method is
-- runs.method, else the 'method' label, else the mode.  mean_accept_length is
-- sum(completion_tokens) / sum(spec_verify_ct).
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list); default NULL
--   $t0          requests submitted at or after this time; default NULL
--   $t1          requests submitted at or before this time; default NULL
-- Output columns:
--   run_id, mode, method, clock, workload, concurrency, requests, completion_tokens,
--   per_user_tok_s, throughput_tok_s, mean_accept_length, mean_e2e_latency_s
WITH timed AS (
    SELECT run_id, coalesce(workload, 'unknown') AS workload, concurrency, completion_tokens,
           e2e_latency_s, spec_verify_ct, submitted_at, finished_at
    FROM requests
    WHERE completion_tokens > 0 AND e2e_latency_s > 0
      AND ($runs IS NULL OR list_contains($runs, run_id))
      AND ($t0 IS NULL OR submitted_at >= $t0) AND ($t1 IS NULL OR submitted_at <= $t1)
),
busy AS (
    SELECT run_id, concurrency, sum(e2e_latency_s) / concurrency AS busy_s,
           epoch(max(finished_at) - min(submitted_at)) AS span_s
    FROM timed GROUP BY run_id, concurrency
),
q AS (
    SELECT * FROM timed
    WHERE $workloads IS NULL OR list_contains($workloads, workload)
),
agg AS (
    SELECT
        run_id,
        CASE WHEN grouping(workload) = 1 THEN '*' ELSE workload END AS workload,
        concurrency,
        count(*) AS requests,
        sum(completion_tokens) AS completion_tokens,
        avg(completion_tokens / e2e_latency_s) AS per_user_tok_s,
        sum(completion_tokens) / nullif(sum(spec_verify_ct), 0) AS mean_accept_length,
        avg(e2e_latency_s) AS mean_e2e_latency_s
    FROM q
    GROUP BY GROUPING SETS ((run_id, concurrency, workload), (run_id, concurrency))
)
SELECT
    a.run_id,
    r.mode,
    coalesce(r.method, r.labels['method'], r.mode) AS method,
    coalesce(r.clock, 'wall') AS clock,
    a.workload,
    a.concurrency,
    a.requests,
    CAST(a.completion_tokens AS BIGINT) AS completion_tokens,
    a.per_user_tok_s,
    CASE WHEN b.busy_s > 0 THEN a.completion_tokens / b.busy_s
         WHEN coalesce(r.clock, 'wall') = 'wall' THEN a.completion_tokens / nullif(b.span_s, 0) END
        AS throughput_tok_s,
    a.mean_accept_length,
    a.mean_e2e_latency_s
FROM agg AS a
JOIN busy AS b ON b.run_id = a.run_id AND b.concurrency IS NOT DISTINCT FROM a.concurrency
LEFT JOIN runs AS r ON r.run_id = a.run_id
ORDER BY method NULLS LAST, a.run_id, a.workload = '*' DESC, a.workload, a.concurrency NULLS LAST;
