import os, sys, time
from pathlib import Path
def snap():
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit(): continue
        try:
            for t in (p/"task").iterdir():
                comm = (t/"comm").read_text().strip()
                run, wait, n = map(int, (t/"schedstat").read_text().split())
                aff = os.sched_getaffinity(int(t.name))
                out[(int(p.name), int(t.name))] = (comm, run, wait, n, aff)
        except OSError: pass
    return out
if __name__ == "__main__":
    n = float(sys.argv[1])
    a = snap(); time.sleep(n); b = snap()
    rows = []
    for k, v in b.items():
        if k in a:
            rows.append(((v[1]-a[k][1])/1e9/n, (v[2]-a[k][2])/1e9/n, (v[3]-a[k][3])/n, v[0], k, sorted(v[4])))
    rows.sort(reverse=True)
    print("run%  runqueue-wait%  slices/s  comm  pid/tid  cpus")
    for r in rows[:15]:
        print(f"{r[0]*100:6.1f} {r[1]*100:6.1f} {r[2]:8.0f}  {r[3]:18s} {r[4]} {r[5]}")
