from numkit.numbers import (
    clamp,
    collatz_steps,
    digit_sum,
    fib,
    gcd,
    is_prime,
    median,
    percent_change,
)


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_low():
    assert clamp(-3, 0, 10) == 0


def test_clamp_high():
    assert clamp(42, 0, 10) == 10


def test_clamp_edge():
    assert clamp(10, 0, 10) == 10


def test_gcd():
    assert gcd(48, 18) == 6


def test_gcd_negative():
    assert gcd(-12, 8) == 4


def test_gcd_zero():
    assert gcd(0, 7) == 7


def test_primes():
    assert [n for n in range(20) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19]


def test_prime_square():
    assert is_prime(49) is False


def test_digit_sum():
    assert digit_sum(9875) == 29


def test_digit_sum_negative():
    assert digit_sum(-406) == 10


def test_median_odd():
    assert median([5, 1, 3]) == 3


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_fib():
    assert [fib(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]


def test_fib_large():
    assert fib(30) == 832040


def test_percent_change_up():
    assert percent_change(50, 75) == 50.0


def test_percent_change_down():
    assert percent_change(80, 60) == -25.0


def test_collatz():
    assert collatz_steps(6) == 8


def test_collatz_one():
    assert collatz_steps(1) == 0


def test_collatz_long():
    assert collatz_steps(27) == 111
