#!/usr/bin/env python3
"""scripts/bench's results: one progress line per measurement (--line, a TSV row on stdin), or
the table of medians, the targets of issue 11 and the ratios line (a results.tsv file).

A row: round, setup, wrk's `BENCH k=v ...` line, then clock ticks of CPU (utime+stime) spent
during the measured run by the proxy, the worker, redis-server and wrk, whether the setup uses
Redis, ticks per second, and the box's busy and total ticks (/proc/stat, all cores).
"""

import statistics
import sys

ORDER = ["direct", "pinboard", "pinboard-access-log", "pinboard-https", "pinboard-https-worker",
         "pinboard-fresh",
         "nginx", "nginx-https", "haproxy", "nginx-lua-redis"]


def parse(row):
    f = row.rstrip("\n").split("\t")
    bench = dict(kv.split("=", 1) for kv in f[2].split()[1:])
    hz = float(f[8])
    requests = int(bench["requests"])
    per100k = lambda ticks: int(ticks) / hz / requests * 1e5 if requests else float("nan")
    ours = sum(int(x) for x in f[3:7])
    busy, total = int(f[9]), int(f[10])
    errors = sum(int(bench[k]) for k in ("connect", "read", "write", "status", "timeout"))
    return {
        "round": int(f[0]),
        "setup": f[1],
        "rps": float(bench["rps"]),
        "p50": int(bench["p50_us"]),
        "p99": int(bench["p99_us"]),
        "p999": int(bench["p999_us"]),
        "proxy": per100k(f[3]) if f[1] != "direct" else None,
        "worker": per100k(f[4]),
        "redis": per100k(f[5]) if f[7] == "1" else None,
        "wrk": per100k(f[6]),
        "errors": errors,
        "requests": requests,
        # Shares of the whole box (all cores) during the run.
        "busy": 100.0 * busy / total if total else float("nan"),
        "outside": 100.0 * max(0, busy - ours) / total if total else float("nan"),
    }


def ms(us):
    return f"{us / 1000:.2f} ms"


def cpu(x):
    return "-" if x is None else f"{x:.3f}"


def line(r):
    return (
        f"round {r['round']} {r['setup']:<16} {r['rps']:>9.0f} req/s  p50 {ms(r['p50'])}  "
        f"p99 {ms(r['p99'])}  p99.9 {ms(r['p999'])}  CPU s/100k: proxy {cpu(r['proxy'])} "
        f"worker {cpu(r['worker'])} redis {cpu(r['redis'])} wrk {cpu(r['wrk'])}  "
        f"errors {r['errors']}  box busy {r['busy']:.0f}% (outside bench {r['outside']:.0f}%)"
    )


def median(rows, key):
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def table(path):
    rows = [parse(l) for l in open(path) if l.strip()]
    setups = [s for s in ORDER if any(r["setup"] == s for r in rows)]
    med = {}
    for s in setups:
        mine = [r for r in rows if r["setup"] == s]
        med[s] = {k: median(mine, k) for k in mine[0] if k not in ("round", "setup")}
        med[s]["errors"] = sum(r["errors"] for r in mine)
        med[s]["rounds"] = len(mine)
    head = ["setup", "req/s", "p50", "p99", "p99.9", "proxy CPU", "worker CPU", "redis CPU",
            "wrk CPU", "errors", "box busy", "outside"]
    out = [head]
    for s in setups:
        m = med[s]
        out.append([s, f"{m['rps']:.0f}", ms(m["p50"]), ms(m["p99"]), ms(m["p999"]),
                    cpu(m["proxy"]), cpu(m["worker"]), cpu(m["redis"]), cpu(m["wrk"]),
                    str(m["errors"]), f"{m['busy']:.0f}%", f"{m['outside']:.0f}%"])
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in out[1:]:
        print("| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                for i, (c, w) in enumerate(zip(row, widths))) + " |")
    print("CPU columns: CPU seconds per 100k requests (utime+stime from /proc/PID/stat); "
          "box busy / outside: share of all cores busy, and busy outside the bench's processes.")

    def ratio(a, b):
        if a in med and b in med and med[b]["rps"]:
            return med[a]["rps"] / med[b]["rps"]
        return float("nan")

    pb = med.get("pinboard")
    if pb:
        print()
        checks = []
        # Issue 11's targets.
        for peer, want in (("nginx", 0.85), ("haproxy", 0.85), ("nginx-lua-redis", 2.0)):
            if peer in med:
                r = ratio("pinboard", peer)
                checks.append((r >= want, f"steady req/s >= {want}x {peer}: {r:.2f}x"))
        if pb["redis"] is not None:
            checks.append((pb["redis"] <= 0.8, f"redis CPU <= 0.8 s per 100k steady requests: "
                                               f"{pb['redis']:.3f}"))
        if "nginx" in med and pb["proxy"] is not None and med["nginx"]["proxy"]:
            r = pb["proxy"] / med["nginx"]["proxy"]
            checks.append((r <= 1.1, f"proxy CPU per request <= 1.1x nginx's: {r:.2f}x"))
        if "nginx" in med:
            r = pb["p99"] / med["nginx"]["p99"]
            checks.append((r <= 1.5, f"p99 <= 1.5x nginx's: {ms(pb['p99'])} vs "
                                     f"{ms(med['nginx']['p99'])} ({r:.2f}x)"))
        if "pinboard-fresh" in med:
            r = ratio("pinboard-fresh", "pinboard")
            checks.append((r >= 0.6, f"fresh-placement req/s >= 0.6x steady: {r:.2f}x"))
        for ok, text in checks:
            print(f"target {'met   ' if ok else 'MISSED'} {text}")
        if any(med[s]["errors"] for s in med):
            print("warning: some runs had errors (non-2xx answers or socket errors): "
                  "see the errors column")
    # scripts/bench --tls and --access-log: what TLS costs each proxy on each side, and what the
    # access log costs pinboard, from the same run.
    for what, plain, tls in (("tls", "pinboard", "pinboard-https"),
                             ("tls", "pinboard", "pinboard-https-worker"),
                             ("tls", "nginx", "nginx-https"),
                             ("access log", "pinboard", "pinboard-access-log")):
        if plain in med and tls in med and med[plain]["proxy"] and med[tls]["proxy"]:
            extra = med[tls]["proxy"] - med[plain]["proxy"]
            print(f"{what}: {tls}/{plain} req/s {ratio(tls, plain):.2f}, proxy CPU per 100k "
                  f"{med[tls]['proxy']:.3f} vs {med[plain]['proxy']:.3f} s "
                  f"(+{extra:.3f} s, {extra * 1e6 / 1e5:.1f} us per request), "
                  f"worker CPU {med[tls]['worker']:.3f} vs {med[plain]['worker']:.3f} s, "
                  f"wrk CPU {med[tls]['wrk']:.3f} vs {med[plain]['wrk']:.3f} s")
    print(f"ratios: pinboard/nginx={ratio('pinboard', 'nginx'):.2f} "
          f"pinboard/nginx-lua-redis={ratio('pinboard', 'nginx-lua-redis'):.2f} "
          f"pinboard/direct={ratio('pinboard', 'direct'):.2f} "
          f"pinboard/haproxy={ratio('pinboard', 'haproxy'):.2f}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--line"]:
        for row in sys.stdin:
            if row.strip():
                print(line(parse(row)), flush=True)
    else:
        table(sys.argv[1])
