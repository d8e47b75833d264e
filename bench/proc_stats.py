"""bench/proc_stats.py: CPU time and load of processes on this machine, from /proc, for the
benchmarks that report where CPU goes (many_tenants.py, citus_cost.py)."""
import os


def cpu_s(pids):
    """user + system CPU seconds of the processes pids (and the children they reaped)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except OSError:
            pass
    return total / tick


def pg_pids(postmaster):
    """A PostgreSQL server's processes: its postmaster and the postmaster's children."""
    out = [postmaster]
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == postmaster:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def load_avg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])
