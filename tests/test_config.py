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


def test_one_file_serves_every_shard_with_its_own_state_and_metrics_port(tmp_path):
    """``--shard i-of-N`` (the template unit ``gsync@i-of-N``): shard i of N, state in
    state_dir/i-of-N, metrics on the file's port + i; ``--metrics-listen`` wins."""
    path = tmp_path / "gsync.ini"
    path.write_text(MINIMAL + "[cluster]\nshard = 0/3\n[metrics]\nlisten = 127.0.0.1:9464\n")
    result = run_cli("check-config", "--config", str(path), "--shard", "1-of-2")
    assert result.returncode == 0, result.stderr
    assert "shard = 1/2\n" in result.stdout
    assert "state_dir = /var/lib/gsync/1-of-2\n" in result.stdout
    assert "listen = 127.0.0.1:9465\n" in result.stdout
    result = run_cli("check-config", "--config", str(path), "--shard", "1-of-2",
                     "--metrics-listen", "0.0.0.0:9464")
    assert "listen = 0.0.0.0:9464\n" in result.stdout and "shard = 1/2\n" in result.stdout
    result = run_cli("check-config", "--config", str(path), "--shard", "2-of-2")
    assert result.returncode == 2 and "0 <= i < N" in result.stderr
    # the flag named, in the form the command line takes (not the INI's i/N)
    assert result.stderr.startswith("command line: --shard 2-of-2: must be i-of-N "), result.stderr
    assert "0-of-2 and 1-of-2" in result.stderr and "i/N" not in result.stderr
    result = run_cli("check-config", "--config", str(path), "--shard", "half")
    assert result.stderr.startswith("command line: --shard half: must be i-of-N, e.g. 0-of-2")


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


# -- fuzzing: any INI text is a clear error or a config, never a traceback ------------------

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gsync.ops.config import _SCHEMA, Config  # noqa: E402

_KEYS = sorted({k for keys in _SCHEMA.values() for k in keys}) + ["retries", "DEFAULT", ""]
_VALUES = [
    "", "0", "-1", "1e309", "nan", "inf", "1" * 5000, "true", "maybe", "ws://127.0.0.1:7000",
    "wss://relay.example.com/", "http://x", "ws://user@host", "ws://[::1", "relay.example.com:99999",
    "127.0.0.1/33", "10.0.0.0/8, 127.0.0.1:7000", "::1", "[::1]:9464", "%(x)s", "%", "debug",
    "console", "/nonexistent/key", "/", "a\0b", "\ud800", "é", "ws://ex\u0430mple.com",
]


def _check(path: str) -> None:
    """The loader's whole contract: a Config, or ConfigErrors whose every line names the file."""
    try:
        config = load_config(path)
    except ConfigErrors as exc:
        assert exc.errors, "ConfigErrors without an error"
        for line in str(exc).splitlines():
            assert line.startswith(f"{path}: "), line
    else:
        assert isinstance(config, Config)


def _write(tmp_path_factory, data: bytes) -> str:
    path = tmp_path_factory.mktemp("fuzz") / "gsync.ini"
    path.write_bytes(data)
    return str(path)


_lines = st.one_of(
    st.builds(lambda s: f"[{s}]", st.sampled_from([*_SCHEMA, "DEFAULT", "nope", "", " service"]) | st.text(max_size=12)),
    st.builds(lambda k, sep, v: f"{k}{sep}{v}", st.sampled_from(_KEYS) | st.text(max_size=12),
              st.sampled_from([" = ", "=", ": ", " "]), st.sampled_from(_VALUES) | st.text(max_size=40)),
    st.builds(lambda v: f"    {v}", st.sampled_from(_VALUES) | st.text(max_size=20)),  # continuation
    st.sampled_from(["# comment", "; comment", "", "[service]\nown_relay = ws://127.0.0.1:7000\ndomain = a.example"]),
)


_value = st.one_of(st.sampled_from(_VALUES), st.sampled_from(_VALUES), st.text(max_size=40))


def _pairs(section: str):
    """Mostly the section's own keys (so each parser is reached), sometimes any key."""
    key = st.one_of(st.sampled_from(list(_SCHEMA[section])), st.sampled_from(list(_SCHEMA[section])),
                    st.sampled_from(_KEYS))
    return st.lists(st.tuples(key, _value), max_size=5)


_sections = st.lists(st.sampled_from(list(_SCHEMA)), unique=True).flatmap(
    lambda names: st.fixed_dictionaries({name: _pairs(name) for name in names})
)


def _ini(sections: dict, own_relay: bool, domain: bool) -> str:
    """A file of schema sections, with the required keys present or not."""
    sections = {name: list(pairs) for name, pairs in sections.items()}
    service = sections.setdefault("service", [])
    if own_relay:
        service.insert(0, ("own_relay", "ws://127.0.0.1:7000"))
    if domain:
        service.insert(0, ("domain", "relay.example.com"))
    out = []
    for name, pairs in sections.items():
        out.append(f"[{name}]")
        keys = set()
        for key, value in pairs:
            if key in keys:
                continue  # a repeated key is its own (tested) error: let the rest be reached
            keys.add(key)
            out.append(f"{key} = {value}")
    return "\n".join(out)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_lines, max_size=25))
def test_any_ini_shaped_text_loads_or_names_its_errors(tmp_path_factory, lines):
    text = "\n".join(lines)
    _check(_write(tmp_path_factory, text.encode("utf-8", "surrogatepass")))


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_sections, st.booleans(), st.booleans())
# What the search found once, kept so that it is always tried:
@example({"auth": [("key_file", "a\0b")]}, True, True)  # NUL in a path: ValueError, not OSError
@example({"auth": [("key_file", "/")]}, True, True)  # a directory
@example({"log": [("level", "\x1e")]}, True, False)  # a line break inside a value
def test_any_values_under_the_known_keys_load_or_name_their_errors(tmp_path_factory, sections,
                                                                   own_relay, domain):
    text = _ini(sections, own_relay, domain)
    _check(_write(tmp_path_factory, text.encode("utf-8", "surrogatepass")))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400) | st.text(max_size=400).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_bytes_at_all_load_or_name_their_errors(tmp_path_factory, data):
    _check(_write(tmp_path_factory, data))


def test_the_auth_key_comes_from_systemd_credentials(tmp_path, monkeypatch):
    """LoadCredential=gsync-auth-key:… in the unit, key_file = $CREDENTIALS_DIRECTORY/… here."""
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "gsync-auth-key").write_text(SECRET + "\n")
    path = write(tmp_path, MINIMAL + "[auth]\nkey_file = $CREDENTIALS_DIRECTORY/gsync-auth-key\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    assert load_config(path).auth.secret_key == SECRET
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigErrors) as exc:
        load_config(path)
    assert [(e.section, e.key) for e in exc.value.errors] == [("auth", "key_file")]
    assert "CREDENTIALS_DIRECTORY is not set" in str(exc.value.errors[0])


def test_changed_keys_tell_what_a_reload_applies_and_what_waits_for_a_restart(tmp_path):
    from gsync.ops.config import RELOADABLE_KEYS, changed_keys

    before = load_config(write(tmp_path, MINIMAL))
    after = load_config(write(tmp_path, MINIMAL + "[log]\nlevel = debug\n[network]\nmax_relays = 7\n", "b.ini"))
    changed = changed_keys(before, after)
    assert sorted(changed) == ["log.level", "network.max_relays"]
    assert [k for k in changed if k not in RELOADABLE_KEYS] == ["network.max_relays"]
