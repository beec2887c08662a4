"""Collected real-model runs against the model's own truth: identity, ceiling, calibration, replay.

Figures are printed (``-s`` shows them; the tier's script passes it) so the
README's real-model numbers can be re-measured; the assertions are floors a
broken estimator or emulator would fall through.
"""

from __future__ import annotations

import pytest

from tests.realmodel.conftest import TEMPERATURES


def _con(runs):
    from dspark_obs import sql

    return sql.connect(runs.root)


def _tokens(con, run):
    rows = con.execute("SELECT rid, list(token_id ORDER BY pos) FROM tokens WHERE run_id = $run GROUP BY rid",
                       {"run": run}).fetchall()
    return {rid: list(ids) for rid, ids in rows}


@pytest.fixture(scope="module")
def estimated(runs):
    from dspark_obs.estimators import calibration, ceiling

    for temp in TEMPERATURES:
        ceiling.estimate_run(runs.store, runs.compact[temp], companion=runs.companion[temp], n_bootstrap=50)
        for labels in ("observed", "reconstructed", "companion"):
            calibration.calibrate_run(runs.store, runs.compact[temp], labels=labels,
                                      companion=runs.companion[temp], n_bootstrap=50)
    return runs


@pytest.mark.parametrize("temp", TEMPERATURES)
def test_compact_cap_accept_and_static_commit_identical_tokens(runs, temp):
    con = _con(runs)
    compact, cap = _tokens(con, runs.compact[temp]), _tokens(con, runs.companion[temp])
    assert len(compact) == 9 and compact == cap
    assert {rid: ids for rid, ids in runs.static_outputs[temp].items()} == compact
    summary = con.execute("SELECT identical, replayed, paired_steps, pairable_steps FROM companion_pairing_summary "
                          "WHERE run_id = $run", {"run": runs.companion[temp]}).fetchone()
    print(f"\nt={temp}: companion identical {summary[0]} of {summary[1]}, paired steps {summary[2]} of {summary[3]}")
    assert summary[0] == summary[1] == 9 and summary[2] == summary[3] > 0


@pytest.mark.parametrize("temp", TEMPERATURES)
def test_runs_batch_and_trim(runs, temp):
    con = _con(runs)
    bs, window, full = con.execute(
        "SELECT max(s.bs), avg(r.verify_len - 1), avg(CASE WHEN r.verify_len = 7 THEN 1 ELSE 0 END) "
        "FROM steps s JOIN step_reqs r USING (run_id, dp_rank, forward_ct) WHERE run_id = $run",
        {"run": runs.compact[temp]}).fetchone()
    per_workload = con.execute(
        "SELECT workload, avg(verify_len - 1), count(*) FROM step_reqs JOIN requests USING (run_id, rid) "
        "WHERE run_id = $run GROUP BY 1 ORDER BY 1", {"run": runs.compact[temp]}).fetchall()
    print(f"\nt={temp}: max bs {bs}, mean window {window:.2f}, full-window share {full:.2f}; per workload "
          + ", ".join(f"{w} {m:.2f} ({n} steps)" for w, m, n in per_workload))
    assert bs == 9 and 0 < window < 6  # batched, and the scheduler trims


def _judged(con, run):
    return con.execute(
        "SELECT c.lo, c.mid, c.hi, s.emu_block_accept, s.emu_expected_given_window, c.sampling "
        "FROM ceiling c JOIN step_reqs s USING (run_id, dp_rank, forward_ct, rid) "
        "WHERE c.run_id = $run AND c.censored", {"run": run}).fetchall()


def test_greedy_exact_ceiling_claims_match_the_model_and_the_companion(estimated):
    con = _con(estimated)
    rows = _judged(con, estimated.compact[0.0])
    exact = [r for r in rows if r[2] - r[0] < 1e-9]
    right = [r for r in exact if abs(r[0] - r[3]) < 1e-9]
    # The companion's full-block acceptance of the same step (paired by rid and prefix_len).
    comp = con.execute(
        "SELECT count(*), sum(CASE WHEN abs(c.lo - (k.correct_drafts + k.cap_trim)) < 1e-9 THEN 1 ELSE 0 END) "
        "FROM ceiling c JOIN step_reqs s USING (run_id, dp_rank, forward_ct, rid) "
        "JOIN step_reqs k ON k.run_id = $cap AND k.rid = c.rid AND k.prefix_len = s.prefix_len "
        "WHERE c.run_id = $run AND c.censored AND c.hi - c.lo < 1e-9",
        {"run": estimated.compact[0.0], "cap": estimated.companion[0.0]}).fetchone()
    print(f"\ngreedy: {len(rows)} censored steps, exact claimed on {len(exact)} "
          f"({len(exact) / max(len(rows), 1):.1%}), right {len(right)}; against the companion {comp[1]} of {comp[0]}")
    assert {r[5] for r in rows} == {"greedy"}
    assert len(rows) > 20 and len(exact) >= 0.8 * len(rows)
    assert len(right) == len(exact) and comp[0] == len(exact) and comp[1] == comp[0]


