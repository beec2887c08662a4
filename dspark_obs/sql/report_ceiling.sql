-- Report: accept length, full-block ceiling and utilisation per run and workload, with request-bootstrap CIs.
--
-- Rows of ceiling_summary (from `dspark-obs estimate`), one estimator method
-- per run ('default' when present).  Lengths are tokens per request-step
-- (drafts + 1); ceiling_len_lo / _hi are the means of the estimate's bounds;
-- the *_ci95_* columns are 95% request-bootstrap intervals.
--
-- Parameters:
--   $runs   these run ids (list); default NULL (every run)
-- Output columns:
--   run_id, mode, workload, method, requests, steps, censored_share, mean_window,
--   mean_acc_len, mean_acc_len_ci95_low, mean_acc_len_ci95_high, ceiling_len_mid,
--   ceiling_len_mid_ci95_low, ceiling_len_mid_ci95_high, ceiling_len_lo, ceiling_len_hi,
--   utilisation, utilisation_ci95_low, utilisation_ci95_high
SELECT s.run_id, r.mode, s.workload, s.method, s.requests, s.steps, s.censored_share, s.mean_window,
       s.mean_acc_len, s.mean_acc_len_ci95_low, s.mean_acc_len_ci95_high,
       s.ceiling_len_mid, s.ceiling_len_mid_ci95_low, s.ceiling_len_mid_ci95_high,
       s.ceiling_len_lo, s.ceiling_len_hi,
       s.utilisation, s.utilisation_ci95_low, s.utilisation_ci95_high
FROM ceiling_summary AS s
LEFT JOIN runs AS r ON r.run_id = s.run_id
WHERE $runs IS NULL OR list_contains($runs, s.run_id)
QUALIFY dense_rank() OVER (PARTITION BY s.run_id ORDER BY s.method <> 'default', s.method) = 1
ORDER BY s.run_id, s.workload = '*' DESC, s.workload;
