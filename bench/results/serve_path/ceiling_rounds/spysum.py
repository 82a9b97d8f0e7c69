"""Throwaway: summarize a py-spy ``--format raw`` profile (self and inclusive share per frame).

Usage: python spysum.py PROFILE.txt"""
import collections
import sys


def main(path: str) -> None:
    self_c, incl, tot = collections.Counter(), collections.Counter(), 0
    for line in open(path):
        stack, n = line.rstrip().rsplit(" ", 1)
        n = int(n)
        frames = [f.split(" (")[0] + " " + (f.split("/")[-1].rstrip(")") if "/" in f else "") for f in stack.split(";")]
        tot += n
        self_c[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    print("total", tot)
    print("-- self")
    for k, v in self_c.most_common(25):
        print(f"{100 * v / tot:5.1f}% {k[:150]}")
    print("-- inclusive")
    for k, v in incl.most_common(45):
        print(f"{100 * v / tot:5.1f}% {k[:150]}")


if __name__ == "__main__":
    main(sys.argv[1])
