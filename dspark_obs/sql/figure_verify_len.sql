-- Figure 4 data: per-step verify-length distribution per workload, with utilisation per length.
--
-- One row per (run, workload, verify_len) for verify_len 1..gamma+1 (zero
-- rows included): request_steps with that verify_len, their share within the
-- workload, and utilisation = sum(acc_len) / sum(block_accept + 1) over those
-- whose full-block acceptance is known exactly (the known_block_accept macro:
-- cap-accept, static, emulator truth, or a window that rejected a draft or
-- covered the whole block; null when none is known).
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
-- Output columns:
--   run_id, workload, verify_len, request_steps, share, utilisation, known_steps
WITH s AS (
    SELECT run_id, workload, verify_len, acc_len, gamma, block_accept FROM known_blocks($run_id)
),
groups AS (
    SELECT run_id, workload, max(gamma) AS gamma FROM s GROUP BY run_id, workload
),
bins AS (
    SELECT run_id, workload, unnest(generate_series(1, gamma + 1)) AS verify_len FROM groups
),
counts AS (
    SELECT
        run_id, workload, verify_len,
        count(*) AS request_steps,
        sum(acc_len) FILTER (WHERE block_accept IS NOT NULL)
            / nullif(sum(block_accept + 1), 0) AS utilisation,
        count(block_accept) AS known_steps
    FROM s
    GROUP BY run_id, workload, verify_len
)
SELECT
    b.run_id,
    b.workload,
    b.verify_len,
    coalesce(c.request_steps, 0) AS request_steps,
    coalesce(c.request_steps, 0)
        / nullif(sum(coalesce(c.request_steps, 0)) OVER (PARTITION BY b.run_id, b.workload), 0) AS share,
    c.utilisation,
    coalesce(c.known_steps, 0) AS known_steps
FROM bins AS b
LEFT JOIN counts AS c
    ON c.run_id = b.run_id AND c.workload IS NOT DISTINCT FROM b.workload AND c.verify_len = b.verify_len
ORDER BY b.run_id, b.workload NULLS LAST, b.verify_len;
