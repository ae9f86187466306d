"""Settings of `pora serve`: precedence, node options, and precise errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pora.server.settings import (
    SETTINGS,
    Address,
    SettingsError,
    check_node_option_flags,
    load_settings,
    parse_address,
    parse_bytes,
)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults_when_nothing_is_given() -> None:
    settings = load_settings({}, environ={})
    assert settings.data_dir == Path("./pora-data")
    assert settings.listen == Address("127.0.0.1", 3181)
    assert settings.metrics_listen is None
    assert settings.node_options == {}
    assert settings.gc_young_threshold == 50_000
    assert all(source == "default" for source in settings.sources.values())


def test_flags_beat_environment_beat_file_beat_defaults(tmp_path: Path) -> None:
    config = _write(
        tmp_path / "pora.toml",
        'data_dir = "/from/file"\nlisten = "127.0.0.1:1001"\nlog_format = "logfmt"\n'
        'metrics_listen = "127.0.0.1:9999"\n',
    )
    environ = {"PORA_LISTEN": "127.0.0.1:2002", "PORA_DATA_DIR": "/from/env"}
    flags = {"data_dir": "/from/flag"}
    settings = load_settings(flags, environ=environ, config_path=config)
    assert settings.data_dir == Path("/from/flag")  # flag > env > file
    assert settings.listen == Address("127.0.0.1", 2002)  # env > file
    assert settings.log_format == "logfmt"  # file > default
    assert settings.metrics_listen == Address("127.0.0.1", 9999)
    assert settings.log_level == "info"  # default
    assert settings.sources["data_dir"] == "flag --data-dir"
    assert settings.sources["listen"] == "environment variable PORA_LISTEN"


def test_gc_threshold_from_the_environment() -> None:
    settings = load_settings({}, environ={"PORA_GC_YOUNG_THRESHOLD": "0"})
    assert settings.gc_young_threshold == 0  # the cyclic collector off


def test_config_file_named_by_environment(tmp_path: Path) -> None:
    config = _write(tmp_path / "pora.toml", "drain_timeout_s = 3\n")
    settings = load_settings({}, environ={"PORA_CONFIG": str(config)})
    assert settings.drain_timeout_s == 3.0


def test_node_options_from_file_env_and_flags(tmp_path: Path) -> None:
    config = _write(
        tmp_path / "pora.toml",
        '[node]\ngroup_wait_ms_max = 2.5\nmemtable_flush_bytes = "8MiB"\nfsync = true\n'
        "trim_interval_ms = 500\n",
    )
    settings = load_settings(
        {},
        environ={"PORA_NODE_TRIM_INTERVAL_MS": "700"},
        config_path=config,
        node_option_flags=["group_wait_ms_max=0.5"],
    )
    assert settings.node_options == {
        "group_wait_ms_max": 0.5,
        "memtable_flush_bytes": 8 << 20,
        "fsync": True,
        "trim_interval_ms": 700.0,
    }


def test_sizes_and_addresses_parse() -> None:
    assert parse_bytes("512MiB") == 512 << 20
    assert parse_bytes("2 GB") == 2_000_000_000
    assert parse_bytes(4096) == 4096
    assert parse_address("[::1]:3181") == Address("::1", 3181)
    assert str(Address("::1", 3181)) == "[::1]:3181"
    settings = load_settings({"read_only_free_bytes_min": "1GiB", "metrics_listen": "off"}, {})
    assert settings.read_only_free_bytes_min == 1 << 30
    assert settings.metrics_listen is None


@pytest.mark.parametrize(
    ("flags", "environ", "expected"),
    [
        ({"listen": "localhost"}, {}, "listen in flag --listen: expected HOST:PORT"),
        ({"listen": "127.0.0.1:99999"}, {}, "not in 0..65535"),
        ({}, {"PORA_LOG_FORMAT": "xml"}, "PORA_LOG_FORMAT: expected one of json, logfmt"),
        ({"read_only_free_bytes_min": "12 parsecs"}, {}, "expected a byte count"),
        ({"drain_timeout_s": "soon"}, {}, "drain_timeout_s in flag --drain-timeout-s"),
        ({"disk_check_interval_ms": "0"}, {}, "disk_check_interval_ms must be > 0"),
        ({}, {"PORA_GC_YOUNG_THRESHOLD": "-1"}, "gc_young_threshold must be >= 0"),
        ({}, {"PORA_GC_YOUNG_THRESHOLD": "lots"}, "in environment variable PORA_GC_YOUNG"),
        ({}, {"PORA_NODE_GROUP_WAIT_MS": "1"}, "unknown node option 'group_wait_ms'"),
        ({}, {"PORA_NODE_FSYNC": "maybe"}, "node option fsync in environment variable"),
        ({}, {"PORA_NODE_GROUP_WAIT_MS_MAX": "-1"}, "group_wait_ms_max must be >= 0"),
        # nan passes every range check: refused where it is given, not at SIGTERM
        (
            {"drain_timeout_s": "nan"},
            {},
            "drain_timeout_s in flag --drain-timeout-s: expected a finite number, got 'nan'",
        ),
        ({"drain_timeout_s": "inf"}, {}, "expected a finite number, got 'inf'"),
        ({"drain_timeout_s": "-1"}, {}, "drain_timeout_s must be a finite number of seconds >= 0"),
        ({"disk_check_interval_ms": "nan"}, {}, "expected a finite number"),
        ({}, {"PORA_NODE_GROUP_WAIT_MS_MAX": "nan"}, "expected a finite number"),
    ],
)
def test_bad_values_name_the_setting_and_where_it_came_from(
    flags: dict[str, str], environ: dict[str, str], expected: str
) -> None:
    with pytest.raises(SettingsError, match=expected.replace("(", r"\(")):
        load_settings(flags, environ=environ)


def test_a_removed_node_option_is_refused_by_name(tmp_path: Path) -> None:
    # sync_with_io_uring was removed (docs/performance.md): a config naming it is refused
    old = _write(tmp_path / "old.toml", "[node]\nsync_with_io_uring = true\n")
    with pytest.raises(SettingsError, match="unknown node option 'sync_with_io_uring' in config"):
        load_settings({}, environ={}, config_path=old)
    flag = ["sync_with_io_uring=false"]
    with pytest.raises(SettingsError, match="unknown node option 'sync_with_io_uring' in --node"):
        load_settings({}, environ={}, node_option_flags=flag)
    with pytest.raises(SettingsError, match="unknown node option 'sync_with_io_uring' in --node"):
        check_node_option_flags(flag)  # what `pora bench` checks before starting a node
    with pytest.raises(SettingsError, match="group_wait_ms_max must be >= 0"):
        check_node_option_flags(["group_wait_ms_max=-1"])
    check_node_option_flags(["group_wait_ms_max=2"])


def test_bad_config_files(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings({}, environ={}, config_path=tmp_path / "missing.toml")
    broken = _write(tmp_path / "broken.toml", "listen = \n")
    with pytest.raises(SettingsError, match="is not valid TOML"):
        load_settings({}, environ={}, config_path=broken)
    typo = _write(tmp_path / "typo.toml", "listn = '127.0.0.1:1'\n")
    with pytest.raises(SettingsError, match="unknown setting 'listn' in config file"):
        load_settings({}, environ={}, config_path=typo)
    wrong_type = _write(tmp_path / "type.toml", "listen = 3181\n")
    with pytest.raises(SettingsError, match=r"type.toml key listen: expected a string"):
        load_settings({}, environ={}, config_path=wrong_type)
    with pytest.raises(SettingsError, match="expects NAME=VALUE"):
        load_settings({}, environ={}, node_option_flags=["group_wait_ms_max"])


def test_every_setting_is_documented() -> None:
    docs = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    for setting in SETTINGS:
        assert f"`{setting.flag}`" in docs, setting.name
        assert f"`{setting.env}`" in docs, setting.name


def test_server_options_reach_the_server_config(tmp_path: Path) -> None:
    config = _write(
        tmp_path / "pora.toml",
        '[server]\nconnections_max = 10\ntls_cert_file = "c.pem"\ntls_key_file = "k.pem"\n',
    )
    settings = load_settings(
        {},
        environ={"PORA_SERVER_IDLE_TIMEOUT_S": "5"},
        config_path=config,
        server_option_flags=["inflight_per_connection_max=128"],
    )
    assert settings.server_options == {
        "connections_max": 10,
        "tls_cert_file": "c.pem",
        "tls_key_file": "k.pem",
        "idle_timeout_s": 5.0,
        "inflight_per_connection_max": 128,
    }
    with pytest.raises(SettingsError, match="unknown server option 'port'"):
        load_settings({}, environ={}, server_option_flags=["port=1"])  # that is --listen


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["connections_max=0"], "connections_max from --server-option connections_max=0"),
        (["connections_max=0"], "connections_max must be at least 1"),
        (["idle_timeout_s=0"], "idle_timeout_s must be positive"),
        (["tls_cert_file=c.pem"], "TLS needs both tls_cert_file and tls_key_file"),
    ],
)
def test_server_options_the_server_would_refuse_are_refused_at_load(
    flags: list[str], expected: str
) -> None:
    with pytest.raises(SettingsError, match=expected):
        load_settings({}, environ={}, server_option_flags=flags)
