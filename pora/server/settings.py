"""Settings of `pora serve`: defaults < TOML config file < environment < flags.

Every daemon setting is declared once, in `SETTINGS`, with its type, default,
environment variable and help text; `--help`, `docs/configuration.md` and the
loader all read that table, so they cannot drift apart.

Node options (the knobs of `pora.NodeConfig`, see `pora.config`) and network
server options (`pora.server.ServerConfig`) come from the `[node]` and
`[server]` tables of the file, from `PORA_NODE_<NAME>` / `PORA_SERVER_<NAME>`
variables, and from repeated `--node-option NAME=VALUE` / `--server-option
NAME=VALUE` flags, with the same precedence.

A bad value raises `SettingsError` naming the setting, where it came from
(flag, variable or file and key), what was wrong and what is accepted.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from journal.task import GroupCommitConfig
from ledger.storage import LedgerConfig
from pora.meta.backends import check_metadata_url
from pora.meta.errors import MetadataUnavailable
from pora.node.config import NodeConfig
from pora.server.gc_tuning import GC_YOUNG_THRESHOLD_DEFAULT

LogFormat = Literal["json", "logfmt"]
LOG_FORMATS: Final = ("json", "logfmt")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")

DEFAULT_LISTEN: Final = "127.0.0.1:3181"
DEFAULT_METRICS_LISTEN_HINT: Final = "127.0.0.1:9181"
DEFAULT_REGISTRATION_LEASE_S: Final = 5.0
METADATA_URL_SCHEMES: Final = ("sqlite:", "zk://")

_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1 << 40,
}


class SettingsError(ValueError):
    """A setting has a bad value, or the config file cannot be used."""


@dataclass(frozen=True, slots=True)
class Address:
    """A `host:port` to listen on."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str) -> Address:
    """Parse `host:port` (`[v6]:port` for IPv6); the port may be 0 (any free one)."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
    else:
        host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT (like {DEFAULT_LISTEN}), got {text!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"the port of {text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"the port of {text!r} is not in 0..65535")
    return Address(host, port)


def parse_bytes(value: object) -> int:
    """A byte count: an integer, or a string like `512MiB`, `2 GB`, `4096`."""
    if isinstance(value, bool):
        raise TypeError(f"expected a byte count, got {value!r}")
    if isinstance(value, int):
        result = value
    elif isinstance(value, str):
        text = value.strip().replace("_", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ")
        unit = text[len(digits) :].strip().lower()
        if unit not in _UNITS or not digits:
            raise ValueError(
                f"expected a byte count like 4096, 512MiB or 2GB, got {value!r} "
                f"(units: {', '.join(u for u in _UNITS if u)})"
            )
        try:
            number = float(digits)
        except ValueError:
            raise ValueError(f"expected a byte count like 4096 or 512MiB, got {value!r}") from None
        result = int(number * _UNITS[unit])
    else:
        raise TypeError(f"expected a byte count, got {value!r}")
    if result < 0:
        raise ValueError(f"a byte count must be >= 0, got {value!r}")
    return result


def _parse_float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"expected a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        # nan compares false with every bound, so it would pass the range checks and
        # fail much later (a drain timeout at SIGTERM); no setting means "forever"
        raise ValueError(f"expected a finite number, got {value!r}")
    return number


def _parse_int(value: object) -> int:
    if isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip().replace("_", ""))
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {value!r}")


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
    raise ValueError(f"expected true or false, got {value!r}")


def _parse_str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


#: what turns an optional setting off; an empty value is refused (an unset shell
#: variable in `--metadata "$URL"` must not start a node standalone without a word)
_OFF: Final = ("off", "none")


def _parse_optional_address(value: object) -> Address | None:
    text = _parse_str(value).strip()
    if not text:
        raise ValueError("expected HOST:PORT, or off, got an empty value")
    if text.lower() in _OFF:
        return None
    return parse_address(text)


def _parse_optional_url(value: object) -> str | None:
    text = _parse_str(value).strip()
    if not text:
        raise ValueError("expected a metadata store URL, or off, got an empty value")
    if text.lower() in _OFF:
        return None
    if not text.startswith(METADATA_URL_SCHEMES):
        raise ValueError(
            f"expected a metadata store URL starting with {' or '.join(METADATA_URL_SCHEMES)} "
            f"(like sqlite:///var/lib/pora/meta.db), got {text!r}"
        )
    try:
        check_metadata_url(text)
    except MetadataUnavailable as error:
        raise ValueError(f"{error.reason} ({error.hint})") from None
    return text


def _parse_path(value: object) -> Path:
    text = _parse_str(value)
    if not text.strip():
        # Path("") is the current directory: a node would make its data dir wherever
        # it was started
        raise ValueError("expected a directory, got an empty value")
    return Path(text)


def _parse_optional_label(value: object) -> str | None:
    text = _parse_str(value).strip()
    if not text:
        # an unset shell variable (`--rack "$RACK"`) would otherwise register no rack
        # and place replicas as if the node were anywhere
        raise ValueError("expected a non-empty label (leave the setting out for none)")
    return text


def _parse_choice(choices: Sequence[str]) -> Any:
    def parse(value: object) -> str:
        text = _parse_str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return text

    return parse


@dataclass(frozen=True, slots=True)
class Setting:
    """One daemon setting: its name (TOML key), flag, variable, parser and help."""

    name: str
    default: Any
    parse: Any
    help: str
    metavar: str
    #: how the default reads in help and docs
    default_text: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "PORA_" + self.name.upper()


SETTINGS: Final[tuple[Setting, ...]] = (
    Setting("data_dir", Path("./pora-data"), _parse_path,
            "directory holding the node's journal, entry logs and index", "DIR", "./pora-data"),
    Setting("listen", parse_address(DEFAULT_LISTEN), lambda v: parse_address(_parse_str(v)),
            "HOST:PORT the node serves the Pora protocol on (port 0: any free port)",
            "HOST:PORT", DEFAULT_LISTEN),
    Setting("metrics_listen", None, _parse_optional_address,
            "HOST:PORT of the HTTP endpoint serving /metrics (Prometheus) and /health; "
            f"off by default (for example {DEFAULT_METRICS_LISTEN_HINT}; 'off' disables)",
            "HOST:PORT", "off"),
    Setting("log_format", "json", _parse_choice(LOG_FORMATS),
            "log lines as one JSON object each (json) or as key=value pairs (logfmt)",
            "|".join(LOG_FORMATS), "json"),
    Setting("log_level", "info", _parse_choice(LOG_LEVELS),
            "least severe level logged (debug, info, warning, error)", "|".join(LOG_LEVELS),
            "info"),
    Setting("drain_timeout_s", 10.0, _parse_float,
            "on SIGINT/SIGTERM, how long in-flight requests may take to finish", "SECONDS", "10"),
    Setting("disk_check_interval_ms", 1000.0, _parse_float,
            "how often free space is checked (of the data dir's filesystem, and of journal/, "
            "ledgers/ or index/ where one is mounted elsewhere)", "MS", "1000"),
    Setting("read_only_free_bytes_min", 512 << 20, parse_bytes,
            "below this much free space the node turns read-only (adds, fences and "
            "closes fail with read-only; reads go on)", "BYTES", "512MiB"),
    Setting("read_only_free_percent_min", 0.0, _parse_float,
            "also turn read-only below this percentage of the filesystem free (0: off)",
            "PERCENT", "0"),
    Setting("read_only_hysteresis_bytes", 256 << 20, parse_bytes,
            "a read-only node takes writes again once free space is this much above "
            "the threshold", "BYTES", "256MiB"),
    Setting("metadata", None, _parse_optional_url,
            "URL of the cluster's metadata store to register the node in (sqlite:///abs/"
            "meta.db, zk://host:port/chroot); off: the node runs standalone", "URL", "off"),
    Setting("advertise", None, _parse_optional_address,
            "HOST:PORT registered in the metadata store, where clients reach the node "
            "(default: the address --listen bound; required when that is a wildcard "
            "like 0.0.0.0)", "HOST:PORT", "the bound --listen address"),
    Setting("registration_lease_s", DEFAULT_REGISTRATION_LEASE_S, _parse_float,
            "how long the node's registration lives unless renewed (renewed every third "
            "of it); a node killed without a stop is listed this long", "SECONDS",
            f"{DEFAULT_REGISTRATION_LEASE_S:g}"),
    Setting("rack", None, _parse_optional_label,
            "rack (or zone) label registered with the node, for placing replicas apart",
            "LABEL", "none"),
    Setting("ledger_gc_interval_s", 600.0, _parse_float,
            "with --metadata: seconds between two passes of the node's ledger garbage "
            "collection (deleting the ledgers the metadata store no longer knows)",
            "SECONDS", "600"),
    Setting("ledger_gc_deletions_per_s", 20.0, _parse_float,
            "ledger garbage collection: deletions a second at most", "COUNT", "20"),
    Setting("ledger_gc_grace_s", 3600.0, _parse_float,
            "ledger garbage collection: a ledger created on this node less than this long "
            "ago is never collected", "SECONDS", "3600"),
    Setting("gc_young_threshold", GC_YOUNG_THRESHOLD_DEFAULT, _parse_int,
            "container allocations between collections of Python's youngest garbage "
            "collector generation (Python's own default: 700; 0 turns the cyclic "
            "collector off)", "COUNT", f"{GC_YOUNG_THRESHOLD_DEFAULT}"),
)  # fmt: skip

SETTINGS_BY_NAME: Final = {s.name: s for s in SETTINGS}


def node_option_types() -> dict[str, type]:
    """Every node option `open_node` accepts, with the type of its default."""
    types: dict[str, type] = {}
    for record in (NodeConfig, GroupCommitConfig, LedgerConfig):
        for f in dataclasses.fields(record):
            if f.name in ("journal", "ledger") or f.name in types:
                continue  # fsync is in both records: one option sets both
            types[f.name] = type(f.default)
    return types


def server_option_types() -> dict[str, type]:
    """Every option of the network server's `ServerConfig`, with its type."""
    from pora.server.config import ServerConfig  # noqa: PLC0415 (loaded only when used)

    types: dict[str, type] = {}
    for f in dataclasses.fields(ServerConfig):
        if f.name in ("host", "port"):
            continue  # from `listen`
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = ""
        types[f.name] = str if default is None else type(default)
    return types


