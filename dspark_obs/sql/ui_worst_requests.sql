-- Dashboard Request explorer: the requests of one run with what ranks the worst ones: tokens lost to trimming, utilisation, latency.
--
-- tokens_lost is the drafts a full-block verify would have accepted beyond the
-- window, summed over the request's steps: observed (sum of cap_trim) for a
-- cap-accept run, else the ceiling estimate's mid - correct_drafts
-- (`dspark-obs estimate`; null without it).  utilisation is committed tokens
-- over committed + lost.  Latencies are on the run's clock (clock); itl_s is
-- (e2e_latency_s - ttft_s) / (completion_tokens - 1).
--
-- Parameters:
--   $run_id      the run; default NULL
--   $workloads   only these workloads (list); default NULL
--   $t0          requests submitted at or after this time; default NULL
--   $t1          requests submitted at or before this time; default NULL
-- Output columns:
--   run_id, rid, workload, clock, completion_tokens, steps, tokens_lost, utilisation,
--   e2e_latency_s, ttft_s, itl_s
WITH rq AS (
    SELECT run_id, rid, coalesce(any_value(workload), 'unknown') AS workload,
           any_value(completion_tokens) AS completion_tokens, any_value(e2e_latency_s) AS e2e_latency_s,
           any_value(ttft_s) AS ttft_s
    FROM requests
    WHERE run_id = $run_id
      AND ($workloads IS NULL OR list_contains($workloads, coalesce(workload, 'unknown')))
      AND ($t0 IS NULL OR submitted_at >= $t0) AND ($t1 IS NULL OR submitted_at <= $t1)
    GROUP BY run_id, rid
),
est AS (
    SELECT c.rid, sum(greatest(c.mid - c.correct_drafts, 0)) AS lost
    FROM ceiling AS c JOIN ceiling_method() AS m ON m.run_id = c.run_id AND m.method = c.method
    WHERE c.run_id = $run_id GROUP BY c.rid
),
sr AS (
    SELECT rid, count(*) AS steps, sum(acc_len) AS committed, sum(cap_trim) AS cap_lost
    FROM step_reqs WHERE run_id = $run_id GROUP BY rid
),
joined AS (
    SELECT q.*, coalesce(r.clock, 'wall') AS clock, sr.steps, sr.committed,
           CASE WHEN r.mode = 'cap-accept' THEN sr.cap_lost ELSE est.lost END AS tokens_lost
    FROM rq AS q
    LEFT JOIN runs AS r ON r.run_id = q.run_id
    LEFT JOIN sr ON sr.rid = q.rid
    LEFT JOIN est ON est.rid = q.rid
)
SELECT run_id, rid, workload, clock, completion_tokens, CAST(steps AS BIGINT) AS steps,
       CAST(tokens_lost AS DOUBLE) AS tokens_lost,
       committed / nullif(committed + tokens_lost, 0) AS utilisation,
       e2e_latency_s, ttft_s,
       CASE WHEN ttft_s IS NOT NULL AND completion_tokens > 1
            THEN (e2e_latency_s - ttft_s) / (completion_tokens - 1) END AS itl_s
FROM joined
ORDER BY tokens_lost DESC NULLS LAST, rid;
