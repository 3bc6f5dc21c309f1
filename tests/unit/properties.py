"""What the hypothesis property tests share: their settings and the control characters."""

from hypothesis import HealthCheck, settings

FAST = settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
"""Short, stable runs: no example database, a bounded number of examples per property."""

CONTROL = "".join(chr(c) for c in (*range(0x00, 0x20), 0x7F, 0x85, 0x2028, 0x2029, 0xFEFF))
"""C0 controls, DEL, NEL, the line/paragraph separators and the BOM."""
