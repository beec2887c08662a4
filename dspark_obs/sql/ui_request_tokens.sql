-- Dashboard Request explorer: one request's committed tokens with target logprobs and the decode step that committed each.
--
-- pos 0 is the prefill token.  A decode step whose anchor sits at output
-- position a = prefix_len - prompt_tokens commits positions a+1 .. a+acc_len:
-- the first correct_drafts are accepted drafts ('draft'), the last is the
-- target's bonus token ('bonus').  step matches ui_request_steps; null
-- where no logged step covers the position (prefill, lost records).
--
-- Parameters:
--   $run_id   the run; default NULL (no rows)
--   $rid      the request id; default NULL (no rows)
-- Output columns:
--   pos, token_id, logprob, step, source, top_ids, top_logprobs
WITH req AS (
    SELECT any_value(prompt_tokens) AS prompt_tokens FROM requests WHERE run_id = $run_id AND rid = $rid
),
st AS (
    SELECT row_number() OVER (ORDER BY s.segment, s.forward_ct, s.dp_rank) AS step,
           s.prefix_len - req.prompt_tokens AS anchor, s.acc_len, s.correct_drafts
    FROM step_reqs AS s, req
    WHERE s.run_id = $run_id AND s.rid = $rid
)
SELECT
    t.pos, t.token_id, t.logprob,
    st.step,
    CASE WHEN t.pos = 0 THEN 'prefill'
         WHEN st.step IS NULL THEN NULL
         WHEN t.pos - st.anchor <= st.correct_drafts THEN 'draft'
         ELSE 'bonus' END AS source,
    t.top_ids, t.top_logprobs
FROM tokens AS t
LEFT JOIN st ON t.pos BETWEEN st.anchor + 1 AND st.anchor + st.acc_len
WHERE t.run_id = $run_id AND t.rid = $rid
ORDER BY t.pos;
