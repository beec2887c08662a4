-- Dashboard Windows: verify budget and batch size over the run, averaged in buckets of forward_ct.
--
-- Decode steps of each run (DP ranks pooled) are cut into at most $buckets
-- equal forward_ct ranges; per bucket: mean batch size (bs), mean budget
-- (verify tokens above one per request, k*), mean num_verify_tokens and the
-- budget per request.  Steps with bs absent (-1) are left out.  The time
-- filter keeps the forward_ct span of the request-steps whose requests were
-- submitted in the range, per run and DP rank.
--
-- Parameters:
--   $runs       only these run ids (list); default NULL (every run)
--   $dp_ranks   only these DP ranks (list); default NULL
--   $t0         requests submitted at or after this time; default NULL
--   $t1         requests submitted at or before this time; default NULL
--   $buckets    number of forward_ct buckets per run; default 300
-- Output columns:
--   run_id, mode, forward_ct, steps, mean_bs, mean_budget, mean_num_verify_tokens,
--   budget_per_request
WITH span AS (
    SELECT s.run_id, s.dp_rank, min(s.forward_ct) AS lo, max(s.forward_ct) AS hi
    FROM step_reqs AS s
    JOIN requests AS q ON q.run_id = s.run_id AND q.rid = s.rid
    WHERE ($t0 IS NOT NULL OR $t1 IS NOT NULL)
      AND ($t0 IS NULL OR q.submitted_at >= $t0) AND ($t1 IS NULL OR q.submitted_at <= $t1)
    GROUP BY s.run_id, s.dp_rank
),
st AS (
    SELECT s.run_id, s.forward_ct, s.bs, s.budget, s.num_verify_tokens
    FROM steps AS s
    WHERE s.bs > 0
      AND ($runs IS NULL OR list_contains($runs, s.run_id))
      AND ($dp_ranks IS NULL OR list_contains($dp_ranks, s.dp_rank))
      AND (($t0 IS NULL AND $t1 IS NULL) OR EXISTS (
            SELECT 1 FROM span AS p
            WHERE p.run_id = s.run_id AND p.dp_rank = s.dp_rank AND s.forward_ct BETWEEN p.lo AND p.hi))
),
bounds AS (
    SELECT run_id, min(forward_ct) AS lo,
           greatest(1, ceil((max(forward_ct) - min(forward_ct) + 1) / $buckets)) AS width
    FROM st GROUP BY run_id
)
SELECT
    st.run_id,
    any_value(r.mode) AS mode,
    CAST(b.lo + floor((st.forward_ct - b.lo) / b.width) * b.width AS BIGINT) AS forward_ct,
    count(*) AS steps,
    avg(st.bs) AS mean_bs,
    avg(st.budget) AS mean_budget,
    avg(st.num_verify_tokens) FILTER (WHERE st.num_verify_tokens >= 0) AS mean_num_verify_tokens,
    avg(st.budget / st.bs) AS budget_per_request
FROM st
JOIN bounds AS b ON b.run_id = st.run_id
LEFT JOIN runs AS r ON r.run_id = st.run_id
GROUP BY st.run_id, 3
ORDER BY st.run_id, forward_ct;
