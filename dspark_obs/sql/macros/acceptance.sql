-- The rule "full-block acceptance where known", in SQL; its Python side is dspark_obs.acceptance
-- (mode_block_accept, known_block_accept), and tests/test_acceptance.py holds both to one table of cases.

-- Drafts a full-block verify accepted, where the run's mode alone shows it: a cap-accept step
-- (correct_drafts + cap_trim), a static step (correct_drafts); else NULL (compact).
CREATE OR REPLACE MACRO mode_block_accept(mode, correct_drafts, cap_trim) AS
CASE
    WHEN mode = 'cap-accept' THEN correct_drafts + cap_trim
    WHEN mode = 'static' THEN correct_drafts
END;

-- A step whose window hides its full-block acceptance: it accepted all of a window short of the
-- block (correct_drafts = win < gamma); dspark_obs.acceptance.censored.
CREATE OR REPLACE MACRO censored(correct_drafts, win, gamma) AS correct_drafts = win AND win < gamma;

-- Full-block acceptance where a request-step shows it, else NULL: what the mode shows, then the
-- truth (the emulator's emu_block_accept, a companion's step; NULL when unknown), then the window
-- unless censored: a draft rejected inside it (correct_drafts < win) or a window of the whole block.
CREATE OR REPLACE MACRO known_block_accept(mode, truth, correct_drafts, cap_trim, win, gamma) AS
coalesce(mode_block_accept(mode, correct_drafts, cap_trim), truth,
         CASE WHEN NOT censored(correct_drafts, win, gamma) THEN correct_drafts END);

-- The request-steps of step_reqs_w (of one run; NULL: every run) with their run's mode and gamma
-- (runs.gamma, else the number of draft_tokens) and block_accept, known_block_accept of each.
CREATE OR REPLACE MACRO known_blocks(only_run) AS TABLE
SELECT w.*, r.mode, coalesce(r.gamma, len(w.draft_tokens)) AS gamma,
       known_block_accept(r.mode, w.emu_block_accept, w.correct_drafts, w.cap_trim, w."window",
                          coalesce(r.gamma, len(w.draft_tokens))) AS block_accept
FROM step_reqs_w AS w
LEFT JOIN runs AS r ON r.run_id = w.run_id
WHERE only_run IS NULL OR w.run_id = only_run;
