"""Rules that settings from any source (flags, config files, API requests, class arguments) are checked by, each
in one place so that every command and class says the same one line."""


def positive_int(name: str, value) -> int:
    """`value` if it is a positive integer (a bool is not one), else a one-line ValueError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value
