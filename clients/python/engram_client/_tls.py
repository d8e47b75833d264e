"""TLS shared by the blocking and the asyncio client: the SSLContext built from the
client's options, and which TLS failures are final (retrying cannot help) rather than a
connection that broke. engramd speaks TLS 1.3 only (docs/protocol.md, "Transport")."""
from __future__ import annotations

import ssl
from typing import Union

from .errors import TLSError

TLSOption = Union[bool, ssl.SSLContext, None]


def make_context(tls: TLSOption, ca_file: str | None, cert_file: str | None,
                 key_file: str | None) -> ssl.SSLContext | None:
    """The SSLContext for the client's options, or None for plain TCP.

    ``tls`` None means TLS when any file is given. True (or a file) gives a context that
    verifies the server's certificate against ``ca_file`` (the system's CA store without
    it) and the name connected to, TLS 1.3 only, presenting ``cert_file`` / ``key_file``
    when given. An SSLContext is used as it is, so it cannot be combined with the files.
    Raises ValueError for contradictory options, OSError or ssl.SSLError for a file that
    cannot be read or used."""
    files = ca_file is not None or cert_file is not None or key_file is not None
    if isinstance(tls, ssl.SSLContext):
        if files:
            raise ValueError("tls_ca_file, tls_cert_file and tls_key_file cannot be combined "
                             "with an SSLContext: load them into the context")
        return tls
    if tls is False:
        if files:
            raise ValueError("tls_ca_file, tls_cert_file or tls_key_file given with tls=False")
        return None
    if tls is None and not files:
        return None
    if tls is not True and tls is not None:
        raise TypeError("tls must be a bool or an ssl.SSLContext")
    if key_file is not None and cert_file is None:
        raise ValueError("tls_key_file needs tls_cert_file")
    # create_default_context: CERT_REQUIRED and check_hostname; with a CA file it trusts
    # that file alone, without one the system's store.
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    if cert_file is not None:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def is_final(exc: BaseException) -> bool:
    """True for a TLS failure that another attempt would meet again: a certificate or name
    that does not verify, an alert from the server (it refused our certificate), a server
    that does not speak TLS 1.3. An EOF or reset in the middle of a handshake is not final:
    the server may be restarting."""
    return (isinstance(exc, ssl.SSLError)
            and not isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError,
                                     ssl.SSLWantReadError, ssl.SSLWantWriteError,
                                     ssl.SSLSyscallError)))


def tls_error(exc: BaseException, host: str, port: int) -> TLSError:
    """The TLSError reported for ``exc``, a final failure talking to host:port."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or str(exc)
        return TLSError(f"TLS with {host}:{port}: the server's certificate did not verify: "
                        f"{why}")
    reason = getattr(exc, "reason", None) or str(exc)
    if "ALERT" in reason:  # e.g. TLSV1_ALERT_UNKNOWN_CA: the server refused our certificate
        hint = ""
        if "_CA" in reason or "CERTIFICATE" in reason:
            hint = ": it did not accept the client certificate"
        return TLSError(f"TLS with {host}:{port} failed: the server ended the handshake "
                        f"with {reason}{hint}")
    return TLSError(f"TLS with {host}:{port} failed: {reason}")
