"""Where a client connects and with which key, from its options or, for what they leave
open, from the environment every Engram tool reads (README, "Environment"):

- ``ENGRAM_URL``: ``engram://host:port`` (MessagePack-RPC over TCP; ``tcp://`` is the
  same), ``engrams://host:port`` (over TLS 1.3; ``tls://`` is the same); the port defaults
  to 7420. ``http(s)://`` URLs name the HTTP/JSON port, which this client does not speak.
- ``ENGRAM_API_KEY``, else the first line of the file ``ENGRAM_API_KEY_FILE``.
- ``ENGRAM_TLS``, ``ENGRAM_TLS_CA``, ``ENGRAM_TLS_CERT``, ``ENGRAM_TLS_KEY``,
  ``ENGRAM_TLS_SERVERNAME``: read with ``ENGRAM_URL``, when the address comes from it.
No I/O happens here except reading the key file."""
from __future__ import annotations

import ipaddress
import os
import ssl
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7420

_RPC_SCHEMES = {"engram": False, "tcp": False, "engrams": True, "tls": True}


@dataclass(frozen=True)
class Endpoint:
    """A parsed ENGRAM_URL: host, port, and whether the scheme asks for TLS."""
    host: str
    port: int
    tls: bool


def parse_url(url: str, what: str = "url") -> Endpoint:
    """Parses an Engram URL (see the module's comment). ``host:port`` without a scheme is
    ``engram://host:port``. Raises ValueError naming ``what``; the message never repeats
    the URL's user-info part (it could hold a secret)."""
    text = url.strip()
    if "://" not in text:
        text = "engram://" + text
    try:
        u = urlsplit(text)
        port = u.port
    except ValueError as e:
        raise ValueError(f"{what}: not a valid URL ({e})") from None
    scheme = u.scheme.lower()
    if scheme in ("http", "https"):
        raise ValueError(f"{what}: {scheme}:// names engramd's HTTP/JSON port; the Python "
                         "client speaks MessagePack-RPC: use engram://host:7420 (or "
                         "engrams:// for TLS)")
    if scheme not in _RPC_SCHEMES:
        raise ValueError(f"{what}: unknown scheme '{scheme}'; use engram://, engrams://, "
                         "tcp:// or tls://")
    if u.username is not None or u.password is not None:
        raise ValueError(f"{what}: a URL may not carry credentials; give the key with "
                         "api_key or ENGRAM_API_KEY(_FILE)")
    if u.path not in ("", "/") or u.query or u.fragment:
        raise ValueError(f"{what}: an Engram URL is scheme://host:port, without a path or "
                         "query")
    host = u.hostname
    if not host:
        raise ValueError(f"{what}: no host")
    if port == 0:
        raise ValueError(f"{what}: the port must be 1 to 65535")
    try:  # brackets are URL syntax only
        host = str(ipaddress.ip_address(host))
    except ValueError:
        pass
    return Endpoint(host, port or DEFAULT_PORT, _RPC_SCHEMES[scheme])


def key_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """``ENGRAM_API_KEY``, else the first line of ``ENGRAM_API_KEY_FILE``, else None.
    Raises OSError or ValueError naming the variable (never the key) when the file cannot
    be read or holds no key."""
    env = os.environ if env is None else env
    key = env.get("ENGRAM_API_KEY")
    if key:
        return key.strip()
    path = env.get("ENGRAM_API_KEY_FILE")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline(4096)
    except OSError as e:
        raise OSError(e.errno, f"ENGRAM_API_KEY_FILE: cannot read {path}: {e.strerror}") from None
    first = first.strip()
    if not first:
        raise ValueError(f"ENGRAM_API_KEY_FILE: {path} holds no key on its first line")
    return first


@dataclass
class Settings:
    """What a client was asked for, after the environment filled the gaps."""
    host: str
    port: int
    api_key: str | None
    tls: bool | ssl.SSLContext | None
    tls_ca_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None
    tls_server_hostname: str | None


def resolve(host: str | None, port: int | None, url: str | None, api_key: str | None,
            tls: bool | ssl.SSLContext | None, tls_ca_file: str | None, tls_cert_file: str | None,
            tls_key_file: str | None, tls_server_hostname: str | None,
            env: Mapping[str, str] | None = None) -> Settings:
    """The client's settings: explicit options win; ``ENGRAM_URL`` gives the address when
    neither ``url`` nor ``host``/``port`` is given (with the ``ENGRAM_TLS*`` variables,
    when no TLS option is given); the ``ENGRAM_API_KEY(_FILE)`` key when ``api_key`` is
    None. Raises ValueError for contradictory options or a bad URL."""
    env = os.environ if env is None else env
    if url is not None and (host is not None or port is not None):
        raise ValueError("give url or host/port, not both")
    from_env = False
    if url is None and host is None and port is None and env.get("ENGRAM_URL"):
        url, from_env = env["ENGRAM_URL"], True
    scheme_tls = False
    if url is not None:
        ep = parse_url(url, "ENGRAM_URL" if from_env else "url")
        host, port, scheme_tls = ep.host, ep.port, ep.tls
    if api_key is None:
        api_key = key_from_env(env)
    tls_given = (tls is not None or tls_ca_file is not None or tls_cert_file is not None
                 or tls_key_file is not None)
    if from_env and not tls_given:
        tls_ca_file = env.get("ENGRAM_TLS_CA") or None
        tls_cert_file = env.get("ENGRAM_TLS_CERT") or None
        tls_key_file = env.get("ENGRAM_TLS_KEY") or None
        if tls_server_hostname is None:
            tls_server_hostname = env.get("ENGRAM_TLS_SERVERNAME") or None
        flag = env.get("ENGRAM_TLS")
        if flag and flag != "0":
            tls = True
    if scheme_tls:
        if tls is False:
            raise ValueError("an engrams:// or tls:// URL needs TLS, but tls=False was given")
        if tls is None:
            tls = True
    return Settings(host or DEFAULT_HOST, port or DEFAULT_PORT, api_key, tls, tls_ca_file,
                    tls_cert_file, tls_key_file, tls_server_hostname)
