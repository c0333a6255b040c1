import time, sys, numpy as np, jax, jax.numpy as jnp
from flax import nnx
from dart_jax.decoding import exported
exported.folder = lambda: None
from dart_jax.models import layers
from dart_jax.models.layers import Linear
def call(self, x):
    if getattr(self, "transposed", False):
        y = jnp.einsum("...i,oi->...o", x.astype(self.dtype), self.kernel[...].astype(self.dtype))
    else:
        y = jnp.einsum("...i,io->...o", x.astype(self.dtype), self.kernel[...].astype(self.dtype))
    return y if self.bias is None else y + self.bias[...].astype(self.dtype)
Linear.__call__ = call
from dart_jax import DartModel
A = DartModel.demo(keep=7)
# B: the same target, its decoder layers' Linear kernels transposed ([out, in])
tB = nnx.clone(A.target)
for layer in tB.layers:
    for mod in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
        k = mod.kernel.get_value()
        mod.kernel = nnx.Param(jnp.asarray(np.ascontiguousarray(np.asarray(k).T)), logical_axes=mod.kernel.logical_axes[::-1])
        mod.transposed = True
B = DartModel.from_modules(tB, A.head, A.tokenizer, A.engine.trie, eos_ids=list(A.engine.eos_ids), keep=7)
prompts = ["Write a Python function that checks whether a string is a palindrome.",
           "Explain in three sentences why the sky is blue.", "List five fruits and their colours."]
for M in (A, B):
    for p in prompts[:1]:
        M.generate(p, max_new_tokens=128, method="ar"); M.generate(p, max_new_tokens=128)
res = {}
for rnd in range(3):
    for name, M in (("KN", A), ("NK", B)) if rnd % 2 == 0 else (("NK", B), ("KN", A)):
        for method in ("ar", "dart"):
            t = time.perf_counter(); outs = [M.generate(p, max_new_tokens=128, method=method) for p in prompts]
            res.setdefault((name, method), []).append(time.perf_counter() - t)
            res.setdefault((name, method, "ids"), outs)
for k in ("KN", "NK"):
    ar, d = np.median(res[(k, "ar")]), np.median(res[(k, "dart")])
    print(k, "ar", [round(x, 2) for x in res[(k, "ar")]], "dart", [round(x, 2) for x in res[(k, "dart")]], "speedup", round(ar / d, 3))
same = all(a.token_ids == b.token_ids for a, b in zip(res[("KN", "dart", "ids")], res[("NK", "dart", "ids")]))
same_ar = all(a.token_ids == b.token_ids for a, b in zip(res[("KN", "ar", "ids")], res[("KN", "dart", "ids")]))
print("NK dart == KN dart:", same, " dart == ar:", same_ar)
