-- Sweep points: one row per run of a sweep (method, workload, concurrency): throughput, per-user speed and latency.
--
-- A sweep is the runs sharing runs.sweep_id (dspark-obs sweep).  From each
-- run's finished requests, on the run's clock (runs.clock): per_user_tok_s is
-- the mean over requests of completion_tokens / e2e_latency_s;
-- throughput_tok_s is completion tokens over the busy time by Little's law,
-- sum(e2e_latency_s) / concurrency; mean_accept_length is
-- sum(completion_tokens) / sum(spec_verify_ct) (null without speculation);
-- mean_batch is the mean decode batch size of the run's steps (null without
-- DSpark records).  workload is the run's workload (a sweep runs one per point).
--
-- Parameters:
--   $sweeps   only these sweep ids (list); default NULL (every sweep)
-- Output columns:
--   sweep_id, run_id, method, workload, concurrency, clock, requests, completion_tokens,
--   per_user_tok_s, throughput_tok_s, mean_accept_length, mean_batch, e2e_p50_s,
--   e2e_p99_s, started_at
WITH q AS (
    SELECT r.sweep_id, q.run_id, coalesce(r.method, r.labels['method'], r.mode) AS method,
           coalesce(r.concurrency, q.concurrency) AS concurrency, coalesce(r.clock, 'wall') AS clock,
           r.started_at, coalesce(q.workload, 'unknown') AS workload, q.completion_tokens, q.e2e_latency_s,
           q.spec_verify_ct
    FROM requests AS q JOIN runs AS r ON r.run_id = q.run_id
    WHERE r.sweep_id IS NOT NULL AND ($sweeps IS NULL OR list_contains($sweeps, r.sweep_id))
      AND q.completion_tokens > 0 AND q.e2e_latency_s > 0
),
steps_bs AS (SELECT run_id, avg(bs) AS mean_batch FROM steps WHERE bs > 0 GROUP BY run_id)
SELECT q.sweep_id, q.run_id, any_value(q.method) AS method, string_agg(DISTINCT q.workload, ',') AS workload,
       any_value(q.concurrency) AS concurrency, any_value(q.clock) AS clock, count(*) AS requests,
       CAST(sum(q.completion_tokens) AS BIGINT) AS completion_tokens,
       avg(q.completion_tokens / q.e2e_latency_s) AS per_user_tok_s,
       sum(q.completion_tokens) / (sum(q.e2e_latency_s) / any_value(q.concurrency)) AS throughput_tok_s,
       sum(q.completion_tokens) / nullif(sum(q.spec_verify_ct), 0) AS mean_accept_length,
       any_value(s.mean_batch) AS mean_batch,
       quantile_cont(q.e2e_latency_s, 0.5) AS e2e_p50_s, quantile_cont(q.e2e_latency_s, 0.99) AS e2e_p99_s,
       any_value(q.started_at) AS started_at
FROM q LEFT JOIN steps_bs AS s ON s.run_id = q.run_id
GROUP BY q.sweep_id, q.run_id
ORDER BY q.sweep_id, method, workload, concurrency;
