-- Trimming health: per run, run x workload and run x DP rank, the figures doctor, the sidecar, the Overview and the report judge.
--
-- Request-step figures (every row): request_steps; trimmed_steps, those with
-- verify_len < gamma + 1, and trimmed_share; budget_trimmed_steps, those of
-- them whose first trimmed draft still had survival >= 0.01 (a trim the
-- planner's budget made: SGLang's flat no-table budget, taken from lagged
-- survivals, also cuts drafts that were near-certain to fail), and
-- budget_trimmed_share, the figure behind 'trimming active'; window_sizes, distinct verify_len
-- seen; verified_tokens = sum(verify_len) against no_trim_tokens =
-- request_steps * (gamma + 1), trim_ratio their quotient; censored_steps,
-- those that accepted their whole window with window < gamma, and
-- trim_regret = censored_steps / trimmed_steps (an exact lower bound on loss:
-- each of them might have accepted more); acceptance = accepted_drafts /
-- verified_drafts (the drafts actually verified) beside SGLang's
-- spec_accept_rate = accepted_drafts / proposed_drafts (gamma per step) and
-- accept_rate_gap = acceptance - spec_accept_rate; expected_accepted, the
-- survival-predicted accepted drafts sum(S_1..S_window) over the
-- survival_steps that carry survival, beside their survival_accepted.
-- Tokens lost to trimming (tokens_lost, _lo, _hi) = sum(ceiling - accepted)
-- over the ceiling_steps `dspark-obs estimate` wrote (method default; null
-- without one).  Step figures (workload '*' rows only; a step serves many
-- workloads): decode_steps; padded_tokens = num_verify_tokens (the graph
-- tier) - sum(verify_len) over compact steps, of graph_tokens, and
-- padding_share; dp_tier_tokens = verify_tokens_dp_synced -
-- verify_tokens_local (null when the server reports neither); cost-table fit
-- of predicted_step_ms against step_gpu_ms over fit_steps: costtable_mape,
-- and its drift (second half of the run's steps minus the first);
-- timed_steps with step_cpu_ms and their mean step_cpu_ms (the step loop's
-- period).  Observation overhead (pooled rows only; from the runs row the
-- collector closes, null while it runs): observation_requests (polls and
-- clears it sent and timed), observation_server_s (the server's time
-- answering them), collect_s, observation_share = observation_server_s /
-- collect_s (share of wall time the server spent answering the sidecar),
-- poll_ms (mean per request) and poll_step_ratio = poll_ms / step_cpu_ms
-- (one poll's time in steps).
-- Filters as the dashboard's: run, workload, DP rank, request submission
-- time (the time filter applies to request-steps only).  dp_rank and
-- workload are '*' on pooled rows.
--
-- Parameters:
--   $runs        only these run ids (list); default NULL (every run)
--   $workloads   only these workloads (list); default NULL
--   $dp_ranks    only these DP ranks (list); default NULL
--   $t0          requests submitted at or after this time; default NULL
--   $t1          requests submitted at or before this time; default NULL
-- Output columns:
--   run_id, dp_rank, workload, gamma, request_steps, trimmed_steps,
--   trimmed_share, budget_trimmed_steps, budget_trimmed_share, window_sizes, verified_tokens, no_trim_tokens, trim_ratio,
--   censored_steps, trim_regret, accepted_drafts, verified_drafts,
--   proposed_drafts, acceptance, spec_accept_rate, accept_rate_gap,
--   survival_steps, expected_accepted, survival_accepted, ceiling_steps,
--   tokens_lost, tokens_lost_lo, tokens_lost_hi, decode_steps, graph_tokens,
--   padded_tokens, padding_share, dp_tier_tokens, fit_steps, costtable_mape,
--   costtable_mape_first_half, costtable_mape_second_half, costtable_mape_drift,
--   timed_steps, step_cpu_ms, observation_requests, observation_server_s,
--   collect_s, observation_share, poll_ms, poll_step_ratio
WITH rq AS (
    SELECT run_id, rid, coalesce(any_value(workload), 'unknown') AS workload, any_value(submitted_at) AS submitted_at
    FROM requests
    WHERE $runs IS NULL OR list_contains($runs, run_id)
    GROUP BY run_id, rid
),
g AS (SELECT run_id, any_value(gamma) AS gamma, any_value(observation_requests) AS observation_requests,
             any_value(observation_server_s) AS observation_server_s, any_value(collect_s) AS collect_s
      FROM runs GROUP BY run_id),
ce AS (
    SELECT run_id, dp_rank, segment, forward_ct, rid, any_value(lo) AS lo, any_value(mid) AS mid, any_value(hi) AS hi
    FROM ceiling
    WHERE coalesce(method, 'default') = 'default' AND ($runs IS NULL OR list_contains($runs, run_id))
    GROUP BY ALL
),
sr AS (
    SELECT s.run_id, s.dp_rank, coalesce(rq.workload, 'unknown') AS workload,
           coalesce(g.gamma, len(s.draft_tokens)) AS gamma, s.verify_len, s.correct_drafts,
           s.survival IS NOT NULL AS has_survival,
           s.verify_len < coalesce(g.gamma, len(s.draft_tokens)) + 1
               AND coalesce(s.survival[s.verify_len] >= 0.01, true) AS budget_trimmed,
           CASE WHEN s.survival IS NOT NULL
                THEN coalesce(list_sum(list_slice(s.survival, 1, s.verify_len - 1)), 0) END AS expected,
           ce.mid - s.correct_drafts AS lost, ce.lo - s.correct_drafts AS lost_lo, ce.hi - s.correct_drafts AS lost_hi
    FROM step_reqs AS s
    LEFT JOIN rq ON rq.run_id = s.run_id AND rq.rid = s.rid
    LEFT JOIN g ON g.run_id = s.run_id
    LEFT JOIN ce ON ce.run_id = s.run_id AND ce.dp_rank = s.dp_rank AND ce.segment = s.segment
                AND ce.forward_ct = s.forward_ct AND ce.rid IS NOT DISTINCT FROM s.rid
    WHERE ($runs IS NULL OR list_contains($runs, s.run_id))
      AND ($dp_ranks IS NULL OR list_contains($dp_ranks, s.dp_rank))
      AND ($workloads IS NULL OR list_contains($workloads, coalesce(rq.workload, 'unknown')))
      AND ($t0 IS NULL OR rq.submitted_at >= $t0)
      AND ($t1 IS NULL OR rq.submitted_at <= $t1)
),
per AS (
    SELECT run_id,
           CASE WHEN grouping(dp_rank) = 1 THEN '*' ELSE CAST(dp_rank AS VARCHAR) END AS dp_rank,
           CASE WHEN grouping(workload) = 1 THEN '*' ELSE workload END AS workload,
           max(gamma) AS gamma,
           count(*) AS request_steps,
           count(*) FILTER (WHERE verify_len < gamma + 1) AS trimmed_steps,
           count(*) FILTER (WHERE budget_trimmed) AS budget_trimmed_steps,
           count(DISTINCT verify_len) AS window_sizes,
           sum(verify_len) AS verified_tokens,
           sum(gamma + 1) AS no_trim_tokens,
           count(*) FILTER (WHERE correct_drafts = verify_len - 1 AND verify_len - 1 < gamma) AS censored_steps,
           sum(correct_drafts) AS accepted_drafts,
           sum(verify_len - 1) AS verified_drafts,
           sum(gamma) AS proposed_drafts,
           count(*) FILTER (WHERE has_survival) AS survival_steps,
           sum(expected) AS expected_accepted,
           sum(correct_drafts) FILTER (WHERE has_survival) AS survival_accepted,
           count(lost) AS ceiling_steps,
           sum(lost) AS tokens_lost, sum(lost_lo) AS tokens_lost_lo, sum(lost_hi) AS tokens_lost_hi
    FROM sr
    GROUP BY GROUPING SETS ((run_id), (run_id, workload), (run_id, dp_rank))
),
vs AS (
    SELECT run_id, dp_rank, segment, forward_ct, sum(verify_len) AS sum_verify
    FROM step_reqs
    WHERE $runs IS NULL OR list_contains($runs, run_id)
    GROUP BY ALL
),
st AS (
    SELECT t.run_id, t.dp_rank, t.mode, t.num_verify_tokens, t.verify_tokens_local, t.verify_tokens_dp_synced,
           vs.sum_verify, t.step_cpu_ms,
           CASE WHEN t.predicted_step_ms IS NOT NULL AND t.step_gpu_ms > 0
                THEN abs(t.predicted_step_ms - t.step_gpu_ms) / t.step_gpu_ms END AS ape,
           row_number() OVER (PARTITION BY t.run_id ORDER BY t.segment, t.forward_ct, t.dp_rank) AS ord,
           count(*) OVER (PARTITION BY t.run_id) AS n_steps
    FROM steps AS t
    LEFT JOIN vs ON vs.run_id = t.run_id AND vs.dp_rank = t.dp_rank AND vs.segment = t.segment
                AND vs.forward_ct = t.forward_ct
    WHERE ($runs IS NULL OR list_contains($runs, t.run_id))
      AND ($dp_ranks IS NULL OR list_contains($dp_ranks, t.dp_rank))
),
stg AS (
    SELECT run_id,
           CASE WHEN grouping(dp_rank) = 1 THEN '*' ELSE CAST(dp_rank AS VARCHAR) END AS dp_rank,
           '*' AS workload,
           count(*) AS decode_steps,
           sum(num_verify_tokens) FILTER (WHERE mode = 'compact' AND num_verify_tokens >= 0
                                          AND sum_verify IS NOT NULL) AS graph_tokens,
           sum(num_verify_tokens - sum_verify) FILTER (WHERE mode = 'compact' AND num_verify_tokens >= 0
                                                      AND sum_verify IS NOT NULL) AS padded_tokens,
           sum(verify_tokens_dp_synced - verify_tokens_local)
               FILTER (WHERE verify_tokens_dp_synced >= 0 AND verify_tokens_local >= 0) AS dp_tier_tokens,
           count(ape) AS fit_steps,
           avg(ape) AS costtable_mape,
           avg(ape) FILTER (WHERE 2 * ord <= n_steps) AS costtable_mape_first_half,
           avg(ape) FILTER (WHERE 2 * ord > n_steps) AS costtable_mape_second_half,
           count(step_cpu_ms) AS timed_steps, avg(step_cpu_ms) AS step_cpu_ms
    FROM st
    GROUP BY GROUPING SETS ((run_id), (run_id, dp_rank))
)
SELECT per.run_id, per.dp_rank, per.workload, per.gamma,
       per.request_steps, per.trimmed_steps, per.trimmed_steps / per.request_steps AS trimmed_share,
       per.budget_trimmed_steps, per.budget_trimmed_steps / per.request_steps AS budget_trimmed_share,
       per.window_sizes,
       per.verified_tokens, per.no_trim_tokens, per.verified_tokens / per.no_trim_tokens AS trim_ratio,
       per.censored_steps, per.censored_steps / nullif(per.trimmed_steps, 0) AS trim_regret,
       per.accepted_drafts, per.verified_drafts, per.proposed_drafts,
       per.accepted_drafts / nullif(per.verified_drafts, 0) AS acceptance,
       per.accepted_drafts / nullif(per.proposed_drafts, 0) AS spec_accept_rate,
       per.accepted_drafts / nullif(per.verified_drafts, 0)
           - per.accepted_drafts / nullif(per.proposed_drafts, 0) AS accept_rate_gap,
       per.survival_steps, per.expected_accepted, per.survival_accepted,
       per.ceiling_steps,
       CASE WHEN per.ceiling_steps > 0 THEN per.tokens_lost END AS tokens_lost,
       CASE WHEN per.ceiling_steps > 0 THEN per.tokens_lost_lo END AS tokens_lost_lo,
       CASE WHEN per.ceiling_steps > 0 THEN per.tokens_lost_hi END AS tokens_lost_hi,
       stg.decode_steps, stg.graph_tokens, stg.padded_tokens,
       stg.padded_tokens / nullif(stg.graph_tokens, 0) AS padding_share,
       stg.dp_tier_tokens, stg.fit_steps, stg.costtable_mape,
       stg.costtable_mape_first_half, stg.costtable_mape_second_half,
       stg.costtable_mape_second_half - stg.costtable_mape_first_half AS costtable_mape_drift,
       stg.timed_steps, stg.step_cpu_ms,
       ob.observation_requests, ob.observation_server_s, ob.collect_s,
       ob.observation_server_s / nullif(ob.collect_s, 0) AS observation_share,
       1000 * ob.observation_server_s / nullif(ob.observation_requests, 0) AS poll_ms,
       1000 * ob.observation_server_s / nullif(ob.observation_requests, 0) / nullif(stg.step_cpu_ms, 0)
           AS poll_step_ratio
FROM per
LEFT JOIN stg ON stg.run_id = per.run_id AND stg.dp_rank = per.dp_rank AND stg.workload = per.workload
LEFT JOIN g AS ob ON ob.run_id = per.run_id AND per.dp_rank = '*' AND per.workload = '*'
ORDER BY per.run_id, per.dp_rank = '*' DESC, per.dp_rank, per.workload = '*' DESC, per.workload;
