"""scripts/services.sh takes its servers' ports out of the kernel's ephemeral range.

The ports (55432, 56379, 56720-56722, shifted per clone) lie inside Linux's default ephemeral range
(32768-60999). While a fault test has a server stopped, an outgoing connection may be given that port as its
local one: most often a client reconnecting to the stopped server itself, since on loopback a connect to
127.0.0.1:P from local port P connects to itself. The server then cannot listen again (`make test` at 2628be4:
RabbitMQ, restarted by test_ingestion_dual, died with eaddrinuse on 56720, and 23 tests after it failed).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.processes import ROOT
from tests.support.services import service

RESERVED = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
DEFAULT_PORTS = (55432, 56379, 56720, 56721, 56722)


def _reserved() -> set[int]:
    ports: set[int] = set()
    for item in filter(None, RESERVED.read_text().strip().split(",")):
        low, _, high = item.partition("-")
        ports.update(range(int(low), int(high or low) + 1))
    return ports


def _our_ports() -> set[int]:
    offset_file = ROOT / ".state" / "port-offset"
    offset = int(offset_file.read_text().strip() or 0) if offset_file.exists() else 0
    return {port + offset for port in DEFAULT_PORTS}


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not os.access(RESERVED, os.W_OK),
                                reason="reserving ports takes root and a writable /proc/sys")


@needs_root
def test_starting_a_server_reserves_every_port_of_ours_and_keeps_the_reservations_already_there() -> None:
    # given: no port of ours reserved, and one of someone else's that must survive
    before = RESERVED.read_text().strip()
    RESERVED.write_text("40123")
    try:
        # when: a server is started (as the fault tests do after stopping one; `up` goes the same way)
        service("start", "redis")

        # then
        reserved = _reserved()
        assert _our_ports() <= reserved
        assert 40123 in reserved
    finally:
        RESERVED.write_text(before or "\n")
        service("start", "redis")  # our ports reserved again, whatever was there before the test
