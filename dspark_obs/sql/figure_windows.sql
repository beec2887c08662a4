-- Figure 4 data: verify window per workload, with utilisation against the full-block ceiling.
--
-- window = verify_len - 1 (drafts checked); full_window_share counts
-- window = gamma (runs.gamma, else the number of draft_tokens).
-- Utilisation is committed tokens over what a full-block verify would commit,
-- sum(acc_len) / sum(block_accept + 1), over the request-steps whose
-- full-block acceptance is known exactly (the known_block_accept macro,
-- sql/macros/acceptance.sql): cap-accept (correct_drafts + cap_trim), static
-- (correct_drafts), emulator truth (emu_block_accept), or a window that
-- rejected a draft or covered the whole block.  known_share says how many
-- request-steps that is; censored compact steps without truth are left out
-- (see the ceiling estimator for them).  The write-up reports mean
-- window gsm8k 5.24, arena-hard 3.78, poetry 2.91 and utilisation 0.88-0.97.
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
-- Output columns:
--   run_id, mode, workload, request_steps, mean_window, full_window_share,
--   share_le3, mean_acc_len, mean_block_accept_len, utilisation, known_share
WITH s AS (
    SELECT run_id, workload, "window", acc_len, correct_drafts, mode, gamma, block_accept
    FROM known_blocks($run_id)
)
SELECT
    run_id,
    any_value(mode) AS mode,
    workload,
    count(*) AS request_steps,
    avg("window") AS mean_window,
    avg(CASE WHEN "window" = gamma THEN 1.0 ELSE 0.0 END) AS full_window_share,
    avg(CASE WHEN "window" <= 3 THEN 1.0 ELSE 0.0 END) AS share_le3,
    avg(acc_len) AS mean_acc_len,
    avg(block_accept + 1) AS mean_block_accept_len,
    sum(acc_len) FILTER (WHERE block_accept IS NOT NULL)
        / nullif(sum(block_accept + 1), 0) AS utilisation,
    avg(CASE WHEN block_accept IS NOT NULL THEN 1.0 ELSE 0.0 END) AS known_share
FROM s
GROUP BY run_id, workload
ORDER BY run_id, workload NULLS LAST;
