"""A throwaway PKI for the TLS tests, made with the openssl command line at test time.

make_pki(dir) writes, all EC P-256:
  ca.pem / ca.key             the test CA that signs the server certificates
  server.pem / server.key     serial 0x1001, SAN IP:127.0.0.1 and DNS:localhost, 30 days
  server2.pem / server2.key   the same names, serial 0x1002 (a reload replaces server.pem)
  expired.pem                 server.key's certificate, valid only in January 2020 (openssl
                              ca: `x509 -req` cannot date a certificate in the past)
  other_ca.pem / other_ca.key a second, unrelated CA
  other_server.pem / .key     a server certificate of the unrelated CA
  client_ca.pem / .key        the CA of client certificates (engramd's tls_ca_file)
  client.pem / client.key     a client certificate of client_ca (an operator's)
  rogue_client.pem / .key     a client certificate of the unrelated CA
Nothing here is secret: the keys live and die with the test's temporary directory.
"""
import os
import shutil
import ssl
import subprocess

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"

CONFIG = """\
[ req ]
distinguished_name = dn
prompt = no
[ dn ]
CN = placeholder
[ v3_ca ]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[ server ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
[ client ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
[ ca ]
default_ca = testca
[ testca ]
database = {dir}/index.txt
new_certs_dir = {dir}/newcerts
serial = {dir}/serial
default_md = sha256
policy = anything
unique_subject = no
[ anything ]
commonName = supplied
"""


def _run(*args):
    r = subprocess.run([OPENSSL] + list(args), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {r.stderr.strip()}")


def _key_and_csr(d, cnf, name, cn):
    key, csr = os.path.join(d, name + ".key"), os.path.join(d, name + ".csr")
    _run("req", "-new", "-config", cnf, "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=" + cn)
    os.chmod(key, 0o600)
    return key, csr


def _ca(d, cnf, name, cn):
    key, pem = os.path.join(d, name + ".key"), os.path.join(d, name + ".pem")
    _run("req", "-x509", "-new", "-config", cnf, "-extensions", "v3_ca", "-newkey", "ec",
         "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", pem,
         "-days", "3650", "-subj", "/CN=" + cn)
    os.chmod(key, 0o600)
    return pem, key


def _sign(d, cnf, csr, ca, ca_key, out, ext, serial, days=30):
    _run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-set_serial", str(serial),
         "-days", str(days), "-extfile", cnf, "-extensions", ext, "-out", os.path.join(d, out))


def make_pki(d):
    """Writes the files listed above into directory d; returns {name: path}."""
    os.makedirs(os.path.join(d, "newcerts"), exist_ok=True)
    cnf = os.path.join(d, "openssl.cnf")
    with open(cnf, "w") as f:
        f.write(CONFIG.format(dir=d))
    open(os.path.join(d, "index.txt"), "w").close()
    with open(os.path.join(d, "serial"), "w") as f:
        f.write("2001\n")
    ca, ca_key = _ca(d, cnf, "ca", "Engram Test CA")
    other_ca, other_key = _ca(d, cnf, "other_ca", "Unrelated CA")
    client_ca, client_ca_key = _ca(d, cnf, "client_ca", "Engram Operators CA")

    _, csr = _key_and_csr(d, cnf, "server", "localhost")
    _sign(d, cnf, csr, ca, ca_key, "server.pem", "server", 0x1001)
    # the same key, dated in the past, through `openssl ca` (the only way to pick the dates)
    _run("ca", "-batch", "-config", cnf, "-name", "testca", "-cert", ca, "-keyfile", ca_key,
         "-in", csr, "-out", os.path.join(d, "expired.pem"), "-startdate", "20200101000000Z",
         "-enddate", "20200201000000Z", "-extfile", cnf, "-extensions", "server", "-notext")
    _, csr = _key_and_csr(d, cnf, "server2", "localhost")
    _sign(d, cnf, csr, ca, ca_key, "server2.pem", "server", 0x1002)
    _, csr = _key_and_csr(d, cnf, "other_server", "localhost")
    _sign(d, cnf, csr, other_ca, other_key, "other_server.pem", "server", 0x1003)
    _, csr = _key_and_csr(d, cnf, "client", "operator")
    _sign(d, cnf, csr, client_ca, client_ca_key, "client.pem", "client", 0x1004)
    _, csr = _key_and_csr(d, cnf, "rogue_client", "operator")
    _sign(d, cnf, csr, other_ca, other_key, "rogue_client.pem", "client", 0x1005)
    names = ["ca", "other_ca", "client_ca", "server", "server2", "other_server", "client",
             "rogue_client"]
    out = {}
    for n in names:
        out[n] = os.path.join(d, n + ".pem")
        out[n + "_key"] = os.path.join(d, n + ".key")
    out["expired"] = os.path.join(d, "expired.pem")
    out["expired_key"] = out["server_key"]
    return out


def client_context(ca, cert=None, key=None, max_version=None):
    """An ssl.SSLContext that verifies the server against ca (name checked), optionally
    presenting cert/key, optionally capped at max_version (an ssl.TLSVersion)."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    if max_version is not None:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.maximum_version = max_version
    return ctx


def tls_flags(pki, cert="server", ca_file=None, admin_cert=False):
    """engramd's flags for TLS with pki's cert (a name of make_pki's)."""
    flags = ["--tls-cert-file", pki[cert], "--tls-key-file", pki[cert + "_key"]]
    if ca_file:
        flags += ["--tls-ca-file", ca_file]
    if admin_cert:
        flags += ["--tls-admin-require-client-cert", "1"]
    return flags


def peer_der(port, ca, host="127.0.0.1"):
    """The DER bytes of the certificate the server at port presents now."""
    import socket
    with socket.create_connection((host, port), timeout=10) as s:
        with client_context(ca).wrap_socket(s, server_hostname=host) as t:
            return t.getpeercert(binary_form=True)


def metric(text, name):
    """The value of the metric line named exactly name (labels included), or None."""
    for line in text.splitlines():
        if line.split(" ", 1)[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return None
