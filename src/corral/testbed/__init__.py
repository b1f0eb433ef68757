"""A simulated multi-host cluster on one Linux machine (root): network namespaces on a
bridge, each host with its own hostname, ``/etc/hosts``, ``/srv``, ``/tmp``, home and
OpenSSH sshd; the rest of the filesystem (the Python environment included) is shared.

>>> tb = Testbed("/tmp/tb")          # doctest: +SKIP
>>> tb.up(3)                         # hosts tb1..tb3 at 10.77.0.1..3  # doctest: +SKIP
>>> tb.run_on("tb2", ["hostname"]).stdout  # doctest: +SKIP
'tb2\\n'
>>> tb.down()                        # doctest: +SKIP
"""

from __future__ import annotations

from corral.testbed._cgroup import CpuQuota
from corral.testbed._model import DEFAULT_SUBNET, MAX_INSTANCES, SRV_DIR, default_subnet
from corral.testbed._registry import exclusive
from corral.testbed._report import DownResult, HostStatus, TestbedHost, TestbedStatus, UpResult
from corral.testbed._system import check_requirements, missing_requirements
from corral.testbed._testbed import Testbed, default_state_dir

__all__ = [
    "DEFAULT_SUBNET",
    "MAX_INSTANCES",
    "SRV_DIR",
    "CpuQuota",
    "DownResult",
    "HostStatus",
    "Testbed",
    "TestbedHost",
    "TestbedStatus",
    "UpResult",
    "check_requirements",
    "default_state_dir",
    "default_subnet",
    "exclusive",
    "missing_requirements",
]
