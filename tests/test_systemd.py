"""The systemd units (``gsync.service``, and the template ``gsync@.service`` that runs one
instance per shard): ``systemd-analyze verify`` passes and ``systemd-analyze security`` rates
them OK or better (SPEC §7). The directives gsync relies on are checked without systemd too.

CI needs systemd-analyze: ``apt-get update && apt-get install -y --no-install-recommends
systemd`` (Debian/Ubuntu). Without it the two systemd-analyze tests are skipped.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIT = os.path.join(ROOT, "systemd", "gsync.service")
TEMPLATE = os.path.join(ROOT, "systemd", "gsync@.service")
# The template is verified as an instance of it, the way systemd loads it.
UNITS = {UNIT: "gsync.service", TEMPLATE: "gsync@0-of-2.service"}
ANALYZE = shutil.which("systemd-analyze")
INSTALL = "apt-get update && apt-get install -y --no-install-recommends systemd"
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason=f"no systemd-analyze ({INSTALL})")

# Exposure levels as systemd-analyze names them, best first; "OK" is 1.0-4.9.
GOOD_LEVELS = ("PERFECT", "SAFE", "OK")
MAX_EXPOSURE = 1.5  # what the unit scores now (1.1) plus a little room: catch regressions


def unit_directives(unit: str = UNIT) -> dict[str, list[str]]:
    """``Section.Key`` → every value given (systemd allows repeats)."""
    values: dict[str, list[str]] = {}
    section = None
    with open(unit) as fh:
        for raw in fh:
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line.strip("[]")
                continue
            key, _, value = line.partition("=")
            values.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return values


def installable_copy(tmp_path, unit: str = UNIT) -> str:
    """The unit with ExecStart pointing at this Python and gsync, which verify needs to exist
    (its arguments kept), under the name systemd would load it by."""
    program = f"{sys.executable} -m gsync.ops.cli"
    gsync = shutil.which("gsync")
    if gsync:
        program = gsync
    with open(unit) as fh:
        text = fh.read()
    text, n = re.subn(r"^ExecStart=\S+", f"ExecStart={program}", text, flags=re.M)
    assert n == 1
    path = tmp_path / UNITS[unit]
    path.write_text(text)
    return str(path)


def test_unit_keeps_what_gsync_relies_on():
    d = unit_directives()
    expect = {
        "Service.Type": "notify",
        "Service.Restart": "on-failure",
        "Service.StateDirectory": "gsync",
        "Service.DynamicUser": "yes",
        "Service.ProtectSystem": "strict",
        "Service.NoNewPrivileges": "yes",
        "Service.TimeoutStopSec": "30",
        "Service.KillSignal": "SIGTERM",
        "Service.NotifyAccess": "main",
    }
    for key, value in expect.items():
        assert d.get(key) == [value], (key, d.get(key))
    assert int(d["Service.WatchdogSec"][0]) > 0
    assert d["Service.ExecStart"][0].split()[1:3] == ["run", "--config"]
    assert "-HUP" in d["Service.ExecReload"][0]
    # gsync's drain deadline must end before systemd's stop timeout does.
    from gsync.io.runner import DRAIN_DEADLINE_SECS

    assert DRAIN_DEADLINE_SECS < int(d["Service.TimeoutStopSec"][0])
    # Outbound TCP, sd_notify's unix socket; cffi (coincurve) may need W+X memory.
    families = set(" ".join(d["Service.RestrictAddressFamilies"]).split())
    assert {"AF_INET", "AF_INET6", "AF_UNIX"} <= families
    assert "Service.MemoryDenyWriteExecute" not in d
    assert "Service.PrivateNetwork" not in d and "Service.IPAddressDeny" not in d
    # Restarting cannot fix a config error, a refused or an unwritable state_dir: the codes
    # gsync exits with. A full disk or a busy metrics port may pass: those are restarted.
    from gsync.ops import exits

    prevented = set(d["Service.RestartPreventExitStatus"][0].split())
    assert prevented == {str(exits.EXIT_BAD_CONFIG), str(exits.EXIT_STATE_REFUSED), str(exits.EXIT_STATE_UNWRITABLE)}
    assert prevented == {str(code) for code in exits.RESTART_PREVENTED}
    assert not {str(exits.EXIT_STATE_DISK), str(exits.EXIT_METRICS_PORT_BUSY)} & prevented
    # READY=1 may wait for the own relay: gsync extends the start while it waits, by more
    # than it waits between extensions, and the unit's own timeout is a finite one.
    from gsync.io.runner import START_EXTEND_BY_SECS, START_EXTEND_EVERY_SECS

    assert START_EXTEND_EVERY_SECS < START_EXTEND_BY_SECS <= int(d["Service.TimeoutStartSec"][0])
    # One socket per relay with work, with room, at the default max_relays.
    from gsync import constants

    assert int(d["Service.LimitNOFILE"][0]) >= 4 * constants.MAX_RELAYS_TOTAL


def test_template_runs_one_shard_per_instance_and_is_otherwise_the_unit():
    unit, template = unit_directives(UNIT), unit_directives(TEMPLATE)
    assert template["Service.StateDirectory"] == ["gsync/%i"]
    exec_start = template["Service.ExecStart"][0].split()
    assert exec_start[1:] == ["run", "--config", "/etc/gsync/gsync.ini", "--shard", "%i"]
    assert "%i" in template["Unit.Description"][0]
    # Everything else (sandboxing, watchdog, stop timeout) as in gsync.service.
    differ = {"Service.StateDirectory", "Service.ExecStart", "Unit.Description"}
    assert {k: v for k, v in unit.items() if k not in differ} == \
        {k: v for k, v in template.items() if k not in differ}


def test_the_template_instance_name_is_a_shard():
    from gsync.sync.shard import Shard

    assert Shard.parse("0-of-2") == Shard(0, 2)
    assert Shard(1, 2).instance_name == "1-of-2"


@needs_analyze
@pytest.mark.parametrize("unit", [UNIT, TEMPLATE], ids=["gsync.service", "gsync@.service"])
def test_systemd_analyze_verify(tmp_path, unit):
    path = installable_copy(tmp_path, unit)
    result = subprocess.run([ANALYZE, "verify", path], capture_output=True, text=True, timeout=60)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, output
    # verify may chatter about the host's other units; nothing about ours.
    assert "gsync" not in output, output


@needs_analyze
@pytest.mark.parametrize("unit", [UNIT, TEMPLATE], ids=["gsync.service", "gsync@.service"])
def test_systemd_analyze_security_rates_it_ok_or_better(tmp_path, unit):
    path = installable_copy(tmp_path, unit)
    result = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager", path],
                            capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    name = re.escape(UNITS[unit])
    match = re.search(rf"Overall exposure level for {name}: ([\d.]+) (\w+)", output)
    assert match, output[-2000:]
    score, level = float(match.group(1)), match.group(2)
    assert level in GOOD_LEVELS, f"exposure {score} {level}\n{output}"
    assert score <= MAX_EXPOSURE, f"exposure {score} {level} (was 1.1)\n{output}"
