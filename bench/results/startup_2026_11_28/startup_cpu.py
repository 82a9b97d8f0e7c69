"""Per role: CPU seconds used in each 5 s window while `fastmode up` starts (until 'ready in')."""
import os, sys, time, subprocess
sys.path.insert(0, "/work/main")
from bench.cpu_profile import _title, role
from pathlib import Path
TCK = os.sysconf("SC_CLK_TCK")
def snap():
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit(): continue
        try:
            f = (p / "stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(f[11]) + int(f[12])) / TCK
            out[int(p.name)] = (role(_title(int(p.name))) or _title(int(p.name))[:28], cpu)
        except OSError: pass
    return out
log = open(sys.argv[1], "w")
proc = subprocess.Popen(["/work/main/.venv/bin/fastmode", "up", "--port", "18000"] + sys.argv[2:], stdout=log, stderr=subprocess.STDOUT, cwd="/work/main")
t0 = time.time(); prev = snap(); total = {}
while True:
    time.sleep(5)
    cur = snap(); d = {}
    for pid, (r, c) in cur.items():
        c0 = prev[pid][1] if pid in prev else 0.0
        d[r] = d.get(r, 0) + c - c0
        total[r] = total.get(r, 0) + c - c0
    prev = cur
    top = sorted(d.items(), key=lambda x: -x[1])[:6]
    print(f"{time.time()-t0:5.0f}s " + "  ".join(f"{r[:22]}={v:.1f}" for r, v in top if v > 0.2), flush=True)
    if "ready in" in open(sys.argv[1]).read(): break
print("total CPU s by role until ready:")
for r, v in sorted(total.items(), key=lambda x: -x[1])[:20]:
    print(f"  {v:7.1f}  {r}")
print(open(sys.argv[1]).read()[-600:])
