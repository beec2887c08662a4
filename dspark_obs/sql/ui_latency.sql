-- Dashboard latency: TTFT, inter-token and end-to-end latency p50/p90/p99 per run and workload, on the run's clock.
--
-- From finished requests (completion_tokens > 0).  ttft is requests.ttft_s
-- (null when the server does not report it); itl is a request's mean
-- inter-token latency (e2e_latency_s - ttft_s) / (completion_tokens - 1),
-- null without a TTFT or with one token; e2e is e2e_latency_s.  Quantiles are
-- DuckDB's quantile_cont over requests.  clock is runs.clock ('wall' when
-- unrecorded).  Rows with workload '*' pool the run's workloads.
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list); default NULL
--   $t0          requests submitted at or after this time; default NULL
--   $t1          requests submitted at or before this time; default NULL
-- Output columns:
--   run_id, method, clock, workload, requests, ttft_p50_s, ttft_p90_s, ttft_p99_s,
--   itl_p50_s, itl_p90_s, itl_p99_s, e2e_p50_s, e2e_p90_s, e2e_p99_s
WITH q AS (
    SELECT run_id, coalesce(workload, 'unknown') AS workload, ttft_s, e2e_latency_s AS e2e_s,
           CASE WHEN ttft_s IS NOT NULL AND completion_tokens > 1
                THEN (e2e_latency_s - ttft_s) / (completion_tokens - 1) END AS itl_s
    FROM requests
    WHERE completion_tokens > 0 AND e2e_latency_s IS NOT NULL
      AND ($runs IS NULL OR list_contains($runs, run_id))
      AND ($workloads IS NULL OR list_contains($workloads, coalesce(workload, 'unknown')))
      AND ($t0 IS NULL OR submitted_at >= $t0) AND ($t1 IS NULL OR submitted_at <= $t1)
),
agg AS (
    SELECT run_id, CASE WHEN grouping(workload) = 1 THEN '*' ELSE workload END AS workload,
           count(*) AS requests,
           quantile_cont(ttft_s, 0.5) AS ttft_p50_s, quantile_cont(ttft_s, 0.9) AS ttft_p90_s,
           quantile_cont(ttft_s, 0.99) AS ttft_p99_s,
           quantile_cont(itl_s, 0.5) AS itl_p50_s, quantile_cont(itl_s, 0.9) AS itl_p90_s,
           quantile_cont(itl_s, 0.99) AS itl_p99_s,
           quantile_cont(e2e_s, 0.5) AS e2e_p50_s, quantile_cont(e2e_s, 0.9) AS e2e_p90_s,
           quantile_cont(e2e_s, 0.99) AS e2e_p99_s
    FROM q GROUP BY GROUPING SETS ((run_id, workload), (run_id))
)
SELECT a.run_id, coalesce(r.method, r.labels['method'], r.mode) AS method, coalesce(r.clock, 'wall') AS clock,
       a.workload, a.requests, a.ttft_p50_s, a.ttft_p90_s, a.ttft_p99_s, a.itl_p50_s, a.itl_p90_s, a.itl_p99_s,
       a.e2e_p50_s, a.e2e_p90_s, a.e2e_p99_s
FROM agg AS a LEFT JOIN runs AS r ON r.run_id = a.run_id
ORDER BY a.run_id, a.workload = '*' DESC, a.workload;
