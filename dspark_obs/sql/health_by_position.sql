-- Trimming health by draft position: survival-predicted against observed acceptance within the verified window.
--
-- For each run and draft position k, over the request-steps that verified
-- position k (window = verify_len - 1 >= k) and carry survival: n of them,
-- expected = mean S_k (the head's probability that drafts 1..k all survive)
-- and actual = share with correct_drafts >= k; expected_accepted and
-- actual_accepted are their sums (accepted drafts at k expected vs seen).
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $dp_ranks    only these DP ranks (list); default NULL
-- Output columns:
--   run_id, position, n, expected, actual, expected_accepted, actual_accepted
WITH pos AS (
    SELECT run_id, k AS position, survival[k] AS s_k, CAST(correct_drafts >= k AS INTEGER) AS ok
    FROM (SELECT run_id, survival, correct_drafts, unnest(range(1, verify_len)) AS k
          FROM step_reqs
          WHERE survival IS NOT NULL AND verify_len > 1
            AND ($runs IS NULL OR list_contains($runs, run_id))
            AND ($dp_ranks IS NULL OR list_contains($dp_ranks, dp_rank)))
)
SELECT run_id, position, count(*) AS n, avg(s_k) AS expected, avg(ok) AS actual,
       sum(s_k) AS expected_accepted, sum(ok) AS actual_accepted
FROM pos
WHERE s_k IS NOT NULL
GROUP BY run_id, position
ORDER BY run_id, position;
