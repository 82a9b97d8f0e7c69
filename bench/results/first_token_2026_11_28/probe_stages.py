"""Throwaway (2026-11-28): p50 of each stage of a warm fast-lane first token, from the timestamps
the probe patch writes in the gateway (probe_gateway_*.txt: recv, task, r0..r3 in the router, l0..l2
in the lane, add/frame/sink in HeadClient, send start/end in the WebSocket session) and the client's
(probe_client_*.txt: send, created, first delta), all CLOCK_MONOTONIC ns; the last 150 requests."""
import statistics as st
import sys

KEYS = ["recv", "task", "r0", "r1", "r2", "r3", "l0", "l1", "l2", "add", "frame", "sink", "send0", "send1"]


def main(gw_path: str, client_path: str) -> None:
    gw = [list(map(int, line.split())) for line in open(gw_path)][-150:]
    cl = [list(map(int, line.split())) for line in open(client_path)][-150:]
    rows = [[("client send", t0)] + list(zip(KEYS, g)) + [("client delta", tf)] for (t0, _, tf), g in zip(cl, gw)]
    for i in range(1, len(rows[0])):
        xs = sorted((r[i][1] - r[i - 1][1]) / 1e3 for r in rows)
        print(f"{rows[0][i - 1][0]:>12s} -> {rows[0][i][0]:<12s} p50 {st.median(xs):7.0f} us  "
              f"p10 {xs[len(xs) // 10]:6.0f}  p90 {xs[9 * len(xs) // 10]:6.0f}")
    print("total, client send -> first delta, p50 us:", st.median((r[-1][1] - r[0][1]) / 1e3 for r in rows))


if __name__ == "__main__":
    main(*sys.argv[1:3])
