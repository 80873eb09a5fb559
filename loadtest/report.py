#!/usr/bin/env python3
"""scripts/bench's results: one progress line per measurement (--line, a TSV row on stdin), or
the table of medians, the targets of issue 25, the thread counts' line (--threads) and the
ratios line (a results.tsv file).

A row: round, setup, wrk's `BENCH k=v ...` line, then clock ticks of CPU (utime+stime) spent
during the measured run by the proxy, the worker, redis-server and wrk, whether the setup uses
Redis, ticks per second, and the box's busy and total ticks (/proc/stat, all cores).
"""

import statistics
import sys

ORDER = ["bare-direct", "bare-pinboard", "bare-pinboard-1t", "bare-pinboard-2t",
         "bare-pinboard-fresh", "bare-nginx", "bare-haproxy", "bare-nginx-lua-redis",
         "direct", "pinboard", "pinboard-access-log", "pinboard-https", "pinboard-https-worker",
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
        "proxy": per100k(f[3]) if f[1] not in ("direct", "bare-direct") else None,
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
        f"round {r['round']} {r['setup']:<20} {r['rps']:>9.0f} req/s  p50 {ms(r['p50'])}  "
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

    # Issue 25's targets, on the bare-worker legs (on the pinned-example legs in a run without
    # them: --tls, --access-log).
    legs = "bare-" if any(s.startswith("bare-") for s in med) else ""
    pb = med.get(legs + "pinboard")
    if pb:
        print()
        print(f"issue 25's targets, on the {'bare-worker' if legs else 'pinned-example'} legs:")
        checks = []
        nginx = med.get(legs + "nginx")
        for peer, want in (("nginx", 0.65), ("haproxy", 0.65), ("nginx-lua-redis", 1.8)):
            if legs + peer in med:
                r = ratio(legs + "pinboard", legs + peer)
                checks.append((r >= want, f"steady req/s >= {want}x {peer}: {r:.2f}x"))
        if nginx and pb["proxy"] is not None and nginx["proxy"]:
            r = pb["proxy"] / nginx["proxy"]
            checks.append((r <= 1.0, f"proxy CPU per request <= 1.0x nginx's: {r:.2f}x "
                                     f"({pb['proxy']:.3f} vs {nginx['proxy']:.3f} s/100k)"))
        if nginx:
            r = pb["p99"] / nginx["p99"]
            checks.append((r <= 1.2, f"p99 <= 1.2x nginx's: {ms(pb['p99'])} vs "
                                     f"{ms(nginx['p99'])} ({r:.2f}x)"))
        if legs + "pinboard-fresh" in med:
            r = ratio(legs + "pinboard-fresh", legs + "pinboard")
            checks.append((r >= 0.6, f"fresh-placement req/s >= 0.6x steady: {r:.2f}x"))
        if nginx and nginx["worker"]:
            r = pb["worker"] / nginx["worker"]
            checks.append((r <= 1.25, f"worker CPU per request behind pinboard <= 1.25x behind "
                                      f"nginx: {r:.2f}x ({pb['worker']:.3f} vs "
                                      f"{nginx['worker']:.3f} s/100k)"))
        if pb["redis"] is not None:
            # CPU seconds per 100k requests, in microseconds per request.
            us = pb["redis"] * 1e6 / 1e5
            checks.append((us <= 6.0, f"redis CPU <= 6 us per steady request: {us:.1f} us"))
        for ok, text in checks:
            print(f"target {'met   ' if ok else 'MISSED'} {text}")
        if any(med[s]["errors"] for s in med):
            print("warning: some runs had errors (non-2xx answers or socket errors): "
                  "see the errors column")
    # scripts/bench --threads: one node with one event loop against one with two.
    one, two = med.get("bare-pinboard-1t"), med.get("bare-pinboard-2t")
    if one and two:
        print()
        for n, m in ((1, one), (2, two)):
            print(f"threads: PINBOARD_THREADS={n}: {m['rps']:.0f} req/s, proxy CPU "
                  f"{m['proxy']:.3f} s/100k ({m['proxy'] * 10:.1f} us per request), "
                  f"redis {m['redis'] * 10:.1f} us per request, p99 {ms(m['p99'])}")
        print(f"threads: 2/1 req/s {ratio('bare-pinboard-2t', 'bare-pinboard-1t'):.2f}x, "
              f"proxy CPU per request {two['proxy'] / one['proxy']:.2f}x")
        nginx = med.get("bare-nginx")
        if nginx:
            print(f"threads: proxy CPU per request against bare-nginx's ({nginx['proxy']:.3f} "
                  f"s/100k): 1 loop {one['proxy'] / nginx['proxy']:.2f}x, "
                  f"2 loops {two['proxy'] / nginx['proxy']:.2f}x")
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
    def ratios(p):
        return (f"pinboard/nginx={ratio(p + 'pinboard', p + 'nginx'):.2f} "
                f"pinboard/nginx-lua-redis={ratio(p + 'pinboard', p + 'nginx-lua-redis'):.2f} "
                f"pinboard/direct={ratio(p + 'pinboard', p + 'direct'):.2f} "
                f"pinboard/haproxy={ratio(p + 'pinboard', p + 'haproxy'):.2f}")

    if legs and "pinboard" in med:
        print(f"ratios, pinned-example legs: {ratios('')}")
    if legs + "pinboard" in med:
        print(f"ratios: {ratios(legs)} ({'bare-worker' if legs else 'pinned-example'} legs)")


if __name__ == "__main__":
    if sys.argv[1:] == ["--line"]:
        for row in sys.stdin:
            if row.strip():
                print(line(parse(row)), flush=True)
    else:
        table(sys.argv[1])
