"""Compare two planner_record.py JSON files: everything exact, recomputation seconds to 1e-12."""
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
def close(x, y):
    x, y = float(x), float(y)
    return x == y or abs(x - y) <= 1e-12 * max(abs(x), abs(y))
def norm(rec):
    """(record without float seconds, list of seconds)"""
    if not isinstance(rec, dict):
        return rec, []
    r = dict(rec); secs = [r.pop("recompute_seconds")]
    r["candidates"] = [(n, p) for n, p, s in rec["candidates"]]; secs += [s for *_, s in rec["candidates"]]
    r["regions"] = [x[:4] for x in rec["regions"]]; secs += [x[4] for x in rec["regions"]]
    return r, secs
bad = exact = 0
for k in b:
    for sub in b[k]:
        (x, xs), (y, ys) = norm(a[k][sub]), norm(b[k][sub])
        if x != y or len(xs) != len(ys) or not all(close(p, q) for p, q in zip(xs, ys)):
            bad += 1; print("DIFF", k, sub)
        elif xs != ys:
            exact += 1
print(f"{len(b)} cases compared, {bad} records differ, {exact} records equal but seconds within 1e-12 (not bitwise)")
