"""INI → Config: the example file loads, and a broken file names every error (SPEC §7)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gsync.ops.config import ConfigErrors, load_config
from gsync.protocol.urls import AddressPolicy

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "conf" / "gsync.ini"
SECRET = "7f" * 32

MINIMAL = """
[service]
own_relay = ws://127.0.0.1:7000
domain = relay.example.com
"""

BROKEN = """
[service]
own_relay = http://127.0.0.1:7000
domain = https://relay.example.com/
[sync]
bootstrap_relays = wss://fine.example.com, ftp://nope.example.com
    wss://user@bad.example.com
batch_window_ms = soon
base_backoff_secs = 10
max_backoff_secs = 5
negentropy = maybe
handshake_workers = 65
retries = 3
[network]
allow_private_addresses = 127.0.0.1
max_relays = -1
[auth]
key_file = {key_file}
[metrics]
listen = 127.0.0.1
[log]
level = loud
format = xml
[extras]
x = 1
"""

BROKEN_ERRORS = [
    ("service", "own_relay", "http://127.0.0.1:7000"),
    ("service", "domain", "https://relay.example.com/"),
    ("sync", "bootstrap_relays", "ftp://nope.example.com"),
    ("sync", "bootstrap_relays", "wss://user@bad.example.com"),
    ("sync", "batch_window_ms", "soon"),
    ("sync", "max_backoff_secs", "5"),
    ("sync", "negentropy", "maybe"),
    ("sync", "handshake_workers", "65"),
    ("sync", "retries", "3"),
    ("network", "allow_private_addresses", "127.0.0.1"),
    ("network", "max_relays", "-1"),
    ("auth", "key_file", "{key_file}"),
    ("metrics", "listen", "127.0.0.1"),
    ("log", "level", "loud"),
    ("log", "format", "xml"),
    ("extras", None, None),
]


def write(tmp_path, text, name="gsync.ini"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture
def broken_file(tmp_path):
    key_file = write(tmp_path, "this is not a key but it is secret-ish\n", "bad.key")
    return write(tmp_path, BROKEN.format(key_file=key_file), "broken.ini"), key_file


def test_example_config_loads_with_the_documented_defaults():
    config = load_config(str(EXAMPLE))
    assert config.service.own_relay == "ws://127.0.0.1:8080"
    assert config.service.domains == ("relay.example.com",)
    assert config.service.state_dir == "/var/lib/gsync"
    assert config.sync.bootstrap_relays == ()
    assert (config.sync.batch_window_ms, config.sync.handshake_workers) == (5000, 8)
    assert (config.sync.base_backoff_secs, config.sync.max_backoff_secs) == (5.0, 3600.0)
    assert config.sync.negentropy is True
    assert config.network.allow_private_addresses == AddressPolicy()
    assert config.network.max_relays == 500
    assert str(config.cluster.shard) == "0/1"
    assert config.auth.key_file is None and config.auth.secret_key is None
    assert config.metrics.listen == ("127.0.0.1", 9464)
    assert (config.log.level, config.log.format) == ("info", "json")


def test_example_config_names_every_key_the_loader_knows():
    example = load_config(str(EXAMPLE)).describe()
    text = EXAMPLE.read_text()
    for line in example.splitlines():
        if "=" in line:
            key = line.split("=")[0].strip()
            assert f"\n{key} =" in text, key


def test_minimal_config_gets_the_same_defaults_as_the_example(tmp_path):
    minimal = load_config(write(tmp_path, MINIMAL))
    example = load_config(str(EXAMPLE))
    assert minimal.sync == example.sync and minimal.network == example.network
    assert minimal.metrics == example.metrics and minimal.log == example.log


def test_values_are_normalised(tmp_path):
    config = load_config(write(tmp_path, """
[service]
own_relay = WS://127.0.0.1:7000/
domain = Relay.Example.com:443, relay.example.com, other.example.com:8443
[sync]
bootstrap_relays = wss://a.example.com/ wss://A.example.com,
    wss://b.example.com:443
