"""The labs' name for suts/engine/scheduler.py, kept so that course handouts and students' code written against it
keep working."""
from suts.engine.scheduler import Result, Scheduler, Sequence

__all__ = ["Result", "Scheduler", "Sequence"]
