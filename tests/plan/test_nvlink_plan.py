"""`lmspec plan` on a GB200 NVL72 rack (issue 42's done-when): DeepSeek-V3 on 32 hosts of 4 GPUs fills 16 of
a rack's 18 hosts per NVLink domain (64 GPUs), and the layouts it ranks first spread the experts over the
domain's hosts, their all-to-alls priced at NVLink 5's speed. The same hosts without the rack's NVLink keep
expert parallelism inside a host, where the network would carry it otherwise."""

from __future__ import annotations

import json
from collections.abc import Callable

from helpers.cli import CliResult

Lmspec = Callable[..., CliResult]
RACK = ("model=deepseek_v3", "hardware=gb200_nvl72", "hardware.nodes=32")
DOMAIN_GPUS = 64  # 16 hosts of 4: the largest divisor of 32 hosts within a rack's 18


def _top(lmspec: Lmspec, *args: str) -> list[dict]:
    result = lmspec("plan", *args, "--top", "10", "--format", "json")
    assert result.code == 0, result.err
    return json.loads(result.out)["top"]


def test_the_best_layouts_keep_expert_parallelism_inside_the_nvlink_domain_across_hosts(lmspec: Lmspec) -> None:
    top = _top(lmspec, *RACK)
    assert len(top) == 10
    for layout in top:
        ep = layout["parallel.ep"]
        assert ep <= DOMAIN_GPUS and DOMAIN_GPUS % ep == 0, layout
    assert top[0]["parallel.ep"] > 4  # the experts span the rack's hosts, not one host's 4 GPUs


def test_without_the_rack_nvlink_the_experts_stay_inside_a_host_and_the_step_is_slower(lmspec: Lmspec) -> None:
    rack = _top(lmspec, *RACK)[0]
    hosts = _top(lmspec, *RACK, "hardware.nvlink_domain=null")
    assert hosts[0]["parallel.ep"] <= 4 and hosts[0]["tokens_per_s"] < rack["tokens_per_s"]
    # expert parallelism beyond a host goes over the NICs: it costs far more than the rack's EP64 over NVLink 5
    wide = [layout for layout in hosts if layout["parallel.ep"] > 4]
    assert all(layout["terms_s"]["ep_comm"] > 10 * rack["terms_s"]["ep_comm"] for layout in wide)
    assert hosts[0]["terms_s"]["ep_comm"] > rack["terms_s"]["ep_comm"] > 0
