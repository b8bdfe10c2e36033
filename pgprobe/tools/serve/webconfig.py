"""--web-config FILE: TLS and basic auth in the Prometheus exporter-toolkit's format.

The file is exporter-toolkit's web configuration (YAML; node_exporter and
postgres_exporter read the same with --web.config.file), strictly: unknown keys,
duplicate keys and wrong types are refused in one line (exit 2), and so is what
this server does not do rather than ignore it. Read once at start (exporter-toolkit
reads it at every request): restart serve to change it. Supported:

  tls_server_config:
    cert_file, key_file          PEM files; relative paths from the file's directory
    client_ca_file               CA certificates that sign client certificates
    client_auth_type             NoClientCert (default), VerifyClientCertIfGiven,
                                 RequireAndVerifyClientCert (not RequestClientCert,
                                 RequireAnyClientCert: they check no certificate)
    min_version, max_version     TLS10 ... TLS13 (default TLS12 up)
    prefer_server_cipher_suites  true (default) or false
  http_server_config:
    headers                      the five exporter-toolkit allows, added to replies
    http2                        accepted; serve speaks HTTP/1.1
  basic_auth_users:              name: bcrypt hash ($2a$, $2b$, $2y$; htpasswd -nBC 10)

Refused: inline cert/key/client_ca, cipher_suites, curve_preferences,
client_allowed_sans, rate_limit. Because serve runs as root, the file must not be
writable by group or others, and the key file is held to PostgreSQL's rule for
ssl_key_file (exporter-toolkit checks neither): no access for others, group read at
most and only when root owns it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import ssl
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgprobe.errors import EXIT_USAGE, PgprobeError

TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version",
            "max_version", "prefer_server_cipher_suites"}  # fmt: skip
UNSUPPORTED = {"cert", "key", "client_ca", "cipher_suites", "curve_preferences",
               "client_allowed_sans", "rate_limit"}  # fmt: skip
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
            "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}  # fmt: skip
# exporter-toolkit's headers and, where it restricts them, their values
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
BCRYPT = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
CACHE_MAX = 1024  # checked (user, password) pairs remembered: bcrypt costs ~0.1 s a check


class Users:
    """basic_auth_users: bcrypt checks, one at a time, remembered (as exporter-toolkit)."""

    def __init__(self, hashes: dict[str, bytes]) -> None:
        self.hashes = hashes
        # An unknown name is checked against a real hash all the same: the time a reply
        # takes does not tell which names exist.
        self.decoy = next(iter(hashes.values()))
        self.cache: dict[bytes, bool] = {}
        self.lock = threading.Lock()

    def allowed(self, authorization: str | None) -> bool:
        scheme, _, encoded = (authorization or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        known = self.hashes.get(user.decode("utf-8", "replace")) if sep else None
        hashed = known or self.decoy
        key = hashlib.sha256(b"\0".join((user, hashed, password))).digest()
        with self.lock:
            ok = self.cache.get(key)
            if ok is None:
                ok = check(password, hashed)
                if len(self.cache) >= CACHE_MAX:
                    self.cache.clear()
                self.cache[key] = ok
        return ok and known is not None


def check(password: bytes, hashed: bytes) -> bool:
    import bcrypt  # only with basic_auth_users

    try:
        return bcrypt.checkpw(password, hashed)  # constant time in the hash
    except ValueError:  # over bcrypt's 72 bytes: no such password
        return False


@dataclass
class WebConfig:
    path: str
    tls: ssl.SSLContext | None = None
    users: Users | None = None
    headers: dict[str, str] = field(default_factory=dict)


def fail(path: str, message: str) -> PgprobeError:
    return PgprobeError(f"--web-config {path}: {message}", EXIT_USAGE)


def load(path: str) -> WebConfig:
    """The file read, checked and turned into a TLS context and users: one line if bad."""
    doc = parse(path)
    out = WebConfig(path)
    known = {"tls_server_config", "http_server_config", "basic_auth_users"}
    for key in doc:
        if key in UNSUPPORTED:
            raise fail(path, f"{key} is not supported by pgprobe serve")
        if key not in known:
            raise fail(path, f"unknown key {key!r} (known: {', '.join(sorted(known))})")
    base = Path(path).resolve().parent
    tls = section(path, doc, "tls_server_config")
    if tls:
        out.tls = tls_context(path, tls, base)
    http = section(path, doc, "http_server_config")
    for key, value in http.items():
        if key == "headers":
            out.headers = headers(path, value)
        elif key != "http2" or not isinstance(value, bool):
            raise fail(path, f"http_server_config: unknown key or bad value {key!r}")
    users = section(path, doc, "basic_auth_users")
    if users:
        out.users = Users({user_name(path, k): password_hash(path, k, v) for k, v in users.items()})
    return out


def parse(path: str) -> dict[str, Any]:
    import yaml  # only with --web-config

    class StrictLoader(yaml.SafeLoader):  # type: ignore[misc]
        """Duplicate keys refused, as exporter-toolkit's UnmarshalStrict does."""

    def mapping(loader: Any, node: Any) -> Any:
        keys = [loader.construct_object(k) for k, _ in node.value]
        for i, key in enumerate(keys):
            if key in keys[:i]:
                raise yaml.MarkedYAMLError(problem=f"duplicate key {key!r}",
                                           problem_mark=node.value[i][0].start_mark)  # fmt: skip
        return loader.construct_mapping(node)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        st = os.stat(path)
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(path, f"cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise fail(path, f"writable by others (mode {st.st_mode & 0o777:04o}; serve runs as "
                   "root and the file says who may read the metrics): chmod go-w")  # fmt: skip
    try:
        doc = yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise fail(path, f"{where}{exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise fail(path, f"not YAML: {str(exc).splitlines()[0]}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise fail(path, "not a mapping of tls_server_config, basic_auth_users, ...")
    return doc


def section(path: str, doc: dict[str, Any], name: str) -> dict[Any, Any]:
    value = doc.get(name) or {}
    if not isinstance(value, dict):
        raise fail(path, f"{name} is not a mapping")
    return value


def tls_context(path: str, conf: dict[Any, Any], base: Path) -> ssl.SSLContext:
    for key in conf:
        if key in UNSUPPORTED:
            raise fail(path, f"tls_server_config: {key} is not supported by pgprobe serve")
        if key not in TLS_KEYS:
            raise fail(path, f"tls_server_config: unknown key {key!r}")
    files = {k: base / text(path, conf, k) for k in ("cert_file", "key_file", "client_ca_file")
             if k in conf}  # fmt: skip
    if "cert_file" not in files or "key_file" not in files:
        raise fail(path, "tls_server_config needs cert_file and key_file")
    key_file_private(path, files["key_file"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = version(path, conf, "min_version", "TLS12")
    ctx.maximum_version = version(path, conf, "max_version", "TLS13")
    if conf.get("prefer_server_cipher_suites", True) is False:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE

    def encrypted() -> str:
        raise fail(path, f"key_file {files['key_file']} is encrypted: serve cannot ask for it")

    try:
        ctx.load_cert_chain(files["cert_file"], files["key_file"], password=encrypted)
        if "client_ca_file" in files:
            ctx.load_verify_locations(cafile=files["client_ca_file"])
    except (ssl.SSLError, OSError) as exc:
        why = getattr(exc, "reason", None) or exc.strerror or exc
        raise fail(path, f"cannot load the TLS files ({why})") from None
    auth = text(path, conf, "client_auth_type") if "client_auth_type" in conf else "NoClientCert"
    if auth not in CLIENT_AUTH:
        raise fail(path, f"client_auth_type {auth!r} is not one of {', '.join(CLIENT_AUTH)}")
    ctx.verify_mode = CLIENT_AUTH[auth]
    if ("client_ca_file" in files) != (auth != "NoClientCert"):
        raise fail(path, "client_ca_file and a client_auth_type other than NoClientCert go "
                   "together")  # fmt: skip
    return ctx


def key_file_private(path: str, key: Path) -> None:
    """PostgreSQL's rule for ssl_key_file: 0600 or less, 0640 or less when root owns it."""
    try:
        st = key.stat()
    except OSError as exc:
        raise fail(path, f"key_file {key}: {exc.strerror}") from None
    loose = stat.S_IRWXO | stat.S_IXGRP | stat.S_IWGRP | (stat.S_IRGRP if st.st_uid else 0)
    if st.st_mode & loose:
        raise fail(path, f"key_file {key} has group or world access (mode "
                   f"{st.st_mode & 0o777:04o}): chmod 600, or 640 when root owns it")  # fmt: skip


def text(path: str, conf: dict[Any, Any], key: str) -> str:
    value = conf[key]
    if not isinstance(value, str) or not value:
        raise fail(path, f"tls_server_config: {key} is not a string")
    return value


def version(path: str, conf: dict[Any, Any], key: str, default: str) -> ssl.TLSVersion:
    name = conf.get(key, default)
    if name not in VERSIONS:
        raise fail(path, f"tls_server_config: {key} {name!r} is not one of {', '.join(VERSIONS)}")
    return VERSIONS[name]


def headers(path: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise fail(path, "http_server_config: headers is not a mapping")
    for name, val in value.items():
        if name not in HEADERS or not isinstance(val, str) or "\n" in val or "\r" in val:
            raise fail(path, f"http_server_config: header {name!r} cannot be set")
        if HEADERS[name] and val not in HEADERS[name]:
            raise fail(path, f"http_server_config: {name} must be one of {HEADERS[name]}")
    return {k: v for k, v in value.items() if v}


def user_name(path: str, name: Any) -> str:
    if isinstance(name, bool) or not isinstance(name, (str, int)) or not str(name):
        raise fail(path, f"basic_auth_users: user name {name!r} is not a string (quote it)")
    return str(name)


def password_hash(path: str, name: Any, value: Any) -> bytes:
    hashed = value if isinstance(value, str) else ""
    found = BCRYPT.fullmatch(hashed)
    if found is None or not 4 <= int(found.group(1)) <= 31:
        raise fail(path, f"basic_auth_users: {name}'s password is not a bcrypt hash "
                   "(htpasswd -nBC 10 '' | tr -d ':\\n')")  # fmt: skip
    return hashed.encode()