def test_sampled_intervals_cover_the_conditional_expectation(estimated):
    con = _con(estimated)
    rows = _judged(con, estimated.compact[0.7])
    cover = sum(lo - 1e-6 <= e <= hi + 1e-6 for lo, _, hi, _, e, _ in rows) / len(rows)
    err = sum(abs(mid - e) for _, mid, _, _, e, _ in rows) / len(rows)
    width = sum(hi - lo for lo, _, hi, _, _, _ in rows) / len(rows)
    print(f"\nt=0.7: {len(rows)} censored steps; [lo, hi] covers emu_expected_given_window on {cover:.1%}, "
          f"mean |mid - it| {err:.3f} drafts, mean width {width:.2f}")
    assert len(rows) > 20
    # 9 requests (the tier's budget): limits with room for that sample; bench/estimator_truth measures
    # 96 requests (coverage 99.5%, MAE 0.29)
    assert cover >= 0.9 and err < 0.8


@pytest.mark.parametrize("temp", TEMPERATURES)
def test_reconstructed_labels_calibrate_like_companion_labels(estimated, temp):
    con = _con(estimated)
    rows = con.execute(
        "SELECT position, labels, ece FROM calibration WHERE run_id = $run AND workload = '*' "
        "AND binning = 'width15' ORDER BY position", {"run": estimated.compact[temp]}).fetchall()
    by = {}
    for pos, labels, ece in rows:
        by.setdefault(labels, {})[pos] = ece
    gaps = [abs(by["reconstructed"][k] - by["companion"][k]) for k in by["companion"] if k in by["reconstructed"]]
    print(f"\nt={temp}: ECE per position observed {_fmt(by.get('observed'))}, reconstructed "
          f"{_fmt(by['reconstructed'])}, companion {_fmt(by['companion'])}; max |recon - companion| {max(gaps):.3f}")
    assert len(gaps) >= 3
    assert max(gaps) <= (0.02 if temp == 0 else 0.06)  # measured 0.004 and 0.018 on the tier's 9 requests


def _fmt(values):
    return "-" if not values else "/".join(f"{values[k]:.3f}" for k in sorted(values))


@pytest.mark.parametrize("temp", TEMPERATURES)
def test_schedule_replay_reproduces_the_logged_windows(runs, temp):
    from dspark_obs.estimators import replay

    con = _con(runs)
    replay.write_results(runs.store, replay.replay_run(con, runs.compact[temp]))
    share, steps = _con(runs).execute("SELECT share, steps FROM replay_conformance WHERE run_id = $run",
                                      {"run": runs.compact[temp]}).fetchone()
    print(f"\nt={temp}: replay reproduces {share:.1%} of {steps} logged steps")
    assert steps > 10 and share == 1.0


def test_a_separate_head_changes_confidences_and_windows_not_tokens(runs):
    from dspark_obs.emulator.engine import GenerateRequest
    from dspark_obs.emulator.realmodel.engine import RealModelConfig, RealModelEngine
    from tests.realmodel.conftest import MAX_NEW_TOKENS, planned_requests

    eng = RealModelEngine(RealModelConfig(mode="compact", seed=0, head_transform=(0.5, 1.0)))
    futs = {p.rid: eng.submit(GenerateRequest(rid=p.rid, text=p.text, temperature=0.7,
                                              max_new_tokens=MAX_NEW_TOKENS, sampling_seed=p.sampling_seed))
            for p in planned_requests(0.7)}
    eng.run_until_idle()
    assert {rid: f.result()["output_ids"] for rid, f in futs.items()} == runs.static_outputs[0.7]
    reqs = [q for rec in eng.dump()[0]["records"] for q in rec["reqs"]]
    # sigmoid(0.5 logit q + 1) > q for every q < 0.88: the head is over-confident where the drafter is unsure
    base = _con(runs).execute("SELECT avg(list_avg(confidence)), avg(verify_len) FROM step_reqs WHERE run_id = $run",
                              {"run": runs.compact[0.7]}).fetchone()
    mean_conf = sum(sum(q["confidence"]) / len(q["confidence"]) for q in reqs) / len(reqs)
    mean_len = sum(q["verify_len"] for q in reqs) / len(reqs)
    print(f"\nhead transform (0.5, 1.0): mean confidence {base[0]:.3f} -> {mean_conf:.3f}, "
          f"mean verify_len {base[1]:.2f} -> {mean_len:.2f}")
    assert mean_conf > base[0] + 0.05 and mean_len > base[1]


@pytest.mark.parametrize("temp", TEMPERATURES)
def test_committed_tokens_are_plain_sampling_from_the_target(runs, temp):
    """Token by token, no drafter: x_t = inverse CDF of p_t at the keyed uniform (argmax when greedy)."""
    import torch

    from dspark_obs.emulator.realmodel import coupling
    from dspark_obs.emulator.realmodel.pair import ModelPair
    from tests.realmodel.conftest import planned_requests

    pair = ModelPair.get()
    req = planned_requests(temp)[1]
    want = runs.static_outputs[temp][req.rid]
    caches = pair.new_caches(256)
    out, feed = [], pair.encode(req.text)
    t = torch.tensor([temp if temp > 0 else 1.0], dtype=torch.float64)
    with torch.inference_mode():
        while len(out) < len(want):
            logits, _, _ = pair.forward([feed], [caches], drafter=False, last_only=True)
            p = coupling.log_probs(logits, t).exp()
            u = coupling.uniforms(0, [req.sampling_seed], [len(out)], "target")
            x = int(p.argmax(-1)) if temp == 0 else int(coupling.inverse_cdf(p, u))
            out.append(x)
            feed = [x]
    assert out == want
