-- Verify-window distribution: request-steps per window size (0..gamma) and their share within the workload.
--
-- window = verify_len - 1 = drafts checked by the target.  gamma is the
-- run's gamma from runs, else the number of draft_tokens.  Every window
-- 0..gamma is listed for every (run, workload), with steps = 0 where unused.
-- steps counts request-steps (step_reqs rows).
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
-- Output columns:
--   run_id, workload, window, steps, share
WITH sr AS (
    SELECT run_id, workload, "window", len(draft_tokens) AS block
    FROM step_reqs_w
    WHERE $run_id IS NULL OR run_id = $run_id
),
gam AS (
    SELECT sr.run_id, coalesce(any_value(r.gamma), max(sr.block)) AS gamma
    FROM sr LEFT JOIN runs AS r ON r.run_id = sr.run_id
    GROUP BY sr.run_id
),
counts AS (
    SELECT run_id, workload, "window", count(*) AS steps
    FROM sr GROUP BY run_id, workload, "window"
),
bins AS (
    SELECT g.run_id, g.workload, unnest(generate_series(0, gam.gamma)) AS "window"
    FROM (SELECT DISTINCT run_id, workload FROM sr) AS g JOIN gam ON gam.run_id = g.run_id
),
keys AS (
    SELECT run_id, workload, "window" FROM bins
    UNION
    SELECT run_id, workload, "window" FROM counts
)
SELECT
    k.run_id,
    k.workload,
    k."window",
    coalesce(c.steps, 0) AS steps,
    coalesce(c.steps, 0) / sum(coalesce(c.steps, 0)) OVER (PARTITION BY k.run_id, k.workload) AS share
FROM keys AS k
LEFT JOIN counts AS c
    ON c.run_id = k.run_id AND c.workload IS NOT DISTINCT FROM k.workload AND c."window" = k."window"
ORDER BY k.run_id, k.workload NULLS LAST, k."window";
