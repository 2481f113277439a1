import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
# find header
h = None
for i, r in enumerate(rows):
    if 'Kernel Name' in r and 'gpu__time_duration.sum' in r:
        h = i; break
hdr = rows[h]; ki = hdr.index('Kernel Name'); ti = hdr.index('gpu__time_duration.sum'); gi = hdr.index('Grid Size') if 'Grid Size' in hdr else None
steps = float(sys.argv[2])
agg = collections.defaultdict(lambda: [0, 0.0])
for r in rows[h+1:]:
    if len(r) <= ti: continue
    try: t = float(r[ti].replace(',', ''))
    except: continue
    name = r[ki].split('(')[0]
    key = name + (' ' + r[gi] if gi is not None else '')
    agg[key][0] += 1; agg[key][1] += t
tot = sum(v[1] for v in agg.values())
print(f"total {tot/1e3/steps:.3f} us... per step ms: {tot/1e6/steps:.3f} (units as reported)")
for k, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"{t/1e6/steps:8.3f} ms/step  n/step={n/steps:6.1f}  mean={t/n/1e3:8.2f}us  {k}")
