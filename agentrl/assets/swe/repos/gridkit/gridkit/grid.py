"""Grid helpers: a grid is a list of equally long rows."""


def transpose(grid):
    """Rows become columns."""
    if not grid:
        return []
    return [[grid[r][c] for r in range(len(grid))] for c in range(len(grid[0]))]


def rotate_right(grid):
    """The grid turned 90 degrees clockwise."""
    return [list(row)[::-1] for row in transpose(grid)]


def manhattan(a, b):
    """|dx| + |dy| between two (x, y) points."""
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def neighbours(grid, r, c):
    """How many of the 8 cells around (r, c) hold a truthy value."""
    count = 0
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            if dr == 0 and dc == 0:
                continue
            rr, cc = r + dr, c + dc
            if 0 <= rr < len(grid) and 0 <= cc < len(grid[0]) and grid[rr][cc]:
                count += 1
    return count


def spiral(grid):
    """The cells in clockwise spiral order from the top left."""
    out = []
    top, bottom, left, right = 0, len(grid) - 1, 0, len(grid[0]) - 1 if grid else -1
    while top <= bottom and left <= right:
        for c in range(left, right + 1):
            out.append(grid[top][c])
        for r in range(top + 1, bottom + 1):
            out.append(grid[r][right])
        if top < bottom:
            for c in range(right - 1, left - 1, -1):
                out.append(grid[bottom][c])
        if left < right:
            for r in range(bottom - 1, top, -1):
                out.append(grid[r][left])
        top, bottom, left, right = top + 1, bottom - 1, left + 1, right - 1
    return out


def row_sums(grid):
    """The sum of each row."""
    return [sum(row) for row in grid]


def diagonal(grid):
    """The top-left to bottom-right diagonal of a square grid."""
    return [grid[i][i] for i in range(len(grid))]


def flood_count(grid, r, c):
    """How many cells equal to grid[r][c] are connected to (r, c) (up, down, left, right)."""
    target = grid[r][c]
    seen = set()
    stack = [(r, c)]
    while stack:
        rr, cc = stack.pop()
        if (rr, cc) in seen:
            continue
        if not (0 <= rr < len(grid) and 0 <= cc < len(grid[0])):
            continue
        if grid[rr][cc] != target:
            continue
        seen.add((rr, cc))
        stack.extend([(rr + 1, cc), (rr - 1, cc), (rr, cc + 1), (rr, cc - 1)])
    return len(seen)
