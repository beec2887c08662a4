-- Verify windows per workload: mean window, full-window share, share of windows <= 3, mean accepted length.
--
-- window = verify_len - 1; a full window is window = gamma, with gamma from
-- runs (else the number of draft_tokens).  mean_acc_len is the mean committed
-- tokens per request-step (correct_drafts + 1).  steps counts request-steps.
-- Compare with the write-up: mean window gsm8k 5.24, arena-hard 3.78,
-- poetry 2.91 at gamma 6.
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
-- Output columns:
--   run_id, workload, steps, mean_window, full_window_share, share_le3, mean_acc_len
SELECT
    s.run_id,
    s.workload,
    count(*) AS steps,
    avg(s."window") AS mean_window,
    avg(CASE WHEN s."window" = coalesce(r.gamma, len(s.draft_tokens)) THEN 1.0 ELSE 0.0 END) AS full_window_share,
    avg(CASE WHEN s."window" <= 3 THEN 1.0 ELSE 0.0 END) AS share_le3,
    avg(s.acc_len) AS mean_acc_len
FROM step_reqs_w AS s
LEFT JOIN runs AS r ON r.run_id = s.run_id
WHERE $run_id IS NULL OR s.run_id = $run_id
GROUP BY s.run_id, s.workload
ORDER BY s.run_id, s.workload NULLS LAST;
