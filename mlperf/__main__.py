"""`python -m mlperf COMMAND ...`: the name users type for the command line, which lives on the top floor
(commands/cli.py). An entry point only: nothing imports this module."""
import sys

from commands.cli import main

sys.exit(main())
