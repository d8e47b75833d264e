"""The deployment files hold together: systemd accepts the unit (systemd-analyze verify,
with ExecStart pointed at the engramd under test), the unit keeps its hardening, and the
container's runtime stage installs a Debian package for every shared library engramd links
directly."""
import os
import re
import shutil
import subprocess
import tempfile

from harness import BIN, require_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
UNIT = os.path.join(ROOT, "deploy", "systemd", "engramd.service")
CONTAINERFILE = os.path.join(ROOT, "deploy", "container", "Containerfile")


def unit_settings():
    out = {}
    with open(UNIT) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith(("#", "[")):
                k, _, v = line.partition("=")
                out.setdefault(k, []).append(v)
    return out


def test_systemd_accepts_the_unit():
    require_env()
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (Debian's systemd package; deploy/lib.sh lists it)"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "engramd.service")
        with open(UNIT) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace("/usr/local/bin/engramd", os.path.abspath(BIN)))
        r = subprocess.run([analyze, "verify", path], capture_output=True, text=True,
                           timeout=60, cwd=d)
        assert r.returncode == 0 and not r.stderr.strip(), r.stderr
        r = subprocess.run([analyze, "security", "--offline=yes", "--threshold=20", path],
                           capture_output=True, text=True, timeout=60, cwd=d)
        # exposure above 2.0 (of 10) fails: the unit scores 1.5 ("OK") today
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr


def test_unit_hardening_and_notify():
    u = unit_settings()
    want = {"Type": "notify", "DynamicUser": "yes", "ProtectSystem": "strict",
            "NoNewPrivileges": "yes", "ProtectHome": "yes", "PrivateTmp": "yes",
            "StateDirectory": "engram", "CapabilityBoundingSet": "",
            "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6"}
    for k, v in want.items():
        assert u.get(k) == [v], (k, u.get(k))
    assert "@system-service" in u["SystemCallFilter"]
    assert u["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert "--config /etc/engram/engramd.conf" in u["ExecStart"][0]


def test_container_runtime_has_every_linked_library():
    require_env()
    with open(CONTAINERFILE) as f:
        text = f.read()
    runtime = text[text.index("FROM debian:12-slim"):]
    m = re.search(r"apt-get install[^\n]*\n((?:.*\\\n)+)", runtime)
    pkgs = set(re.findall(r"[a-z0-9][a-z0-9.+-]+", m.group(1).replace("\\", " ")))
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]",
                        subprocess.run(["readelf", "-d", BIN], capture_output=True, text=True,
                                       check=True).stdout)
    ldd = subprocess.run(["ldd", BIN], capture_output=True, text=True, check=True).stdout
    paths = dict(re.findall(r"^\s*(\S+) => (\S+)", ldd, re.M))
    missing = []
    for lib in needed:
        if lib.startswith(("libasan", "libubsan", "libtsan", "libc.so", "libm.so",
                           "ld-linux", "libgcc_s")):
            continue  # the sanitizers of the test build; libc6 and libgcc-s1 are in any Debian
        path = os.path.realpath(paths[lib])
        owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
        if owner.returncode != 0:  # /lib vs /usr/lib (merged /usr)
            owner = subprocess.run(["dpkg", "-S", path.replace("/usr/lib/", "/lib/", 1)],
                                   capture_output=True, text=True)
        pkg = owner.stdout.split(":")[0]
        if pkg not in pkgs:
            missing.append(f"{lib} ({pkg or 'no package'})")
    assert not missing, "the runtime stage lacks: " + ", ".join(missing)
