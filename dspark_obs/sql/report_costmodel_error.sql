-- Report: step-time error of the fitted additive table and of the server's own prediction, per run.
--
-- Rows of costmodel_error (from `dspark-obs costmodel`): mape as a fraction
-- (0.02 = 2%), bias_ms = mean of predicted - measured.  bs_bucket '*' is every
-- step; bs_lo is the bucket's lowest batch size (null for '*').
--
-- Parameters:
--   $runs   these run ids (list); default NULL (every run)
-- Output columns:
--   run_id, timer, model, bs_bucket, bs_lo, n, mape, bias_ms
SELECT run_id, timer, model, bs_bucket, TRY_CAST(regexp_extract(bs_bucket, '^[0-9]+') AS INTEGER) AS bs_lo,
       n, mape, bias_ms
FROM costmodel_error
WHERE $runs IS NULL OR list_contains($runs, run_id)
ORDER BY run_id, model, bs_lo NULLS FIRST;