def _parse_typed(kind: type, value: object) -> Any:
    if kind is bool:
        return _parse_bool(value)
    if kind is int:
        try:
            return _parse_int(value)
        except (ValueError, TypeError):
            return parse_bytes(value)  # sizes may be written as 4MiB
    if kind is float:
        return _parse_float(value)
    if kind is str:
        return _parse_str(value)
    raise ValueError(f"cannot set an option of type {kind.__name__} from configuration")


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything `pora serve` needs, after precedence and validation."""

    data_dir: Path = Path("./pora-data")
    listen: Address = field(default_factory=lambda: parse_address(DEFAULT_LISTEN))
    metrics_listen: Address | None = None
    log_format: str = "json"
    log_level: str = "info"
    drain_timeout_s: float = 10.0
    disk_check_interval_ms: float = 1000.0
    read_only_free_bytes_min: int = 512 << 20
    read_only_free_percent_min: float = 0.0
    read_only_hysteresis_bytes: int = 256 << 20
    #: the metadata store to register in (None: standalone)
    metadata: str | None = None
    #: the address registered (None: the bound listen address)
    advertise: Address | None = None
    registration_lease_s: float = DEFAULT_REGISTRATION_LEASE_S
    rack: str | None = None
    ledger_gc_interval_s: float = 600.0
    ledger_gc_deletions_per_s: float = 20.0
    ledger_gc_grace_s: float = 3600.0
    gc_young_threshold: int = GC_YOUNG_THRESHOLD_DEFAULT
    #: options for `open_node`, by name
    node_options: Mapping[str, Any] = field(default_factory=dict)
    #: options for `ServerConfig`, by name
    server_options: Mapping[str, Any] = field(default_factory=dict)
    #: where each setting came from (flag, env, file or default), for the startup log
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # finite too: nan passes every comparison below (see _parse_float)
        if not (math.isfinite(self.drain_timeout_s) and self.drain_timeout_s >= 0):
            raise SettingsError(
                f"drain_timeout_s must be a finite number of seconds >= 0, "
                f"got {self.drain_timeout_s}"
            )
        if not (math.isfinite(self.disk_check_interval_ms) and self.disk_check_interval_ms > 0):
            raise SettingsError("disk_check_interval_ms must be > 0")
        if not 0 <= self.read_only_free_percent_min < 100:
            raise SettingsError("read_only_free_percent_min must be in [0, 100)")
        if not (math.isfinite(self.registration_lease_s) and self.registration_lease_s >= 0.5):
            raise SettingsError(
                "registration_lease_s must be at least 0.5 seconds (it is renewed every "
                f"third of it), got {self.registration_lease_s}"
            )
        for name in ("ledger_gc_interval_s", "ledger_gc_deletions_per_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise SettingsError(f"{name} must be a finite number > 0, got {value}")
        if not (math.isfinite(self.ledger_gc_grace_s) and self.ledger_gc_grace_s >= 0):
            raise SettingsError(
                f"ledger_gc_grace_s must be a finite number of seconds >= 0, "
                f"got {self.ledger_gc_grace_s}"
            )
        if self.gc_young_threshold < 0:
            raise SettingsError("gc_young_threshold must be >= 0 (0 turns the collector off)")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise SettingsError(f"config file {path} does not exist (given by --config)") from None
    except OSError as error:
        raise SettingsError(f"cannot read config file {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(f"config file {path} is not valid TOML: {error}") from None


def _split_assignment(text: str, flag: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise SettingsError(f"{flag} expects NAME=VALUE, got {text!r}")
    return name.strip(), value.strip()


def _options(
    kind: str,
    option_types: Callable[[], Mapping[str, type]],
    from_file: Mapping[str, Any],
    file_where: str,
    environ: Mapping[str, str],
    flag_values: Sequence[str],
) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge one family of options (node or server) with precedence flag > env > file."""
    prefix = f"PORA_{kind.upper()}_"
    flag = f"--{kind}-option"
    raw: dict[str, tuple[object, str]] = {}
    for name, value in from_file.items():
        raw[name] = (value, f"{file_where} [{kind}] {name}")
    for variable, value in environ.items():
        if variable.startswith(prefix):
            raw[variable[len(prefix) :].lower()] = (value, f"environment variable {variable}")
    for assignment in flag_values:
        name, value = _split_assignment(assignment, flag)
        raw[name] = (value, f"{flag} {assignment}")
    options: dict[str, Any] = {}
    sources: dict[str, str] = {}
    types = option_types() if raw else {}  # the server module loads only when needed
    for name, (value, where) in raw.items():
        if name not in types:
            known = ", ".join(sorted(types)) or "(none available)"
            raise SettingsError(f"unknown {kind} option {name!r} in {where}; known: {known}")
        try:
            options[name] = _parse_typed(types[name], value)
        except (ValueError, TypeError) as error:
            raise SettingsError(f"bad value for {kind} option {name} in {where}: {error}") from None
        sources[f"{kind}.{name}"] = where
    return options, sources


