"""List helpers."""


def chunk(items, size):
    """Consecutive pieces of `size` items (the last may be shorter)."""
    return [items[i : i + size] for i in range(0, len(items), size)]


def flatten(nested):
    """A list of lists (any depth) as one flat list."""
    out = []
    for item in nested:
        if isinstance(item, list):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out


def dedupe(items):
    """Items without repeats, in first-seen order."""
    seen = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def rotate(items, k):
    """Items rotated left by k places."""
    if not items:
        return []
    k = k % len(items)
    return items[k:] + items[:k]


def running_max(items):
    """The largest item so far, at each position."""
    out = []
    best = None
    for item in items:
        if best is None or item > best:
            best = item
        out.append(best)
    return out


def window_sums(items, width):
    """Sums of each window of `width` consecutive items."""
    if width > len(items):
        return []
    total = sum(items[:width])
    out = [total]
    for i in range(width, len(items)):
        total += items[i] - items[i - width]
        out.append(total)
    return out


def interleave(a, b):
    """a[0], b[0], a[1], b[1], ...; the rest of the longer list at the end."""
    out = []
    for i in range(max(len(a), len(b))):
        if i < len(a):
            out.append(a[i])
        if i < len(b):
            out.append(b[i])
    return out


def argmax(items):
    """Index of the first largest item."""
    best = 0
    for i in range(1, len(items)):
        if items[i] > items[best]:
            best = i
    return best
