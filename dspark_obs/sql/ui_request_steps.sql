-- Dashboard Request explorer: one request's decode steps in order, with its window, acceptance, estimated ceiling and confidences.
--
-- step is the request's decode step (1-based, by DP rank, segment and
-- forward_ct).  ceiling_lo/mid/hi and category come from the ceiling table
-- of `dspark-obs estimate` (null without it); truth_block is what a
-- full-block verify accepted when it is known: the run's own cap-accept or
-- static step, else the paired step (same rid and prefix_len) of the
-- run's cap-accept companion (both the mode_block_accept macro).  Values in drafts; confidence and survival
-- are per position (lists of gamma).
--
-- Parameters:
--   $run_id   the run; default NULL (no rows)
--   $rid      the request id; default NULL (no rows)
-- Output columns:
--   step, dp_rank, forward_ct, prefix_len, verify_len, window, correct_drafts,
--   cap_trim, acc_len, ceiling_lo, ceiling_mid, ceiling_hi, category,
--   truth_block, confidence, survival
WITH me AS (
    SELECT s.*, r.mode
    FROM step_reqs AS s
    LEFT JOIN runs AS r ON r.run_id = s.run_id
    WHERE s.run_id = $run_id AND s.rid = $rid
),
comp AS (
    SELECT c.prefix_len, any_value(mode_block_accept(cr.mode, c.correct_drafts, c.cap_trim)) AS block
    FROM step_reqs AS c
    JOIN runs AS cr ON cr.run_id = c.run_id AND cr.companion_of = $run_id AND cr.mode = 'cap-accept'
    WHERE c.rid = $rid
    GROUP BY c.prefix_len
),
meth AS (
    SELECT CASE WHEN bool_or(method = 'default') THEN 'default' ELSE min(method) END AS method
    FROM ceiling WHERE run_id = $run_id AND rid = $rid
),
ce AS (
    SELECT c.dp_rank, c.segment, c.forward_ct, c.lo, c.mid, c.hi, c.category
    FROM ceiling AS c, meth
    WHERE c.run_id = $run_id AND c.rid = $rid AND c.method = meth.method
)
SELECT
    row_number() OVER (ORDER BY me.segment, me.forward_ct, me.dp_rank) AS step,
    me.dp_rank, me.forward_ct, me.prefix_len, me.verify_len, me.verify_len - 1 AS "window",
    me.correct_drafts, me.cap_trim, me.acc_len,
    ce.lo AS ceiling_lo, ce.mid AS ceiling_mid, ce.hi AS ceiling_hi, ce.category,
    coalesce(mode_block_accept(me.mode, me.correct_drafts, me.cap_trim), comp.block) AS truth_block,
    me.confidence, me.survival
FROM me
LEFT JOIN ce ON ce.dp_rank = me.dp_rank AND ce.segment = me.segment AND ce.forward_ct = me.forward_ct
LEFT JOIN comp ON comp.prefix_len = me.prefix_len
ORDER BY step;
