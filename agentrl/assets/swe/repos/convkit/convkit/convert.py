"""Conversions between number systems, calendars and units."""

ROMAN = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
         (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]  # fmt: skip


def to_roman(n):
    """Roman numeral of 1 <= n <= 3999."""
    out = ""
    for value, letters in ROMAN:
        while n >= value:
            out += letters
            n -= value
    return out


def from_roman(text):
    """The integer a Roman numeral stands for."""
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for i, ch in enumerate(text):
        v = values[ch]
        if i + 1 < len(text) and values[text[i + 1]] > v:
            total -= v
        else:
            total += v
    return total


def is_leap(year):
    """Gregorian leap year."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    """Days in a month (1-12) of a year."""
    if month == 2:
        return 29 if is_leap(year) else 28
    if month in (4, 6, 9, 11):
        return 30
    return 31


def to_base(n, base):
    """Digits of n >= 0 in a base from 2 to 16 (lower-case letters)."""
    digits = "0123456789abcdef"
    if n == 0:
        return "0"
    out = ""
    while n > 0:
        out = digits[n % base] + out
        n //= base
    return out


def seconds_to_clock(seconds):
    """H:MM:SS of a number of seconds."""
    h = seconds // 3600
    m = seconds % 3600 // 60
    s = seconds % 60
    return f"{h}:{m:02d}:{s:02d}"


def celsius_to_fahrenheit(c):
    """Degrees Fahrenheit, rounded to one decimal."""
    return round(c * 9 / 5 + 32, 1)
