-- Dashboard Request explorer: the requests of the selected runs, with their length and acceptance.
--
-- One row per (run, request) in submission order, at most $max_rows.
-- rid_like filters request ids with a case-insensitive substring (NULL: all).
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list); default NULL
--   $t0          requests submitted at or after this time; default NULL
--   $t1          requests submitted at or before this time; default NULL
--   $rid_like    substring of the request id; default NULL
--   $max_rows    at most this many rows; default 5000
-- Output columns:
--   run_id, rid, workload, temperature, prompt_tokens, completion_tokens,
--   spec_verify_ct, spec_accept_length, finish_reason, e2e_latency_s, submitted_at
SELECT run_id, rid, coalesce(workload, 'unknown') AS workload, temperature, prompt_tokens,
       completion_tokens, spec_verify_ct, spec_accept_length, finish_reason, e2e_latency_s, submitted_at
FROM requests
WHERE ($runs IS NULL OR list_contains($runs, run_id))
  AND ($workloads IS NULL OR list_contains($workloads, coalesce(workload, 'unknown')))
  AND ($t0 IS NULL OR submitted_at >= $t0) AND ($t1 IS NULL OR submitted_at <= $t1)
  AND ($rid_like IS NULL OR contains(lower(rid), lower($rid_like)))
ORDER BY run_id, submitted_at NULLS LAST, rid
LIMIT $max_rows;
