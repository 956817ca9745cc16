from textkit.text import (
    camel_to_snake,
    count_words,
    initials,
    is_palindrome,
    slugify,
    snake_to_camel,
    truncate,
    wrap,
)


def test_slugify_words():
    assert slugify("Hello World") == "hello-world"


def test_slugify_punctuation():
    assert slugify("  Rock & Roll!  ") == "rock-roll"


def test_slugify_digits():
    assert slugify("Top 10 tips") == "top-10-tips"


def test_truncate_short():
    assert truncate("short", 10) == "short"


def test_truncate_exact():
    assert truncate("exactly10!", 10) == "exactly10!"


def test_truncate_cut():
    assert truncate("a long sentence here", 10) == "a long ..."


def test_truncate_tiny_width():
    assert truncate("abcdef", 2) == ".."


def test_count_words():
    assert count_words("the cat and The hat") == {"the": 2, "cat": 1, "and": 1, "hat": 1}


def test_count_words_empty():
    assert count_words("   ") == {}


def test_palindrome_phrase():
    assert is_palindrome("A man, a plan, a canal: Panama") is True


def test_palindrome_no():
    assert is_palindrome("palindrome") is False


def test_palindrome_near():
    assert is_palindrome("abca") is False


def test_camel_to_snake():
    assert camel_to_snake("parseHttpResponse") == "parse_http_response"


def test_pascal_to_snake():
    assert camel_to_snake("UserId") == "user_id"


def test_snake_to_camel():
    assert snake_to_camel("parse_http_response") == "parseHttpResponse"


def test_snake_to_camel_edges():
    assert snake_to_camel("_private__name_") == "privateName"


def test_wrap():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_exact():
    assert wrap("aaaa bbbb cccc", 9) == ["aaaa bbbb", "cccc"]


def test_initials():
    assert initials("ada lovelace") == "A.L."


def test_initials_spaces():
    assert initials("  grace   brewster hopper ") == "G.B.H."
