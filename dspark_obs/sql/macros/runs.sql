-- Table macros over the store's runs, created by dspark_obs.sql.connect.

-- One row per run that has a row in runs, steps, step_reqs, requests or gaps: seen_in lists those
-- tables (a query picks which make a run), then its counts: steps and request_steps (of the DP
-- ranks dp_ranks), requests (distinct rids submitted in [t0, t1]), gaps and missing_forward_cts
-- (of dp_ranks; an upper bound on lost decode records), dead_letters.  NULL arguments: no filter.
CREATE OR REPLACE MACRO run_counts(dp_ranks, t0, t1) AS TABLE
WITH ids AS (
    SELECT run_id, list(DISTINCT tbl ORDER BY tbl) AS seen_in
    FROM (SELECT run_id, 'runs' AS tbl FROM runs
          UNION SELECT run_id, 'steps' FROM steps
          UNION SELECT run_id, 'step_reqs' FROM step_reqs
          UNION SELECT run_id, 'requests' FROM requests
          UNION SELECT run_id, 'gaps' FROM gaps)
    GROUP BY run_id
),
st AS (
    SELECT run_id, count(*) AS n FROM steps
    WHERE dp_ranks IS NULL OR list_contains(dp_ranks, dp_rank)
    GROUP BY run_id
),
sr AS (
    SELECT run_id, count(*) AS n FROM step_reqs
    WHERE dp_ranks IS NULL OR list_contains(dp_ranks, dp_rank)
    GROUP BY run_id
),
rq AS (
    SELECT run_id, count(DISTINCT rid) AS n FROM requests
    WHERE (t0 IS NULL OR submitted_at >= t0) AND (t1 IS NULL OR submitted_at <= t1)
    GROUP BY run_id
),
gp AS (
    SELECT run_id, count(*) AS n, sum(last_missing_forward_ct - first_missing_forward_ct + 1) AS missing
    FROM gaps
    WHERE dp_ranks IS NULL OR list_contains(dp_ranks, dp_rank)
    GROUP BY run_id
),
dl AS (SELECT run_id, count(*) AS n FROM dead_letters GROUP BY run_id)
SELECT ids.run_id, ids.seen_in,
       coalesce(st.n, 0) AS steps, coalesce(sr.n, 0) AS request_steps, coalesce(rq.n, 0) AS requests,
       coalesce(gp.n, 0) AS gaps, CAST(coalesce(gp.missing, 0) AS BIGINT) AS missing_forward_cts,
       coalesce(dl.n, 0) AS dead_letters
FROM ids
LEFT JOIN st ON st.run_id = ids.run_id
LEFT JOIN sr ON sr.run_id = ids.run_id
LEFT JOIN rq ON rq.run_id = ids.run_id
LEFT JOIN gp ON gp.run_id = ids.run_id
LEFT JOIN dl ON dl.run_id = ids.run_id;
