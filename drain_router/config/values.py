"""The pieces of the configuration: its error type, the upstream address, and the parsers that turn
a user's text into values (each setting's :class:`~drain_router.config.flags.Flag` names its own).

The user's text becomes seconds in exactly one place, :func:`parse_seconds`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import urllib.parse
from collections.abc import Callable
from typing import Any


class ConfigError(ValueError):
    """A configuration value that cannot work. Names the flag, the value and the remedy."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{flag_name(field)}={value!r}: {reason}")


def flag_name(field: str) -> str:
    """``shutdown_drain_secs`` -> ``--shutdown-drain-secs``."""
    return "--" + field.replace("_", "-")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Upstream:
    """Where the model server listens: TCP ``http://host:port`` or a Unix socket path."""

    url: str
    """The upstream exactly as given."""
    base_url: str
    """The URL requests are sent to (for a Unix socket, a placeholder host; the socket is the path)."""
    host: str
    """Host name for TCP upstreams; ``localhost`` for a Unix socket."""
    port: int | None
    """TCP port, ``None`` for a Unix socket."""
    unix_path: str | None = None
    """Socket path when the upstream is ``unix:/path``."""


def parse_upstream(value: object, key: str = "upstream") -> Upstream:
    """``http://host:port`` or ``unix:/path/to.sock``; anything else is an error, never a guess
    (``key``: the setting named in the error)."""
    remedy = "give http://HOST:PORT (e.g. http://127.0.0.1:8000) or unix:/path/to.sock"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, value, f"the model server address is required; {remedy}")
    text = value.strip()
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
        if not path.startswith("/"):
            raise ConfigError(key, value, f"a Unix socket path must be absolute; {remedy}")
        return Upstream(url=text, base_url="http://localhost", host="localhost", port=None, unix_path=path)
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme != "http":
        raise ConfigError(key, value, f"only plain http upstreams are supported; {remedy}")
    try:
        port = parsed.port
    except ValueError:
        raise ConfigError(key, value, f"the port is not a number; {remedy}") from None
    if not parsed.hostname or port is None:
        raise ConfigError(key, value, f"host and port are both required; {remedy}")
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise ConfigError(key, value, f"no path, query or fragment: paths are forwarded as requested; {remedy}")
    host = parsed.hostname
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return Upstream(url=text, base_url=f"http://{netloc}", host=host, port=port)


# --------------------------------------------------------------------------------------------------
# Parsers: each field of the configuration tree names one in its flag (drain_router.config.flags);
# build_config() parses the user's text with it.

Parser = Callable[[str, object], Any]
"""``parse(key, raw) -> value``: raw is a string (flag or variable) or a Python value (tests)."""


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


#: A decimal number of seconds as written on a command line: a sign, digits, at most one point; no
#: exponent or words (``nan``, ``inf`` and ``1e3`` are refused, not read as Python would read them).
_DECIMAL = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)$")


def parse_seconds(
    key: str, value: object, *, minimum: int = 0, optional: bool = False, fractions: bool = False
) -> float | None:
    """Seconds, at least ``minimum``. Rejects negatives, words and (unless ``fractions``, where a
    flag says so) fractions, naming the flag. The only place a user's text becomes a duration.

    With ``fractions`` a value must be more than 0 (a wait of nothing is no setting) and may be
    fractional (``1.5``, ``0.25``); a whole value comes back as an ``int`` (``30``, not ``30.0``), so
    the effective config shows it as it was written."""
    if value is None or value == "":
        if optional:
            return None
        raise ConfigError(key, value, "a whole number of seconds is required")
    if isinstance(value, bool):
        raise ConfigError(key, value, "must be a whole number of seconds")
    if fractions:
        return _fractional_seconds(key, value)
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        seconds = int(value.strip())
    else:
        raise ConfigError(key, value, "must be a whole number of seconds (no fractions or units), e.g. 30")
    if seconds < minimum:
        raise ConfigError(key, value, f"must be at least {_plural(minimum, 'second')}")
    return seconds


def _fractional_seconds(key: str, value: object) -> float:
    remedy = "give a number of seconds more than 0, fractions allowed, e.g. 30 or 1.5"
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str) and _DECIMAL.match(value.strip()):
        number = float(value.strip())
    else:
        raise ConfigError(key, value, f"not a number of seconds (no units or exponent); {remedy}")
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(key, value, f"must be more than 0 seconds; {remedy}")
    return int(number) if number.is_integer() else number


def parse_int(key: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool):
        raise ConfigError(key, value, "must be a whole number")
    try:
        number = int(value) if isinstance(value, int) else int(str(value).strip())
    except ValueError:
        raise ConfigError(key, value, "must be a whole number") from None
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise ConfigError(key, value, f"must be {bound}")
    return number


def seconds(*, minimum: int = 0, optional: bool = False) -> Parser:
    return lambda key, value: parse_seconds(key, value, minimum=minimum, optional=optional)


def required_seconds(*, minimum: int = 0) -> Parser:
    def parse(key: str, value: object) -> int:
        seconds = parse_seconds(key, value, minimum=minimum)
        assert isinstance(seconds, int)  # not optional, no fractions: parse_seconds raised instead
        return seconds

    return parse


def fractional_seconds(*, optional: bool = False) -> Parser:
    """More than 0 seconds, fractions allowed (``optional``: empty is ``None``, the setting's own
    default then applies)."""
    return lambda key, value: parse_seconds(key, value, optional=optional, fractions=True)


def integer(*, minimum: int, maximum: int | None = None, optional: bool = False) -> Parser:
    def parse(key: str, value: object) -> int | None:
        if optional and value in (None, ""):
            return None
        return parse_int(key, value, minimum=minimum, maximum=maximum)

    return parse


def text(key: str, value: object) -> str:
    return str(value)


def choice(choices: tuple[str, ...]) -> Parser:
    def parse(key: str, value: object) -> str:
        text = str(value).lower()
        if text not in choices:
            raise ConfigError(key, value, f"must be one of {', '.join(choices)}")
        return text

    return parse


def path(key: str, value: object) -> str | None:
    if value in (None, ""):
        return None
    text = str(value)
    if not text.startswith("/"):
        raise ConfigError(key, value, "must start with '/', e.g. /health")
    return text


def boolean(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(key, value, "must be true or false")


def upstream(key: str, value: object) -> Upstream:
    return parse_upstream(value, key)


def optional_upstream(key: str, value: object) -> Upstream | None:
    return None if value in (None, "") else parse_upstream(value, key)


def port(key: str, value: object) -> int:
    return parse_int(key, value, minimum=0, maximum=65535)
