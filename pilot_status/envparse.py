"""Reading settings from the environment: each helper returns a typed value or refuses start-up with
ImproperlyConfigured naming the variable (pilot_status.settings reads every setting through these).
NAME_FILE, where set, is read instead of NAME (docker/k8s secrets)."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
from pathlib import Path
from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured


def _raw(name: str) -> str | None:
    # NAME_FILE lets secrets come from a mounted file (docker/k8s secrets).
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {file_path}: {exc}") from exc
    return os.environ.get(name)


def envstr(name: str, default: str | None = None) -> str:
    value = _raw(name)
    if value is None or value == "":
        if default is None:
            raise ImproperlyConfigured(f"{name} is required but not set")
        return default
    return value


def envsecret(name: str, min_length: int = 16) -> str:
    value = envstr(name)
    if len(value) < min_length:
        raise ImproperlyConfigured(f"{name} must be at least {min_length} characters")
    return value


def envbool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {value!r}")


def envint(name: str, default: int, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from exc
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {number}")
    return number


def envfloat(
    name: str, default: float, above: float | None = None, at_most: float | None = None, minimum: float | None = None
) -> float:
    """A number from the environment; `above`, `minimum` and `at_most` bound it (a rate or a timeout
    of 0 would divide by zero or never wait, so those refuse start-up instead)."""
    value = _raw(name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from exc
    if number != number or number in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name} must be a finite number, got {value!r}")
    if above is not None and number <= above:
        raise ImproperlyConfigured(f"{name} must be > {above:g}, got {value}")
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum:g}, got {value}")
    if at_most is not None and number > at_most:
        raise ImproperlyConfigured(f"{name} must be <= {at_most:g}, got {value}")
    return number


def envurl(name: str, schemes: tuple[str, ...], default: str | None = None) -> str:
    value = envstr(name, default)
    parsed = urlparse(value)
    if parsed.scheme not in schemes or not parsed.netloc:
        raise ImproperlyConfigured(
            f"{name} must be a URL with scheme {'/'.join(schemes)}, got {value!r}"
        )
    return value


def envpair(name: str) -> tuple[str, str] | None:
    """`HEADER,value` (e.g. HTTP_X_FORWARDED_PROTO,https), or None when unset."""
    value = envstr(name, "")
    if not value:
        return None
    parts = [part.strip() for part in value.split(",")]
    if len(parts) != 2 or not parts[0].startswith("HTTP_") or not parts[1]:
        raise ImproperlyConfigured(f"{name} must be HEADER,value (e.g. HTTP_X_FORWARDED_PROTO,https), got {value!r}")
    return parts[0], parts[1]


def envwaits(name: str, default: str) -> list[float]:
    """Comma-separated waits in seconds (1 to 20 of them, each >= 0)."""
    raw = envstr(name, default)
    try:
        waits = [float(part) for part in raw.split(",")]
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be comma-separated seconds, got {raw!r}") from exc
    if not 1 <= len(waits) <= 20 or any(not 0 <= wait < 10**7 for wait in waits):
        raise ImproperlyConfigured(f"{name} must be 1 to 20 waits of 0 to 10^7 seconds, got {raw!r}")
    return waits


def envports(name: str) -> tuple[int, ...]:
    """Comma-separated TCP ports (1 to 65535); () when unset or empty."""
    raw = envstr(name, "")
    try:
        ports = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be comma-separated port numbers, got {raw!r}") from exc
    if any(not 1 <= port <= 65535 for port in ports):
        raise ImproperlyConfigured(f"{name} must be port numbers from 1 to 65535, got {raw!r}")
    return ports


FERNET_KEY_HELP = "python3 -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"


def envfernetkeys(name: str) -> list[str]:
    """Comma-separated Fernet keys (32 url-safe base64 bytes each), newest first; [] when unset. Never
    echoed back: a refusal names the variable and the key's position only."""
    raw = envstr(name, "")
    if not raw.strip():
        return []
    keys = [part.strip() for part in raw.split(",")]
    for position, key in enumerate(keys, start=1):
        try:
            decoded = base64.urlsafe_b64decode(key.encode("ascii")) if len(key) == 44 else b""
        except (ValueError, binascii.Error):
            decoded = b""
        if len(decoded) != 32:
            raise ImproperlyConfigured(f"{name}: key {position} of {len(keys)} is not a Fernet key: {FERNET_KEY_HELP}")
    return keys


def envproxies(name: str) -> tuple[int, list[str]]:
    """The reverse proxies trusted to say who the client is: a count (`2`: the last two hops of
    X-Forwarded-For were written by our proxies), or their networks (`10.0.0.0/8,fd00::/8`). Unset or 0:
    none, and X-Forwarded-For is never read. Returns (count, networks), one of them empty."""
    raw = envstr(name, "").strip()
    if not raw:
        return 0, []
    if raw.isdigit():
        count = int(raw)
        if count > 10:
            raise ImproperlyConfigured(f"{name} must be a count of 0 to 10 proxies or their networks, got {raw!r}")
        return count, []
    networks = []
    for part in (piece.strip() for piece in raw.split(",")):
        try:
            networks.append(str(ipaddress.ip_network(part, strict=False)))
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"{name} must be a count of proxies or comma-separated networks (10.0.0.0/8), got {part!r}"
            ) from exc
    return 0, networks
