import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; ki = hdr.index('Kernel Name'); vi = hdr.index('Metric Value'); gi = hdr.index('Grid Size'); ii = hdr.index('ID')
data = [(int(r[ii]), r[ki].split('(')[0], r[gi], float(r[vi].replace(',', ''))) for r in rows[1:]]
lo = int(sys.argv[2]) if len(sys.argv) > 2 else 0; hi = int(sys.argv[3]) if len(sys.argv) > 3 else len(data)
sel = [d for d in data if lo <= d[0] < hi]
agg = collections.defaultdict(lambda: [0, 0.0])
for _, n, g, t in sel: agg[n + ' ' + g][0] += 1; agg[n + ' ' + g][1] += t
tot = sum(v[1] for v in agg.values())
print(f"launches {len(sel)} total {tot/1e6:.3f} ms")
for k, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:int(sys.argv[4]) if len(sys.argv) > 4 else 40]:
    print(f"{t/1e3:9.1f} us  n={n:4d}  mean={t/n/1e3:8.2f}us  {k}")
