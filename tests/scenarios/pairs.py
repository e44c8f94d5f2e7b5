"""A scenario of a user's own, in one class: every query at once as LoadGen's Offline issues them, decoding two at a
time whatever --max-batch says. `python -m tests.scenarios.pairs run --scenario Pairs ...` is the harness's command
line with it defined."""
import sys

from scenarios.scenario import Offline


class Pairs(Offline):
    """Offline's queries and settings, two rows decoding together."""

    def rows(self, max_batch: int) -> int:
        return min(2, max_batch)


if __name__ == "__main__":
    from commands.cli import main
    sys.exit(main())
