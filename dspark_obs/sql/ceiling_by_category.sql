-- Block-accept ceiling per run, category and sampling kind: steps, mean lo/mid/hi and interval width.
--
-- Reads the ceiling table written by `dspark-obs estimate` (lo, mid, hi in
-- drafts a full-block verify would accept, 0..gamma).  Categories follow
-- SGLang's block-accept analyzer: exact_in_window (not censored),
-- censored_resolved_exact, censored_diverged, censored_eos, censored_at_end.
-- sampling is greedy (exact rule), sampled or unknown (the sampled rule), as recorded, overridden or
-- inferred (ceiling.sampling_source).
--
-- Parameters:
--   $run_id   only this run; default NULL (every run)
-- Output columns:
--   run_id, category, sampling, steps, mean_window, mean_lo, mean_mid, mean_hi, mean_width
SELECT
    run_id,
    category,
    sampling,
    count(*) AS steps,
    avg("window") AS mean_window,
    avg(lo) AS mean_lo,
    avg(mid) AS mean_mid,
    avg(hi) AS mean_hi,
    avg(hi - lo) AS mean_width
FROM ceiling
WHERE $run_id IS NULL OR run_id = $run_id
GROUP BY run_id, category, sampling
ORDER BY run_id, category, sampling;
