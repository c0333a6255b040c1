import time, sys, numpy as np, jax, jax.numpy as jnp
L=30; H=576; I=1536; KV=192; V=49152
rng=np.random.default_rng(0)
def w(k,n): return rng.standard_normal((k,n),np.float32)*0.02
shapes=[(H,H),(H,KV),(H,KV),(H,H),(H,I),(H,I),(I,H)]
KN=[[jnp.asarray(w(k,n)) for k,n in shapes] for _ in range(L)]
NK=[[jnp.asarray(np.ascontiguousarray(np.asarray(a).T)) for a in layer] for layer in KN]
lmKN=jnp.asarray(w(H,V)); lmNK=jnp.asarray(np.ascontiguousarray(np.asarray(lmKN).T))
def mm_kn(x,a): return jnp.einsum("...i,io->...o",x,a)
def mm_nk(x,a): return jnp.einsum("...i,oi->...o",x,a)
def body(x, layers, mm):
    for q,k,v,o,g,u,d in layers:
        a=mm(x,q)+jnp.sum(mm(x,k))+jnp.sum(mm(x,v))
        x=x+mm(a,o)
        h=jax.nn.silu(mm(x,g))*mm(x,u); x=x+mm(h,d)
    return x
fk=jax.jit(lambda x,ls: body(x,ls,mm_kn)); fn=jax.jit(lambda x,ls: body(x,ls,mm_nk))
hk=jax.jit(mm_kn); hn=jax.jit(mm_nk)
def t(f,*a,n=9):
    f(*a).block_until_ready(); ts=[]
    for _ in range(n):
        s=time.perf_counter(); f(*a).block_until_ready(); ts.append(time.perf_counter()-s)
    return np.median(ts)*1e3
res={}
for rnd in range(3):
    for rows in (1,4,8):
        x=jnp.ones((rows,H),jnp.float32)*0.01
        for name,f,ls in (("layersKN",fk,KN),("layersNK",fn,NK),("lmKN",hk,lmKN),("lmNK",hn,lmNK)):
            res.setdefault((name,rows),[]).append(t(f,x,ls))
for (name,rows),v in sorted(res.items()):
    print(f"{name:9s} rows {rows}: {np.median(v):7.2f} ms  {[round(a,1) for a in v]}")
