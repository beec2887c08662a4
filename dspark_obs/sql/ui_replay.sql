-- Dashboard Windows: schedule replay results (from `dspark-obs replay`): conformance of the logged windows and what-if scenarios.
--
-- One row per run and scenario of replay_whatif, with the run's
-- replay_conformance share alongside: matching_share is the share of steps
-- whose replayed verify_len all equal the logged ones.
--
-- Parameters:
--   $runs   only these run ids (list); default NULL (every run)
-- Output columns:
--   run_id, scenario, steps, accepted_tokens_mean, acc_len_mean, step_ms_mean,
--   tokens_per_s, tokens_per_s_lo, tokens_per_s_hi, acceptance_source,
--   estimated_share, time_model, matching_share, conformance_table
WITH conf AS (
    SELECT run_id, sum(matching_steps) / nullif(sum(steps), 0) AS matching_share, any_value("table") AS tbl
    FROM replay_conformance
    GROUP BY run_id
)
SELECT w.run_id, w.scenario, w.steps, w.accepted_tokens_mean, w.acc_len_mean, w.step_ms_mean,
       w.tokens_per_s, w.tokens_per_s_lo, w.tokens_per_s_hi, w.acceptance_source, w.estimated_share, w.time_model,
       c.matching_share, c.tbl AS conformance_table
FROM replay_whatif AS w
LEFT JOIN conf AS c ON c.run_id = w.run_id
WHERE $runs IS NULL OR list_contains($runs, w.run_id)
ORDER BY w.run_id, CASE w.scenario WHEN 'logged' THEN 0 WHEN 'replay' THEN 1 ELSE 2 END, w.scenario;
