-- Dashboard Compare: the finished requests of the compared runs, one row each, with the run's clock.
--
-- The Compare page resamples these per run (bootstrap) for the headline
-- figures' intervals (dspark_obs.compare).  concurrency is the request's
-- driver concurrency, else the run's.
--
-- Parameters:
--   $runs        these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list); default NULL
-- Output columns:
--   run_id, clock, rid, workload, completion_tokens, spec_verify_ct, e2e_latency_s, ttft_s, concurrency
SELECT q.run_id, coalesce(r.clock, 'wall') AS clock, q.rid, coalesce(q.workload, 'unknown') AS workload,
       q.completion_tokens, q.spec_verify_ct, q.e2e_latency_s, q.ttft_s,
       coalesce(q.concurrency, r.concurrency) AS concurrency
FROM requests AS q LEFT JOIN runs AS r ON r.run_id = q.run_id
WHERE q.completion_tokens > 0 AND q.e2e_latency_s > 0
  AND ($runs IS NULL OR list_contains($runs, q.run_id))
  AND ($workloads IS NULL OR list_contains($workloads, coalesce(q.workload, 'unknown')))
ORDER BY q.run_id, q.rid;
