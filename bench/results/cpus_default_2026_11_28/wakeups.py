"""Per process (and its busiest threads): CPU and wake-ups (voluntary context switches) over N s."""
import os, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main")
from bench.cpu_profile import _title, role

NV = {}
def snap():
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            for t in (p / "task").iterdir():
                st = (t / "stat").read_text().rsplit(")", 1)
                comm = st[0].split("(", 1)[1]
                f = st[1].split()
                cpu = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
                ls = (t / "status").read_text().splitlines()
                vcs = int([l for l in ls if l.startswith("voluntary_ctxt")][0].split()[1])
                nv = int([l for l in ls if l.startswith("nonvoluntary_ctxt")][0].split()[1])
                NV[(int(p.name), int(t.name))] = nv
                out[(int(p.name), int(t.name))] = (comm, cpu, vcs)
        except OSError:
            pass
    return out

if __name__ == "__main__":
    n = float(sys.argv[1]) if len(sys.argv) > 1 else 20
    a = snap(); nv0 = dict(NV); time.sleep(n); b = snap()
    top = sorted(((NV[k]-nv0.get(k,0), k, b[k][0], b[k][1]-a[k][1]) for k in b if k in a), reverse=True)[:8]
    print('most preempted threads (involuntary/s, cpu%):')
    [print(f'{d/n:8.1f}/s {c/n*100:6.1f}% {role(_title(k[0])) or _title(k[0])[:30]} {comm}') for d,k,comm,c in top]
    per = {}
    thr = []
    for k, (comm, cpu, vcs) in b.items():
        if k not in a: continue
        dc, dv = cpu - a[k][1], vcs - a[k][2]
        if dc == 0 and dv == 0: continue
        r = role(_title(k[0])) or _title(k[0])[:40]
        x = per.setdefault(r, [0, 0]); x[0] += dc; x[1] += dv
        thr.append((dv / n, dc / n * 100, r, comm))
    print(f"{'role':40s} {'cpu%':>6s} {'wakeups/s':>10s}")
    for r, (c, v) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{r[:40]:40s} {c/n*100:6.2f} {v/n:10.1f}")
    print("tot", sum(c for c, v in per.values()) / n * 100, sum(v for c, v in per.values()) / n)
    print("\nbusiest threads by wake-ups/s:")
    for w, c, r, comm in sorted(thr, reverse=True)[:30]:
        print(f"{w:8.1f}/s {c:6.2f}% {r[:30]:30s} {comm}")
