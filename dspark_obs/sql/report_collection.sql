-- Report: what collection lost per run: gaps by reason and dead letters by source and reason.
--
-- kind 'gap': count of gaps and the forward_cts they may have swallowed
-- (last - first + 1; an upper bound on lost decode records; a restart's gap
-- of unknown end counts 0).  kind 'dead_letter': payloads rejected by the
-- collector, reason prefixed with the source.
--
-- Parameters:
--   $runs   these run ids (list); default NULL (every run)
-- Output columns:
--   run_id, kind, reason, count, missing_forward_cts
SELECT run_id, 'gap' AS kind, reason, count(*) AS count,
       CAST(sum(CASE WHEN last_missing_forward_ct >= first_missing_forward_ct
                     THEN last_missing_forward_ct - first_missing_forward_ct + 1 ELSE 0 END) AS BIGINT)
           AS missing_forward_cts
FROM gaps
WHERE $runs IS NULL OR list_contains($runs, run_id)
GROUP BY run_id, reason
UNION ALL
SELECT run_id, 'dead_letter' AS kind, source || ': ' || reason AS reason, count(*) AS count,
       CAST(NULL AS BIGINT) AS missing_forward_cts
FROM dead_letters
WHERE $runs IS NULL OR list_contains($runs, run_id)
GROUP BY run_id, source, reason
ORDER BY run_id, kind, reason;
