-- Dashboard filter options: every run, workload and DP rank in the store, and the span of request times.
--
-- One row (none on an empty store).  runs lists run ids with any runs,
-- steps, step_reqs or requests row; workloads the distinct request
-- workloads ('unknown' for requests without one); dp_ranks the ranks that
-- logged steps; t_min / t_max bound requests.submitted_at.
--
-- Parameters:
--   none
-- Output columns:
--   runs, workloads, dp_ranks, t_min, t_max
WITH ids AS (
    SELECT run_id FROM runs
    UNION SELECT run_id FROM steps
    UNION SELECT run_id FROM step_reqs
    UNION SELECT run_id FROM requests
)
SELECT
    (SELECT list(run_id ORDER BY run_id) FROM ids) AS runs,
    (SELECT list(DISTINCT coalesce(workload, 'unknown') ORDER BY coalesce(workload, 'unknown')) FROM requests) AS workloads,
    (SELECT list(DISTINCT dp_rank ORDER BY dp_rank) FROM steps) AS dp_ranks,
    (SELECT min(submitted_at) FROM requests) AS t_min,
    (SELECT max(submitted_at) FROM requests) AS t_max
WHERE EXISTS (SELECT 1 FROM ids);
