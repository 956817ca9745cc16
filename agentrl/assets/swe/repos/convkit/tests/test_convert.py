from convkit.convert import (
    celsius_to_fahrenheit,
    days_in_month,
    from_roman,
    is_leap,
    seconds_to_clock,
    to_base,
    to_roman,
)


def test_to_roman():
    assert to_roman(1994) == "MCMXCIV"


def test_to_roman_small():
    assert [to_roman(i) for i in (1, 4, 9, 14)] == ["I", "IV", "IX", "XIV"]


def test_from_roman():
    assert from_roman("MCMXCIV") == 1994


def test_from_roman_plain():
    assert from_roman("XXVII") == 27


def test_leap_years():
    assert [y for y in (1900, 2000, 2023, 2024) if is_leap(y)] == [2000, 2024]


def test_days_february():
    assert [days_in_month(2023, 2), days_in_month(2024, 2)] == [28, 29]


def test_days_april():
    assert days_in_month(2024, 4) == 30


def test_days_december():
    assert days_in_month(2024, 12) == 31


def test_to_base_binary():
    assert to_base(10, 2) == "1010"


def test_to_base_hex():
    assert to_base(255, 16) == "ff"


def test_to_base_zero():
    assert to_base(0, 8) == "0"


def test_clock():
    assert seconds_to_clock(3725) == "1:02:05"


def test_clock_minutes():
    assert seconds_to_clock(59) == "0:00:59"


def test_clock_long():
    assert seconds_to_clock(86399) == "23:59:59"


def test_freezing():
    assert celsius_to_fahrenheit(0) == 32.0


def test_body():
    assert celsius_to_fahrenheit(37) == 98.6


def test_negative():
    assert celsius_to_fahrenheit(-40) == -40.0
