-- Step time by batch shape: measured and predicted step time per batch-size and verify-token bucket.
--
-- A bucket is named by its lower bound: bs_bucket covers
-- [bs_bucket, bs_bucket + $bs_width), num_verify_tokens_bucket covers
-- [b, b + $tokens_width).  Steps where bs or num_verify_tokens was absent
-- (-1) fall in a NULL bucket.  Medians and means skip nulls.
--
-- Parameters:
--   $run_id         only this run; default NULL (every run)
--   $bs_width       batch-size bucket width; default 8
--   $tokens_width   num_verify_tokens bucket width; default 32
-- Output columns:
--   run_id, bs_bucket, num_verify_tokens_bucket, n, median_step_gpu_ms,
--   mean_step_gpu_ms, median_step_cpu_ms, mean_step_cpu_ms, mean_predicted_step_ms
SELECT
    run_id,
    CASE WHEN bs >= 0 THEN (bs // $bs_width) * $bs_width END AS bs_bucket,
    CASE WHEN num_verify_tokens >= 0
         THEN (num_verify_tokens // $tokens_width) * $tokens_width END AS num_verify_tokens_bucket,
    count(*) AS n,
    median(step_gpu_ms) AS median_step_gpu_ms,
    avg(step_gpu_ms) AS mean_step_gpu_ms,
    median(step_cpu_ms) AS median_step_cpu_ms,
    avg(step_cpu_ms) AS mean_step_cpu_ms,
    avg(predicted_step_ms) AS mean_predicted_step_ms
FROM steps
WHERE $run_id IS NULL OR run_id = $run_id
GROUP BY ALL
ORDER BY run_id, bs_bucket NULLS LAST, num_verify_tokens_bucket NULLS LAST;
