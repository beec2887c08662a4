"""Row-wise functions in blocks of rows: the same bits as one whole-array evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_obs.estimators.replay.schedule import recalibrate
from dspark_obs.rowwise import BLOCK_ROWS, by_row_blocks
from dspark_obs.scheduler import survival_from_confidence


@pytest.mark.parametrize("n", [0, 1, 7, 64, 65])
def test_blocks_of_any_size_give_the_whole_array_result(n):
    x = np.random.default_rng(n).random((n, 3))
    want = np.cumprod(x, axis=-1)
    got = by_row_blocks(lambda a: np.cumprod(a, axis=-1), x, rows=8)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_several_arrays_are_cut_at_the_same_rows():
    rng = np.random.default_rng(1)
    a, b = rng.random((50, 2)), rng.random(50)
    assert np.array_equal(by_row_blocks(lambda x, y: x * y[:, None], a, b, rows=9), a * b[:, None])


def _confidences(rows: int) -> np.ndarray:
    c = np.random.default_rng(2).random((rows, 6), dtype=np.float32)
    c[::97, 2] = 0.0   # the edges: logit -inf and +inf, a survival that stops
    c[::89, 4] = 1.0
    return c


def test_recalibrated_confidences_are_bit_identical_in_blocks():
    conf = _confidences(BLOCK_ROWS * 2 + 123)
    t_new = [1.0, 0.8, 1.4, 1.0, 0.5, 2.0]
    ratio = np.ones(6) / np.array(t_new)
    with np.errstate(divide="ignore", over="ignore"):
        c = conf.astype(np.float64)
        whole = 1.0 / (1.0 + np.exp(-(np.log(c) - np.log1p(-c)) * ratio))
    want = np.where(ratio == 1.0, conf, whole.astype(np.float32))
    got = recalibrate(conf, [1.0] * 6, t_new)
    assert got.dtype == np.float32 and got.shape == conf.shape
    assert np.array_equal(got, want, equal_nan=True)


def test_survivals_are_bit_identical_in_blocks():
    conf = _confidences(BLOCK_ROWS + 5)
    want = np.cumprod(conf.astype(np.float64), axis=-1).astype(np.float32)
    got = survival_from_confidence(conf)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert np.array_equal(survival_from_confidence(conf[0]), want[0])   # one row, as the scheduler asks
