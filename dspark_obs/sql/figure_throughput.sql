-- Figure 1/3 data: total throughput vs per-user tok/s, one point per run and driver concurrency.
--
-- From finished requests.  per_user_tok_s is the mean over requests of
-- completion_tokens / e2e_latency_s.  throughput_tok_s is total completion
-- tokens over the busy time estimated by Little's law,
-- sum(e2e_latency_s) / concurrency, which works on the emulator's virtual
-- clock as well as on a real server; wall_throughput_tok_s divides by the
-- wall span max(finished_at) - min(submitted_at) instead (meaningful only for
-- a real server or --real-time 1).  Without a recorded concurrency,
-- throughput_tok_s falls back to the wall figure.  mean_accept_length is
-- sum(completion_tokens) / sum(spec_verify_ct) (tokens per verify step,
-- prefill token included as SGLang counts it).
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
-- Output columns:
--   run_id, mode, concurrency, requests, completion_tokens, per_user_tok_s,
--   throughput_tok_s, wall_throughput_tok_s, mean_accept_length, mean_e2e_latency_s
WITH q AS (
    SELECT run_id, concurrency, completion_tokens, e2e_latency_s, spec_verify_ct,
           submitted_at, finished_at
    FROM requests
    WHERE ($run_id IS NULL OR run_id = $run_id)
      AND completion_tokens > 0 AND e2e_latency_s > 0
),
agg AS (
    SELECT
        run_id,
        concurrency,
        count(*) AS requests,
        sum(completion_tokens) AS completion_tokens,
        avg(completion_tokens / e2e_latency_s) AS per_user_tok_s,
        sum(completion_tokens) / (sum(e2e_latency_s) / concurrency) AS little_tok_s,
        sum(completion_tokens)
            / nullif(epoch(max(finished_at) - min(submitted_at)), 0) AS wall_throughput_tok_s,
        sum(completion_tokens) / nullif(sum(spec_verify_ct), 0) AS mean_accept_length,
        avg(e2e_latency_s) AS mean_e2e_latency_s
    FROM q
    GROUP BY run_id, concurrency
)
SELECT
    a.run_id,
    r.mode,
    a.concurrency,
    a.requests,
    CAST(a.completion_tokens AS BIGINT) AS completion_tokens,
    a.per_user_tok_s,
    coalesce(a.little_tok_s, a.wall_throughput_tok_s) AS throughput_tok_s,
    a.wall_throughput_tok_s,
    a.mean_accept_length,
    a.mean_e2e_latency_s
FROM agg AS a
LEFT JOIN runs AS r ON r.run_id = a.run_id
ORDER BY r.mode NULLS LAST, a.run_id, a.concurrency NULLS LAST;
