-- Collection gaps: how many gaps and how many forward_cts may be lost, per run, DP rank and reason.
--
-- missing_forward_cts sums last - first + 1 over the gaps (prefill batches
-- advance forward_ct too, so it is an upper bound on lost decode records).
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
-- Output columns:
--   run_id, dp_rank, reason, gaps, missing_forward_cts
SELECT
    run_id,
    dp_rank,
    reason,
    count(*) AS gaps,
    CAST(sum(last_missing_forward_ct - first_missing_forward_ct + 1) AS BIGINT) AS missing_forward_cts
FROM gaps
WHERE $run_id IS NULL OR run_id = $run_id
GROUP BY run_id, dp_rank, reason
ORDER BY run_id, dp_rank, reason;
