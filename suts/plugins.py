"""Loading what a `package.module:Name` names: a SUT plug-in's class (suts/registry.py), a drafter (suts/ngram.py)."""
import importlib


def plugin(spec: str, what: str):
    """What `package.module:Name` names, or a one-line ValueError saying `what` it was to be."""
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load {what} {spec!r}: {e}") from None
