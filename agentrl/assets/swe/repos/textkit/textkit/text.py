"""String helpers."""


def slugify(text):
    """Lower-case words joined by single hyphens; other characters dropped."""
    words = []
    current = ""
    for ch in text.lower():
        if ch.isalnum():
            current += ch
        elif current:
            words.append(current)
            current = ""
    if current:
        words.append(current)
    return "-".join(words)


def truncate(text, width, ellipsis="..."):
    """At most `width` characters; a cut text ends with `ellipsis`."""
    if len(text) <= width:
        return text
    keep = width - len(ellipsis)
    if keep < 0:
        return ellipsis[:width]
    return text[:keep] + ellipsis


def count_words(text):
    """How many times each lower-cased word occurs (words split on whitespace)."""
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts


def is_palindrome(text):
    """True when the letters and digits read the same both ways (case ignored)."""
    chars = [c.lower() for c in text if c.isalnum()]
    i, j = 0, len(chars) - 1
    while i < j:
        if chars[i] != chars[j]:
            return False
        i += 1
        j -= 1
    return True


def camel_to_snake(name):
    """camelCase or PascalCase to snake_case."""
    out = ""
    for i, ch in enumerate(name):
        if ch.isupper() and i > 0:
            out += "_"
        out += ch.lower()
    return out


def snake_to_camel(name):
    """snake_case to camelCase."""
    parts = [p for p in name.split("_") if p]
    if not parts:
        return ""
    return parts[0] + "".join(p[0].upper() + p[1:] for p in parts[1:])


def wrap(text, width):
    """Words greedily packed into lines of at most `width` characters."""
    lines = []
    line = ""
    for word in text.split():
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line = line + " " + word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines


def initials(name):
    """Upper-case first letters of the words of a name, each followed by a dot."""
    return "".join(w[0].upper() + "." for w in name.split() if w)
