"""The URL a served engine answers at: what serve.sh prints, REPORT.md lists and the serve stage polls.

Its own module, pure, so the emitters (compiler/emit/serve.py) and the runtime (runtime/serve/) share one
spelling without the runtime importing an emitter (compiler/contract.py); and whether other machines reach it,
which the serving rules and the Kubernetes launcher's (a Service in front of a pod) both ask.
"""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = ("localhost",)


def endpoint(host: str, port: int, path: str = "/v1") -> str:
    """The server's base URL (or another of its paths, /health); an IPv6 address is bracketed, as URLs need."""
    try:
        bracketed = ipaddress.ip_address(host).version == 6
    except ValueError:
        bracketed = False
    return f"http://{f'[{host}]' if bracketed else host}:{port}{path}"


def loopback(host: str) -> bool:
    """Whether clients on other nodes cannot reach `host`: a loopback name or address."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