def _check_server_options(options: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Refuse what `ServerConfig` would refuse once the node is up, now, naming
    where each option involved came from."""
    from pora.server.config import ServerConfig  # noqa: PLC0415 (loaded only when used)

    if not options:
        return
    try:
        ServerConfig(**options)
    except (TypeError, ValueError) as error:
        named = [name for name in options if name in str(error)] or sorted(options)
        where = "; ".join(f"{name} from {sources[f'server.{name}']}" for name in named)
        raise SettingsError(f"bad server option ({where}): {error}") from None


def _config_file(
    config_path: Path | None,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], str]:
    """The config file's top-level keys, its [node] and [server] tables, and how
    messages name the file (all empty without a file)."""
    if config_path is None:
        return {}, {"node": {}, "server": {}}, ""
    from_file = _read_file(config_path)
    file_where = f"config file {config_path}"
    tables: dict[str, dict[str, Any]] = {"node": {}, "server": {}}
    for key in list(from_file):
        if key in tables:
            table = from_file.pop(key)
            if not isinstance(table, dict):
                raise SettingsError(f"[{key}] in {file_where} must be a table")
            tables[key] = table
    return from_file, tables, file_where


def _top_level_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    from_file: dict[str, Any],
    file_where: str,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each of SETTINGS' value and where it came from. Takes the settings' keys out
    of `from_file` and refuses any key left, which names no setting."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        candidates: list[tuple[object, str]] = []
        if setting.name in from_file:
            candidates.append((from_file.pop(setting.name), f"{file_where} key {setting.name}"))
        if setting.env in environ:
            candidates.append((environ[setting.env], f"environment variable {setting.env}"))
        if flags.get(setting.name) is not None:
            candidates.append((flags[setting.name], f"flag {setting.flag}"))
        if not candidates:
            values[setting.name] = setting.default
            sources[setting.name] = "default"
            continue
        value, where = candidates[-1]
        try:
            values[setting.name] = setting.parse(value)
        except (ValueError, TypeError) as error:
            raise SettingsError(f"bad value for {setting.name} in {where}: {error}") from None
        sources[setting.name] = where
    if from_file:
        known = ", ".join([s.name for s in SETTINGS] + ["[node]", "[server]"])
        raise SettingsError(
            f"unknown setting {sorted(from_file)[0]!r} in {file_where}; known: {known}"
        )
    return values, sources


def check_node_option_flags(flag_values: Sequence[str]) -> None:
    """Check `--node-option NAME=VALUE` flags as `pora serve` would, before starting
    one: an unknown name or a bad value raises SettingsError naming it."""
    options, _ = _options("node", node_option_types, {}, "", {}, flag_values)
    try:
        NodeConfig.from_options(**options)
    except (TypeError, ValueError) as error:
        raise SettingsError(f"bad node options {options}: {error}") from None


def load_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    config_path: Path | None = None,
    node_option_flags: Sequence[str] = (),
    server_option_flags: Sequence[str] = (),
) -> Settings:
    """Combine defaults, the config file, the environment and flags (highest wins).

    `flags` maps setting names to values given on the command line (None or absent:
    not given). `environ` defaults to `os.environ`; `PORA_CONFIG` names the config
    file when `config_path` is None.
    """
    environ = os.environ if environ is None else environ
    if config_path is None and environ.get("PORA_CONFIG"):
        config_path = Path(environ["PORA_CONFIG"])
    from_file, tables, file_where = _config_file(config_path)
    values, sources = _top_level_settings(flags, environ, from_file, file_where)
    node_options, node_sources = _options(
        "node", node_option_types, tables["node"], file_where, environ, node_option_flags
    )
    server_options, server_sources = _options(
        "server", server_option_types, tables["server"], file_where, environ, server_option_flags
    )
    try:
        NodeConfig.from_options(**node_options)
    except (TypeError, ValueError) as error:
        raise SettingsError(f"bad node options {node_options}: {error}") from None
    _check_server_options(server_options, server_sources)
    return Settings(
        **values,
        node_options=node_options,
        server_options=server_options,
        sources={**sources, **node_sources, **server_sources},
    )
