-- Dashboard Ceiling: the estimator checked against a truth (companion cap-accept run, own steps or emulator), from `dspark-obs estimate`.
--
-- Rows of the ceiling_validation table for the selected runs: bias, MAE and
-- interval coverage of the censored steps overall and by sampling,
-- category, workload and 8 equal-count bins of mid (group_kind 'bin',
-- bin 0 = lowest); all_steps covers every step.  Values in drafts.  MAE and
-- coverage are over the coverage_n greedy steps; sampled steps are judged by
-- bias, the bins and emu_* (E[full | window accepted]).
--
-- Parameters:
--   $runs   only these run ids (list); default NULL (every run)
-- Output columns:
--   run_id, method, truth_source, companion_run, group_kind, group, bin, n,
--   mean_lo, mean_mid, mean_hi, mean_truth, bias, coverage_n, mae, coverage, emu_n,
--   mean_emu_expected, emu_bias, emu_mae, emu_coverage
SELECT run_id, method, truth_source, companion_run, group_kind, "group", bin, n,
       mean_lo, mean_mid, mean_hi, mean_truth, bias, coverage_n, mae, coverage, emu_n,
       mean_emu_expected, emu_bias, emu_mae, emu_coverage
FROM ceiling_validation
WHERE $runs IS NULL OR list_contains($runs, run_id)
ORDER BY run_id, method, group_kind, bin NULLS FIRST, "group";
