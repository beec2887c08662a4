-- Report: the block-accept estimator checked against a truth, per run (from `dspark-obs estimate`).
--
-- Rows of ceiling_validation, one estimator method per run ('default' when
-- present): bias, MAE and [lo, hi] coverage of censored steps overall, by
-- sampling, category, workload and 8 equal-count bins of mid (bin 0 = lowest);
-- all_steps covers every step.  truth_source: companion | cap-accept | static |
-- emulator.  Values in drafts.  MAE and coverage are over the coverage_n
-- greedy steps (a sampled step's realisation is one draw: judge it by bias,
-- the bins and emu_*, the expectation given what the window showed).
--
-- Parameters:
--   $runs   these run ids (list); default NULL (every run)
-- Output columns:
--   run_id, method, truth_source, companion_run, group_kind, group, bin, n,
--   mean_lo, mean_mid, mean_hi, mean_truth, bias, coverage_n, mae, coverage, emu_n,
--   mean_emu_expected, emu_bias, emu_mae, emu_coverage
SELECT run_id, method, truth_source, companion_run, group_kind, "group", bin, n, mean_lo, mean_mid, mean_hi,
       mean_truth, bias, coverage_n, mae, coverage, emu_n, mean_emu_expected, emu_bias, emu_mae, emu_coverage
FROM ceiling_validation
WHERE $runs IS NULL OR list_contains($runs, run_id)
QUALIFY dense_rank() OVER (PARTITION BY run_id ORDER BY method <> 'default', method) = 1
ORDER BY run_id, group_kind, bin NULLS FIRST, "group";
