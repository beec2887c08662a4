-- Dashboard Throughput: total throughput vs per-user tok/s per run, method and driver concurrency, for all workloads and per workload.
--
-- From finished requests (completion_tokens > 0, e2e_latency_s > 0).
-- per_user_tok_s is the mean over requests of completion_tokens /
-- e2e_latency_s.  throughput_tok_s (workload '*' only) is total completion
-- tokens over the busy time by Little's law, sum(e2e_latency_s) /
-- concurrency, which also holds on the emulator's virtual clock; without a
-- recorded concurrency it is tokens over the wall span.  method is the
-- run's 'method' label, else its mode.  mean_accept_length is
-- sum(completion_tokens) / sum(spec_verify_ct).
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list); default NULL
--   $t0          requests submitted at or after this time; default NULL
--   $t1          requests submitted at or before this time; default NULL
-- Output columns:
--   run_id, mode, method, workload, concurrency, requests, completion_tokens,
--   per_user_tok_s, throughput_tok_s, mean_accept_length, mean_e2e_latency_s
WITH q AS (
    SELECT run_id, coalesce(workload, 'unknown') AS workload, concurrency, completion_tokens,
           e2e_latency_s, spec_verify_ct, submitted_at, finished_at
    FROM requests
    WHERE completion_tokens > 0 AND e2e_latency_s > 0
      AND ($runs IS NULL OR list_contains($runs, run_id))
      AND ($workloads IS NULL OR list_contains($workloads, coalesce(workload, 'unknown')))
      AND ($t0 IS NULL OR submitted_at >= $t0) AND ($t1 IS NULL OR submitted_at <= $t1)
),
agg AS (
    SELECT
        run_id,
        CASE WHEN grouping(workload) = 1 THEN '*' ELSE workload END AS workload,
        concurrency,
        count(*) AS requests,
        sum(completion_tokens) AS completion_tokens,
        avg(completion_tokens / e2e_latency_s) AS per_user_tok_s,
        CASE WHEN grouping(workload) = 1 THEN
            coalesce(sum(completion_tokens) / (sum(e2e_latency_s) / concurrency),
                     sum(completion_tokens) / nullif(epoch(max(finished_at) - min(submitted_at)), 0))
        END AS throughput_tok_s,
        sum(completion_tokens) / nullif(sum(spec_verify_ct), 0) AS mean_accept_length,
        avg(e2e_latency_s) AS mean_e2e_latency_s
    FROM q
    GROUP BY GROUPING SETS ((run_id, concurrency, workload), (run_id, concurrency))
)
SELECT
    a.run_id,
    r.mode,
    coalesce(r.labels['method'], r.mode) AS method,
    a.workload,
    a.concurrency,
    a.requests,
    CAST(a.completion_tokens AS BIGINT) AS completion_tokens,
    a.per_user_tok_s,
    a.throughput_tok_s,
    a.mean_accept_length,
    a.mean_e2e_latency_s
FROM agg AS a
LEFT JOIN runs AS r ON r.run_id = a.run_id
ORDER BY method NULLS LAST, a.run_id, a.workload = '*' DESC, a.workload, a.concurrency NULLS LAST;
