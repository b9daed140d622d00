import json, sys
def rounds(path):
    out, cur = [], None
    for line in open(path):
        c = json.loads(line)
        if c[0] == "--- round":
            cur = [c[1], []]; out.append(cur)
        else:
            cur[1].append(line)
    return [(label, sorted(calls)) for label, calls in out]
a, b = rounds(sys.argv[1]), rounds(sys.argv[2])
same = True
for (la, ca), (lb, cb) in zip(a, b):
    if ca != cb:
        same = False
        print("round", la, "differs:", len(ca), len(cb))
        import difflib
        for d in difflib.unified_diff(ca, cb, lineterm="", n=0):
            print(d[:300])
print("identical per round (as multisets)" if same and len(a) == len(b) else "DIFFERENT")
