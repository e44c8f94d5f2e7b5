"""Where `python -m mlperf serve` listens and for whom."""
import ipaddress
from dataclasses import dataclass

from mlperf.rules import positive_int
from scenarios.config import setting


def check_bind(host: str, api_key: str | None) -> None:
    """A server reachable from other machines needs a key: refuse a non-loopback bind without one."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not api_key:
        raise ValueError(f"--host {host} is reachable from other machines: give --api-key (or MLPERF_API_KEY) too")


@dataclass
class Listen:
    """Where `python -m mlperf serve` listens and for whom: its settings beside the run's, their flags made as
    RunConfig's are (commands/options.py)."""
    host: str = setting("127.0.0.1", "the address to listen on (any other needs --api-key)")
    port: int = setting(8000, "0: a free port, printed")
    api_key: str | None = setting(None, "clients must send it as a Bearer token (default: $MLPERF_API_KEY)")
    max_requests: int = setting(256, "requests in flight at most; past it 503")
    served_model_name: str | None = setting(None, "the model's name in the API (default: the SUT's)")

    def validate(self) -> None:
        check_bind(self.host, self.api_key)
        positive_int("--max-requests", self.max_requests)
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be 0-65535, got {self.port}")
