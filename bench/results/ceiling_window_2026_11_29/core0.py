"""Over N s: CPU time of threads allowed on CPU 0, and the engine threads' runqueue waits (schedstat)."""
import os, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main")
from bench.cpu_profile import _title, role
TCK = os.sysconf("SC_CLK_TCK")
def snap():
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit(): continue
        try:
            for t in (p / "task").iterdir():
                st = (t / "stat").read_text().rsplit(")", 1)
                comm = st[0].split("(", 1)[1]; f = st[1].split()
                allowed = [l for l in (t / "status").read_text().splitlines() if l.startswith("Cpus_allowed_list")][0].split()[1]
                run, wait, slices = map(int, (t / "schedstat").read_text().split())
                out[(int(p.name), int(t.name))] = (comm, allowed, run, wait, slices, int(f[36]))
        except (OSError, IndexError):
            pass
    return out
n = float(sys.argv[1]) if len(sys.argv) > 1 else 10
a = snap(); time.sleep(n); b = snap()
rows = []
for k, v in b.items():
    if k not in a: continue
    dr, dw, ds = v[2]-a[k][2], v[3]-a[k][3], v[4]-a[k][4]
    if dr == 0 and dw == 0: continue
    rows.append((dr, dw, ds, v[1], role(_title(k[0])) or _title(k[0])[:30], v[0], k))
by = {}
for dr, dw, ds, al, r, comm, k in rows:
    x = by.setdefault((al, r), [0, 0, 0]); x[0] += dr; x[1] += dw; x[2] += ds
print(f"{'allowed':10s} {'role':32s} {'run%':>7s} {'rq wait%':>8s} {'slices/s':>9s}")
for (al, r), (dr, dw, ds) in sorted(by.items(), key=lambda kv: -kv[1][0]):
    if dr / n / 1e9 * 100 < 0.3: continue
    print(f"{al:10s} {r[:32]:32s} {dr/n/1e7:7.2f} {dw/n/1e7:8.2f} {ds/n:9.1f}")
print("\ntop threads:")
for dr, dw, ds, al, r, comm, k in sorted(rows, reverse=True)[:12]:
    print(f"{al:6s} {r[:28]:28s} {comm:16s} run {dr/n/1e7:6.2f}% wait {dw/n/1e7:6.2f}% slices {ds/n:7.1f}/s")
