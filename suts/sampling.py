"""The labs' name for suts/engine/sampling.py, kept so that course handouts and students' code written against it
keep working."""
from suts.engine.sampling import SamplingParams, probs, sample, sample_rows

__all__ = ["SamplingParams", "probs", "sample", "sample_rows"]
