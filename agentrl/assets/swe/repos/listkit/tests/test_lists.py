from listkit.lists import (
    argmax,
    chunk,
    dedupe,
    flatten,
    interleave,
    rotate,
    running_max,
    window_sums,
)


def test_chunk():
    assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]


def test_chunk_exact():
    assert chunk([1, 2, 3, 4], 4) == [[1, 2, 3, 4]]


def test_flatten():
    assert flatten([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_empty():
    assert flatten([[], [[]]]) == []


def test_dedupe():
    assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]


def test_dedupe_strings():
    assert dedupe(["b", "a", "b"]) == ["b", "a"]


def test_rotate():
    assert rotate([1, 2, 3, 4, 5], 2) == [3, 4, 5, 1, 2]


def test_rotate_wrap():
    assert rotate([1, 2, 3], 4) == [2, 3, 1]


def test_rotate_empty():
    assert rotate([], 3) == []


def test_running_max():
    assert running_max([2, 1, 4, 3, 5]) == [2, 2, 4, 4, 5]


def test_running_max_negative():
    assert running_max([-5, -7, -1]) == [-5, -5, -1]


def test_window_sums():
    assert window_sums([1, 2, 3, 4, 5], 3) == [6, 9, 12]


def test_window_sums_whole():
    assert window_sums([1, 2], 2) == [3]


def test_window_sums_too_wide():
    assert window_sums([1, 2], 3) == []


def test_interleave():
    assert interleave([1, 2, 3], ["a", "b"]) == [1, "a", 2, "b", 3]


def test_interleave_longer_b():
    assert interleave([1], ["a", "b", "c"]) == [1, "a", "b", "c"]


def test_argmax():
    assert argmax([3, 9, 2, 9]) == 1


def test_argmax_first():
    assert argmax([7, 1, 2]) == 0


def test_argmax_last():
    assert argmax([1, 2, 8]) == 2
