import csv,collections,sys,lzma
rows=[r for r in csv.reader(lzma.open(sys.argv[1],'rt')) if len(r)>10]
hdr=rows[0]; ki=hdr.index('Kernel Name'); ti=hdr.index('gpu__time_duration.sum'); gi=hdr.index('Grid Size')
data=[]
for r in rows[1:]:
    try: data.append((r[ki].split('(')[0], r[gi], float(r[ti].replace(',',''))))
    except: pass
idx=[i for i,d in enumerate(data) if d[0].startswith('argmax_final')]
sel=data[idx[-2]+1:idx[-1]+1]
agg=collections.defaultdict(lambda:[0,0.0])
for n,g,t in sel: agg[n+' '+g][0]+=1; agg[n+' '+g][1]+=t
tot=sum(v[1] for v in agg.values()); print(f"launches {len(sel)} total {tot/1e6:.3f} ms")
for k,(n,t) in sorted(agg.items(), key=lambda kv:-kv[1][1])[:22]: print(f"{t/1e3:8.1f} us n={n:4d} mean={t/n/1e3:7.2f} {k}")
