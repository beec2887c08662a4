-- Acceptance by draft position k: how often position k was verified and accepted, against the confidence head.
--
-- Position k (1..gamma, gamma = number of draft_tokens) is verified in a
-- request-step when window >= k (window = verify_len - 1) and accepted when
-- correct_drafts >= k.  All shares and means are over the verified
-- request-steps of the group.  accepted_share is comparable with
-- mean_survival (S_k); cond_accepted_share (accepted among verified steps
-- whose drafts 1..k-1 were all accepted) is comparable with the conditional
-- confidence c_k.  Positions never verified appear with verified_steps = 0.
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
-- Output columns:
--   run_id, workload, k, verified_steps, accepted_share, cond_accepted_share,
--   mean_confidence, mean_survival
WITH pos AS (
    SELECT run_id, workload, "window", correct_drafts, confidence, survival,
           unnest(generate_series(1, len(draft_tokens))) AS k
    FROM step_reqs_w
    WHERE $run_id IS NULL OR run_id = $run_id
)
SELECT
    run_id,
    workload,
    k,
    count(*) FILTER (WHERE "window" >= k) AS verified_steps,
    avg(CASE WHEN correct_drafts >= k THEN 1.0 ELSE 0.0 END) FILTER (WHERE "window" >= k) AS accepted_share,
    avg(CASE WHEN correct_drafts >= k THEN 1.0 ELSE 0.0 END)
        FILTER (WHERE "window" >= k AND correct_drafts >= k - 1) AS cond_accepted_share,
    avg(confidence[k]) FILTER (WHERE "window" >= k) AS mean_confidence,
    avg(survival[k]) FILTER (WHERE "window" >= k) AS mean_survival
FROM pos
GROUP BY run_id, workload, k
ORDER BY run_id, workload NULLS LAST, k;
