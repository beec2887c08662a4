-- Full-block acceptance where a request-step shows it (drafts a full-block verify accepts), else NULL:
-- the emulator's truth, a cap-accept step (correct_drafts + cap_trim), a static step (correct_drafts),
-- or a window that rejected a draft (correct_drafts < window).  The Python side of the rule is
-- dspark_obs.acceptance.known_block_accept.
CREATE OR REPLACE MACRO known_block_accept(mode, emu_block_accept, correct_drafts, cap_trim, win) AS
CASE
    WHEN emu_block_accept IS NOT NULL THEN emu_block_accept
    WHEN mode = 'cap-accept' THEN correct_drafts + cap_trim
    WHEN mode = 'static' THEN correct_drafts
    WHEN correct_drafts < win THEN correct_drafts
END;
