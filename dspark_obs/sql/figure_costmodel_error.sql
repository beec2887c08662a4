-- Figure 6 data: cost-model error per run, model and batch-size bucket (from `dspark-obs costmodel`).
--
-- Reads the costmodel_error result table: mape is a fraction (0.02 = 2%),
-- bias_ms the mean of predicted - measured.  Models: fitted (the exported
-- SGLang additive table), fitted+context (plus c * sum(prefix_len)), server
-- (the step's own predicted_step_ms).  bs_bucket '*' is every step.
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
-- Output columns:
--   run_id, timer, model, bs_bucket, n, mape, bias_ms
SELECT run_id, timer, model, bs_bucket, n, mape, bias_ms
FROM costmodel_error
WHERE $run_id IS NULL OR run_id = $run_id
ORDER BY run_id, model, bs_bucket = '*' DESC,
         TRY_CAST(regexp_extract(bs_bucket, '^[0-9]+') AS INTEGER) NULLS FIRST;
