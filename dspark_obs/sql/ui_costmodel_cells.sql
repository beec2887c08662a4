-- Dashboard Cost model: decode steps binned by batch size and target tokens M, with the median measured and the server's predicted step time.
--
-- M is what the target verified: num_verify_tokens (compact graph tier,
-- static full block), bs * (gamma + 1) in cap-accept (its
-- num_verify_tokens is the committed window).  measured_ms is the median of
-- the chosen timer over the cell's steps; server_ms the mean of the
-- server's own predicted_step_ms (null when it logged none).  Steps without
-- bs or the timer are left out.
--
-- Parameters:
--   $runs       only these run ids (list); default NULL (every run)
--   $dp_ranks   only these DP ranks (list); default NULL
--   $timer      step_gpu_ms | step_cpu_ms | target_verify_gpu_ms; default 'step_gpu_ms'
-- Output columns:
--   run_id, mode, bs, m, steps, measured_ms, measured_p10_ms, measured_p90_ms, server_ms
WITH st AS (
    SELECT s.run_id, r.mode, s.bs,
           CASE WHEN r.mode = 'cap-accept' THEN s.bs * (coalesce(r.gamma, 6) + 1)
                ELSE s.num_verify_tokens END AS m,
           CASE $timer WHEN 'step_cpu_ms' THEN s.step_cpu_ms
                       WHEN 'target_verify_gpu_ms' THEN s.target_verify_gpu_ms
                       ELSE s.step_gpu_ms END AS measured_ms,
           s.predicted_step_ms
    FROM steps AS s
    LEFT JOIN runs AS r ON r.run_id = s.run_id
    WHERE s.bs > 0
      AND ($runs IS NULL OR list_contains($runs, s.run_id))
      AND ($dp_ranks IS NULL OR list_contains($dp_ranks, s.dp_rank))
)
SELECT run_id, any_value(mode) AS mode, bs, m, count(*) AS steps,
       median(measured_ms) AS measured_ms,
       quantile_cont(measured_ms, 0.1) AS measured_p10_ms,
       quantile_cont(measured_ms, 0.9) AS measured_p90_ms,
       avg(predicted_step_ms) AS server_ms
FROM st
WHERE measured_ms IS NOT NULL AND m > 0
GROUP BY run_id, bs, m
ORDER BY run_id, bs, m;
