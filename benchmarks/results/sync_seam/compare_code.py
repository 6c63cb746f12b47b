import subprocess, re, sys
def funcs(path):
    out = subprocess.run(["objdump","-d","--no-show-raw-insn","-C",path],capture_output=True,text=True).stdout
    f={}; cur=None
    for line in out.splitlines():
        m=re.match(r'^[0-9a-f]+ <(.*)>:$', line)
        if m: cur=m.group(1); f[cur]=[]; continue
        if cur and '\t' in line:
            ins=line.split('\t',1)[1]
            ins=re.sub(r'[0-9a-f]{4,}','ADDR',ins); ins=re.sub(r'<[^>]*>','<SYM>',ins)
            f[cur].append(ins)
    return f
a=funcs(sys.argv[1]); b=funcs(sys.argv[2])
def norm(n): return n.replace(", teardown::std_sync","")
bn={norm(k):v for k,v in b.items()}
same=diff=0; diffs=[]
for k,v in a.items():
    if 'teardown::' not in k: continue
    if k in bn:
        if v==bn[k]: same+=1
        else: diff+=1; diffs.append((k,len(v),len(bn[k])))
print("teardown functions identical:",same,"different:",diff)
for d in diffs[:15]: print(" ",d[1],d[2],d[0][:150])
