"""The URL a served engine answers at: what serve.sh prints, REPORT.md lists and the serve stage polls.

Its own module, pure, so the emitters (compiler/emit/serve.py) and the runtime (runtime/serve/) share one
spelling without the runtime importing an emitter (compiler/contract.py).
"""

from __future__ import annotations

import ipaddress


def endpoint(host: str, port: int, path: str = "/v1") -> str:
    """The server's base URL (or another of its paths, /health); an IPv6 address is bracketed, as URLs need."""
    try:
        bracketed = ipaddress.ip_address(host).version == 6
    except ValueError:
        bracketed = False
    return f"http://{f'[{host}]' if bracketed else host}:{port}{path}"