negentropy = off
base_backoff_secs = 0.5
[network]
allow_private_addresses = 127.0.0.1:7001, [::1]:7001, 10.0.0.0/8
[metrics]
listen =
[log]
level = DEBUG
format = console
"""))
    assert config.service.own_relay == "ws://127.0.0.1:7000"
    assert config.service.domains == ("relay.example.com", "other.example.com:8443")
    assert config.sync.bootstrap_relays == ("wss://a.example.com", "wss://b.example.com")
    assert config.sync.negentropy is False
    assert config.sync.base_backoff_secs == 0.5
    assert config.network.allow_private_addresses == AddressPolicy.parse("10.0.0.0/8, 127.0.0.1:7001, [::1]:7001")
    assert config.metrics.listen is None
    assert (config.log.level, config.log.format) == ("debug", "console")


def test_describe_is_a_config_file_that_loads_to_the_same_config(tmp_path):
    key_file = write(tmp_path, SECRET + "\n", "key")
    original = load_config(write(tmp_path, MINIMAL + f"[auth]\nkey_file = {key_file}\n"
                                 "[network]\nallow_private_addresses = [::1]:7001, 10.0.0.0/8\n"))
    again = write(tmp_path, original.describe(), "again.ini")
    reloaded = load_config(again)
    assert reloaded == type(original)(**{**original.__dict__, "path": again})


def test_broken_file_names_every_error_with_file_section_key_and_value(broken_file):
    path, key_file = broken_file
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    errors = caught.value.errors
    expected = [(s, k, v.format(key_file=key_file) if v else v) for s, k, v in BROKEN_ERRORS]
    assert [(e.section, e.key, e.value) for e in errors] == expected
    assert all(e.file == path and e.message for e in errors)
    assert str(errors[0]) == f"{path}: [service] own_relay = 'http://127.0.0.1:7000': " + errors[0].message


def test_missing_required_keys_are_errors(tmp_path):
    with pytest.raises(ConfigErrors) as caught:
        load_config(write(tmp_path, "[log]\nlevel = info\n"))
    assert [(e.section, e.key, e.message) for e in caught.value.errors] == [
        ("service", "own_relay", "missing required key"),
        ("service", "domain", "missing required key"),
    ]


@pytest.mark.parametrize("text, fragment", [
    ("own_relay = ws://x\n", "not a valid INI file"),  # no section header
    ("[service]\nown_relay = ws://a\nown_relay = ws://b\n", "not a valid INI file"),
])
def test_unparseable_files_are_reported(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(ConfigErrors, match=fragment) as caught:
        load_config(path)
    assert caught.value.errors[0].file == path


def test_unreadable_file_is_reported(tmp_path):
    path = str(tmp_path / "absent.ini")
    with pytest.raises(ConfigErrors, match="cannot read file") as caught:
        load_config(path)
    assert caught.value.errors[0].file == path


def test_default_section_is_not_silently_inherited(tmp_path):
    with pytest.raises(ConfigErrors, match=r"\[DEFAULT\]: unknown section"):
        load_config(write(tmp_path, MINIMAL + "[DEFAULT]\nlevel = debug\n"))


def test_secret_key_is_loaded_but_never_shown(tmp_path):
    key_file = write(tmp_path, SECRET.upper() + "\n", "key")
    config = load_config(write(tmp_path, MINIMAL + f"[auth]\nkey_file = {key_file}\n"))
    assert config.auth.secret_key == SECRET
    assert config.auth.key_file == key_file
    for shown in (repr(config), str(config), config.describe(), repr(config.auth)):
        assert SECRET not in shown.lower()


@pytest.mark.parametrize("content", [
    "7f" * 31,  # too short
    "zz" * 32,  # not hex
    "00" * 32,  # zero is not a secret key
    "ff" * 32,  # above the curve order
    "nsec1notsupported",
    SECRET + "\n" + SECRET,  # two keys
])
def test_bad_key_files_are_errors_that_do_not_print_the_file(tmp_path, content):
    key_file = write(tmp_path, content, "key")
    with pytest.raises(ConfigErrors) as caught:
        load_config(write(tmp_path, MINIMAL + f"[auth]\nkey_file = {key_file}\n"))
    [error] = caught.value.errors
    assert (error.section, error.key, error.value) == ("auth", "key_file", key_file)
    assert content not in str(caught.value)


# -- the command line ------------------------------------------------------------------


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "gsync.ops.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=30)


def test_check_config_prints_the_effective_config_and_exits_0():
    result = run_cli("check-config", "--config", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert result.stdout == load_config(str(EXAMPLE)).describe()


def test_check_config_lists_every_error_and_exits_2(broken_file):
    path, key_file = broken_file
    result = run_cli("check-config", "--config", path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == len(BROKEN_ERRORS)
    for line, (section, key, value) in zip(lines, BROKEN_ERRORS, strict=False):
        where = f"[{section}] {key} = {value.format(key_file=key_file)!r}: " if key else f"[{section}]: "
        assert line.startswith(f"{path}: {where}"), line
    assert result.stdout == ""
    assert "secret-ish" not in result.stderr


def test_run_with_a_broken_config_exits_2_before_starting(broken_file):
    result = run_cli("run", "--config", broken_file[0])
    assert result.returncode == 2
    assert result.stderr.count(broken_file[0]) == len(BROKEN_ERRORS)


def test_unknown_arguments_are_usage_errors():
    assert run_cli("check-config", "--config", str(EXAMPLE), "extra").returncode == 2
    assert run_cli().returncode == 2


def ini(sections: dict[str, dict[str, str]]) -> str:
    return "".join(
        f"[{name}]\n" + "".join(f"{key} = {value}\n" for key, value in keys.items())
        for name, keys in sections.items()
    )


@pytest.mark.parametrize("section, key, value, message", [
    ("service", "state_dir", "", "must not be empty"),
    ("service", "domain", ",", "at least one"),
    ("sync", "base_backoff_secs", "soon", "not a number"),
    ("sync", "base_backoff_secs", "0", "positive"),
    ("sync", "max_backoff_secs", "inf", "positive"),
    ("sync", "batch_window_ms", "1.5", "whole number"),
    ("network", "allow_private_addresses", "10.0.0.0/33", "bad CIDR"),
    ("metrics", "listen", "127.0.0.1:70000", "out of range"),
    ("cluster", "shard", "2/2", "0 <= i < N"),
    ("cluster", "shard", "half", "must be i/N"),
    ("auth", "key_file", "/nonexistent/gsync.key", "cannot read key file"),
])
def test_each_bad_value_is_named(tmp_path, section, key, value, message):
    sections = {"service": {"own_relay": "ws://127.0.0.1:7000", "domain": "relay.example.com"}}
    sections.setdefault(section, {})[key] = value
    with pytest.raises(ConfigErrors) as caught:
        load_config(write(tmp_path, ini(sections)))
    [error] = caught.value.errors
    assert (error.section, error.key, error.value) == (section, key, value)
    assert message in error.message


def test_check_config_in_process(capsys, broken_file):
    from gsync.ops.cli import main

    assert main(["check-config", "--config", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out == load_config(str(EXAMPLE)).describe()
    assert main(["check-config", "--config", broken_file[0]]) == 2
    assert len(capsys.readouterr().err.splitlines()) == len(BROKEN_ERRORS)
