"""Number helpers."""


def clamp(x, low, high):
    """`x` limited to the range [low, high]."""
    if x < low:
        return low
    if x > high:
        return high
    return x


def gcd(a, b):
    """Greatest common divisor (non-negative)."""
    a, b = abs(a), abs(b)
    while b:
        a, b = b, a % b
    return a


def is_prime(n):
    """True for primes."""
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def digit_sum(n):
    """Sum of the decimal digits of |n|."""
    n = abs(n)
    total = 0
    while n > 0:
        total += n % 10
        n //= 10
    return total


def median(values):
    """Median of a non-empty list."""
    s = sorted(values)
    mid = len(s) // 2
    if len(s) % 2 == 1:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2


def fib(n):
    """The n-th Fibonacci number (fib(0) == 0, fib(1) == 1)."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def percent_change(old, new):
    """Change from old to new in percent, rounded to 2 decimals."""
    return round((new - old) / old * 100, 2)


def collatz_steps(n):
    """Steps of the Collatz map from n (>= 1) down to 1."""
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps
