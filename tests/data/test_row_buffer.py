"""The FIFO row buffer of collectors and prompt selectors."""

import numpy as np
import pytest

from rljax.data.row_buffer import RowBuffer


def rows(values):
    values = np.asarray(values)
    return {"x": values, "y": np.stack([values, -values], 1)}


def test_row_buffer_is_fifo_with_capacity():
    buffer = RowBuffer(4)
    assert len(buffer) == 0
    buffer.add(rows([1, 2, 3]))
    buffer.add(rows([]))  # nothing to add
    buffer.add(rows([4, 5]))  # 1 falls out
    assert len(buffer) == 4
    np.testing.assert_array_equal(buffer.rows["y"][:, 1], [-2, -3, -4, -5])
    np.testing.assert_array_equal(buffer.pop(3)["x"], [2, 3, 4])
    np.testing.assert_array_equal(buffer.pop(1)["x"], [5])
    assert len(buffer) == 0 and buffer.rows is None
    with pytest.raises(ValueError, match="cannot pop 1 rows"):
        buffer.pop(1)


def test_row_buffer_sample_is_without_replacement_and_keeps_rows():
    buffer = RowBuffer(10)
    buffer.add(rows(np.arange(10)))
    got = buffer.sample(6, np.random.default_rng(0))["x"]
    assert len(set(got.tolist())) == 6 and np.all(np.diff(got) > 0)
    assert len(buffer) == 10
    with pytest.raises(ValueError, match="cannot sample 11"):
        buffer.sample(11, np.random.default_rng(0))


def test_row_buffer_state_round_trip_and_field_check():
    buffer = RowBuffer(5)
    assert buffer.state() == {}
    buffer.add(rows([7, 8]))
    other = RowBuffer(5)
    other.load(buffer.state())
    np.testing.assert_array_equal(other.rows["y"], buffer.rows["y"])
    other.load({})
    assert len(other) == 0
    with pytest.raises(ValueError, match="do not match"):
        buffer.add({"x": np.array([1])})
    with pytest.raises(ValueError, match="capacity=0"):
        RowBuffer(0)
