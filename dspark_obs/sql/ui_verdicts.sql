-- Dashboard Overview: the latest report's verdict of every figure (pass / warn / fail / info / insufficient) with its limit.
--
-- From the reports table (`dspark-obs report` appends one row per judged
-- figure); only the newest report (by generated_at) is shown.  worst_value is
-- the figure's value furthest on the failing side of its limit over its rows
-- (positions, label kinds): the maximum for a 'max' limit, the minimum for a
-- 'min' one, else the mean.  verdict is the worst over those rows.
--
-- Parameters:
--   $runs   only these run ids (list); default NULL (every run)
-- Output columns:
--   report_id, generated_at, report_status, run_id, section, metric, workload,
--   rows, verdict, worst_value, limit_kind, limit_value
WITH latest AS (SELECT report_id FROM reports ORDER BY generated_at DESC, report_id DESC LIMIT 1),
r AS (
    SELECT x.*, CASE x.verdict WHEN 'fail' THEN 0 WHEN 'warn' THEN 1 WHEN 'insufficient' THEN 2
                               WHEN 'pass' THEN 3 ELSE 4 END AS rank
    FROM reports AS x JOIN latest USING (report_id)
    WHERE $runs IS NULL OR list_contains($runs, x.run_id)
)
SELECT * EXCLUDE (worst_rank) FROM (
SELECT report_id, any_value(generated_at) AS generated_at, any_value(report_status) AS report_status, run_id,
       section, metric, coalesce(workload, '*') AS workload, count(*) AS rows,
       arg_min(verdict, rank) AS verdict,
       CASE any_value(limit_kind) WHEN 'max' THEN max(value) WHEN 'min' THEN min(value) ELSE avg(value) END
           AS worst_value,
       any_value(limit_kind) AS limit_kind, any_value(limit_value) AS limit_value, min(rank) AS worst_rank
FROM r
GROUP BY report_id, run_id, section, metric, coalesce(workload, '*')
)
ORDER BY worst_rank, section, metric, run_id, workload = '*' DESC, workload;
