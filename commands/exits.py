"""What a command's exit status says (docs/running.md, "Exit codes"), and the verdicts that set it."""
VERDICT_FAILED = 1  # the run completed and its verdict failed: GATE FAIL, INVALID, an accuracy or TEST06 FAIL
BAD_INPUT = 2  # bad input or a crash: no verdict was reached (argparse's own exit for a bad flag too)


class VerdictFailed(RuntimeError):
    """A run completed and its verdict is a failure (INVALID); the message is the verdict's one line."""


class GateFailed(VerdictFailed):
    """A gate's verdict: accuracy, compliance or the smoke gate failed."""
