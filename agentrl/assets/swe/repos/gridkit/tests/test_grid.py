from gridkit.grid import (
    diagonal,
    flood_count,
    manhattan,
    neighbours,
    rotate_right,
    row_sums,
    spiral,
    transpose,
)


def test_transpose():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_empty():
    assert transpose([]) == []


def test_rotate_right():
    assert rotate_right([[1, 2], [3, 4]]) == [[3, 1], [4, 2]]


def test_rotate_right_wide():
    assert rotate_right([[1, 2, 3]]) == [[1], [2], [3]]


def test_manhattan():
    assert manhattan((1, 2), (4, -2)) == 7


def test_manhattan_same():
    assert manhattan((3, 3), (3, 3)) == 0


def test_neighbours_middle():
    assert neighbours([[1, 1, 0], [0, 1, 0], [1, 0, 1]], 1, 1) == 4


def test_neighbours_corner():
    assert neighbours([[1, 1], [1, 1]], 0, 0) == 3


def test_neighbours_edge():
    assert neighbours([[0, 1, 0], [1, 0, 1]], 1, 1) == 3


def test_spiral():
    assert spiral([[1, 2, 3], [4, 5, 6], [7, 8, 9]]) == [1, 2, 3, 6, 9, 8, 7, 4, 5]


def test_spiral_row():
    assert spiral([[1, 2, 3]]) == [1, 2, 3]


def test_spiral_column():
    assert spiral([[1], [2], [3]]) == [1, 2, 3]


def test_row_sums():
    assert row_sums([[1, 2], [3, 4], [5, -5]]) == [3, 7, 0]


def test_diagonal():
    assert diagonal([[1, 2, 3], [4, 5, 6], [7, 8, 9]]) == [1, 5, 9]


def test_flood_count():
    assert flood_count([[1, 1, 0], [0, 1, 0], [1, 0, 1]], 0, 0) == 3


def test_flood_count_all():
    assert flood_count([[2, 2], [2, 2]], 1, 1) == 4


def test_flood_count_single():
    assert flood_count([[1, 0], [0, 1]], 1, 1) == 1
