#!/usr/bin/python3
"""Independent PyTorch reference of a Llama decoder and its training, for gptui.

Written from the published formulas (the Llama 2 and 3 papers, RoFormer's
rotary embeddings, Hugging Face's LlamaForCausalLM documentation), not from
gptui's code; run by engine/llama_test.go with Debian's python3-torch (no
transformers, no numpy, no safetensors module):

    /usr/bin/python3 llama_reference.py DIR

DIR holds what the Go test wrote:

  config.json  the model's sizes and settings, the training's hyperparameters
               and the per-step learning rates, and the tensors of params.bin
               (name, offset, shape) in gptui's layout: wte (Vp,C); ln1w (L,C);
               qkvw (L,(NH+2*NKV)*hd,C), the rows of q_proj, k_proj, v_proj one
               after another; attprojw (L,C,C) = o_proj; ln2w (L,C);
               fcw (L,2F,C) = gate_proj then up_proj; fcprojw (L,C,F) =
               down_proj; lnfw (C); lmhead (Vp,C) when untied
  params.bin   the initial parameters, little-endian float32
  tokens.bin   the training tokens, little-endian int32: batch i is
               tokens[i*B*T : i*B*T + B*T + 1] (inputs, and targets shifted by one)

It writes DIR/logits.bin, the (B,T,V) logits of batch 0 under the initial
parameters (float32), and prints {"losses": [...]}: the loss of each training
step, before its update.

    /usr/bin/python3 llama_reference.py --hf DIR TOKENS OUT [DIR TOKENS OUT ...]

reads each Hugging Face LlamaForCausalLM folder DIR (config.json, and
model.safetensors or the shards model.safetensors.index.json names, F32,
parsed here: safetensors is an 8-byte header length, a JSON header, the
data), runs it on the comma-separated token ids TOKENS (one sequence) and
writes the (T,V) logits to OUT as little-endian float32.

The model (hd = C/NH, NKV key/value heads):

  x      = wte[tokens]
  block: h   = x + o_proj(attn(rope(q), rope(k), v)),  q,k,v = q_proj, k_proj, v_proj of rmsnorm(x)*w1
         out = h + down(silu(gate(n)) * up(n)),         n = rmsnorm(h)*w2
  logits = (rmsnorm(x_L)*wf) @ W[:V].T,                 W = lm_head, or wte when tied
  rmsnorm(x) = x / sqrt(mean(x^2) + eps)
  rope: rotate_half pairing (x[i], x[i+hd/2]) rotated by p * inv_freq[i],
        inv_freq[i] = theta^(-2i/hd), Llama 3.1's frequency scaling when given
  attn: causal softmax(q k^T / sqrt(hd)) v, query head h using key/value
        head h // (NH/NKV)
  loss = mean cross-entropy over the B*T positions (the V real columns)

Training: AdamW (Loshchilov & Hutter: decoupled weight decay, here on the
matrices and embeddings only; bias-corrected moments, eps outside the square
root), after clipping the gradients to a global L2 norm.

Page faults are slow on the machines the tests run on, so the parameters,
their gradients and the optimizer's moments are each one flat buffer,
allocated once, glibc is told to keep the memory freed between steps and
to ask for transparent huge pages.
"""

import ctypes
import json
import math
import os
import struct
import sys
import time

# One thread each for OpenMP and OpenBLAS, read when torch loads them:
# the tests share a few cores, where spinning worker threads only wait.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Transparent huge pages for glibc's heap, which glibc reads only at start:
# the first touch of the 2.4 GB a 124M-sized model's training holds costs
# a third less (24 s → 20 s for the whole script on the test machine).
if "GLIBC_TUNABLES" not in os.environ:
    os.environ["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# CHUNK is the elements of the parameters the update reads at a time.
CHUNK = 1 << 22


def keep_freed_memory():
    """Ask glibc to serve every allocation from its heap and never give
    freed memory back, so that each step reuses the last step's pages."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)  # M_MMAP_MAX: no mmap'd chunks
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: do not trim
    except OSError:
        pass


def read_floats(path, n=None):
    """The little-endian float32s of path (n of them, or all) as a tensor."""
    size = os.path.getsize(path) if n is None else 4 * n
    buf = bytearray(size)
    with open(path, "rb") as f:
        if f.readinto(buf) != size:
            raise SystemExit(f"{path}: shorter than {size} bytes")
    return torch.frombuffer(buf, dtype=torch.float32)


def inv_freq(hd, theta, scaling):
    """The rotary frequencies theta^(-2i/hd), i < hd/2, scaled as Llama 3.1
    does when scaling is given: wavelengths shorter than
    original_max_position_embeddings/high_freq_factor kept, longer than
    .../low_freq_factor divided by factor, those between interpolated."""
    f = [theta ** (-2.0 * i / hd) for i in range(hd // 2)]
    if not scaling:
        return f
    L = float(scaling["original_max_position_embeddings"])
    low, high, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
    out = []
    for th in f:
        wave = 2 * math.pi / th
        if wave < L / high:
            out.append(th)
        elif wave > L / low:
            out.append(th / factor)
        else:
            s = (L / wave - low) / (high - low)
            out.append((1 - s) * th / factor + s * th)
    return out


class Llama:
    """A Llama decoder over named weights W: embed (V',C), lm_head (V',C),
    final_norm (C), and per layer l: in_norm, q, k, v, o, post_norm, gate,
    up, down, HF's shapes (out, in)."""

    def __init__(self, W, V, C, L, NH, NKV, eps, theta, scaling, max_t):
        self.W, self.V, self.C, self.L, self.NH, self.NKV, self.eps = W, V, C, L, NH, NKV, eps
        hd = self.hd = C // NH
        # The rotary tables in float64, rounded once.
        freq = torch.tensor(inv_freq(hd, theta, scaling), dtype=torch.float64)
        ang = torch.outer(torch.arange(max_t, dtype=torch.float64), freq)
        self.cos = torch.cat([ang.cos(), ang.cos()], dim=-1).float()  # (T, hd)
        self.sin = torch.cat([ang.sin(), ang.sin()], dim=-1).float()

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x):  # (B, heads, T, hd)
        T, h = x.shape[2], self.hd // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)  # rotate_half
        return x * self.cos[:T] + rot * self.sin[:T]

    def __call__(self, idx):  # (B, T) → (B, T, V)
        W, NH, NKV, hd = self.W, self.NH, self.NKV, self.hd
        B, T = idx.shape
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = W["embed"][idx]
        for l in range(self.L):
            p = W["layers"][l]
            n = self.rmsnorm(x, p["in_norm"])
            q = (n @ p["q"].T).view(B, T, NH, hd).transpose(1, 2)
            k = (n @ p["k"].T).view(B, T, NKV, hd).transpose(1, 2)
            v = (n @ p["v"].T).view(B, T, NKV, hd).transpose(1, 2)
            q, k = self.rope(q), self.rope(k)
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
            x = x + (att @ v).transpose(1, 2).reshape(B, T, NH * hd) @ p["o"].T
            n = self.rmsnorm(x, p["post_norm"])
            x = x + (F.silu(n @ p["gate"].T) * (n @ p["up"].T)) @ p["down"].T
        head = W["lm_head"]
        if head.shape[0] != self.V:
            head = head[: self.V]
        return self.rmsnorm(x, W["final_norm"]) @ head.T


def train(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    V, C, L, NH, NKV, FF = cfg["V"], cfg["C"], cfg["L"], cfg["NH"], cfg["NKV"], cfg["F"]
    B, T = cfg["B"], cfg["T"]
    hd = C // NH

    n = max(t["offset"] + math.prod(t["shape"]) for t in cfg["tensors"])
    flat = read_floats(os.path.join(d, "params.bin"), n)
    grad = torch.zeros(n)
    P = {t["name"]: (t["offset"], t["shape"]) for t in cfg["tensors"]}  # gptui's tensors

    def leaf(a, shape):
        """A leaf viewing flat[a:], its gradient viewing grad[a:]. Each
        weight the model reads is a leaf of its own: through a slice of a
        larger leaf, autograd would build the larger tensor's whole
        gradient at every use."""
        size = math.prod(shape)
        x = flat[a : a + size].view(shape).detach().requires_grad_()
        x.grad = grad[a : a + size].view(shape)
        return x

    def layer(name, l, rows=0, shape=None):
        """Leaf for rows [rows:] of layer l's slice of the stacked tensor name."""
        a, s = P[name]
        per = math.prod(s[1:])
        return leaf(a + l * per + rows * math.prod(s[2:]), shape or s[1:])

    with open(os.path.join(d, "tokens.bin"), "rb") as f:
        raw = f.read()
    tokens = torch.tensor(struct.unpack(f"<{len(raw) // 4}i", raw), dtype=torch.int64)

    layers = [{
        "in_norm": layer("ln1w", l), "q": layer("qkvw", l, 0, [NH * hd, C]), "k": layer("qkvw", l, NH * hd, [NKV * hd, C]),
        "v": layer("qkvw", l, (NH + NKV) * hd, [NKV * hd, C]), "o": layer("attprojw", l), "post_norm": layer("ln2w", l),
        "gate": layer("fcw", l, 0, [FF, C]), "up": layer("fcw", l, FF, [FF, C]), "down": layer("fcprojw", l)} for l in range(L)]
    embed = leaf(*P["wte"])
    head = embed if cfg["tied"] else leaf(P["lmhead"][0], [V, C])  # the padded rows' gradient stays 0
    model = Llama({"embed": embed, "lm_head": head, "final_norm": leaf(*P["lnfw"]), "layers": layers},
                  V, C, L, NH, NKV, cfg["eps"], cfg["theta"], cfg.get("scaling"), T)

    bt = B * T
    with torch.no_grad():
        write_floats(os.path.join(d, "logits.bin"), model(tokens[:bt].view(B, T)))

    b1, b2, aeps, wd, clip = cfg["beta1"], cfg["beta2"], cfg["adam_eps"], cfg["weight_decay"], cfg["clip"]
    decayed = [flat[P[k][0] : P[k][0] + math.prod(P[k][1])] for k in cfg["decay"]]
    m, v = torch.zeros(n), torch.zeros(n)
    den = torch.empty(min(n, CHUNK))
    losses = []
    for step, lr in enumerate(cfg["lrs"]):
        t0 = time.time()
        chunk = tokens[step * bt : step * bt + bt + 1]
        inp, tgt = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        grad.zero_()
        loss = F.cross_entropy(model(inp).reshape(bt, V), tgt.reshape(bt))
        loss.backward()
        losses.append(loss.item())
        t1 = time.time()
        norm = math.sqrt(sum(float(torch.dot(gd, gd)) for gd in (g.double() for g in grad.split(CHUNK))))
        t = step + 1
        with torch.no_grad():
            if clip > 0 and norm > clip:
                grad.mul_(clip / norm)
            # p ← p − lr·(m̂ / (√v̂ + eps) + wd·p), the decay on the
            # matrices and embeddings only; a chunk at a time.
            for p in decayed:
                p.mul_(1 - lr * wd)
            for pc, gc, mc, vc in zip(flat.split(CHUNK), grad.split(CHUNK), m.split(CHUNK), v.split(CHUNK)):
                mc.mul_(b1).add_(gc, alpha=1 - b1)
                vc.mul_(b2).addcmul_(gc, gc, value=1 - b2)
                dc = torch.div(vc, 1 - b2**t, out=den[: len(vc)]).sqrt_().add_(aeps)
                pc.addcdiv_(mc, dc, value=-lr / (1 - b1**t))
        if os.environ.get("LLREF_TIME"):
            print(f"step {step}: forward and backward {t1 - t0:.2f} s, update {time.time() - t1:.2f} s", file=sys.stderr)
    print(json.dumps({"losses": losses}))


def write_floats(path, x):
    """Writes x to path as little-endian float32 (this machine's order)."""
    buf = bytearray(4 * x.numel())
    torch.frombuffer(buf, dtype=torch.float32).copy_(x.detach().reshape(-1))
    with open(path, "wb") as f:
        f.write(buf)


def read_safetensors(path):
    """The F32 tensors of a safetensors file by name: an 8-byte little-endian
    header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
    then the data, each tensor row-major at its [begin, end) of it."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            raise SystemExit(f"{path}: {name}: dtype {e['dtype']}, this script reads F32 only")
        b, end = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + b : 8 + n + end]), dtype=torch.float32).view(e["shape"])
    return out


def read_hf(d):
    """config.json and the tensors of a LlamaForCausalLM folder: from
    model.safetensors, or from the shards model.safetensors.index.json maps
    the tensors to."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    if os.path.exists(os.path.join(d, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    W = {}
    for name in files:
        W.update(read_safetensors(os.path.join(d, name)))
    return cfg, W


def hf_logits(d, tokens, out):
    """Writes to out the logits (T,V) of the LlamaForCausalLM folder d on
    the sequence tokens."""
    cfg, W = read_hf(d)
    if cfg.get("architectures") != ["LlamaForCausalLM"] or cfg.get("hidden_act", "silu") != "silu":
        raise SystemExit(f"{d}: not a LlamaForCausalLM with SiLU")
    C, L, NH = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads") or NH
    p = "model.layers.{}.".format
    layers = [{
        "in_norm": W[p(l) + "input_layernorm.weight"], "q": W[p(l) + "self_attn.q_proj.weight"],
        "k": W[p(l) + "self_attn.k_proj.weight"], "v": W[p(l) + "self_attn.v_proj.weight"],
        "o": W[p(l) + "self_attn.o_proj.weight"], "post_norm": W[p(l) + "post_attention_layernorm.weight"],
        "gate": W[p(l) + "mlp.gate_proj.weight"], "up": W[p(l) + "mlp.up_proj.weight"], "down": W[p(l) + "mlp.down_proj.weight"],
    } for l in range(L)]
    embed = W["model.embed_tokens.weight"]
    head = embed if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    scaling = cfg.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) != "llama3":
        raise SystemExit(f"{d}: rope_scaling {scaling}: this script computes llama3's only")
    idx = torch.tensor(tokens, dtype=torch.int64).view(1, -1)
    model = Llama({"embed": embed, "lm_head": head, "final_norm": W["model.norm.weight"], "layers": layers},
                  cfg["vocab_size"], C, L, NH, NKV, cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 10000.0), scaling, idx.shape[1])
    with torch.no_grad():
        write_floats(out, model(idx))


def main():
    keep_freed_memory()
    if sys.argv[1] == "--hf":
        args = sys.argv[2:]
        if not args or len(args) % 3:
            raise SystemExit("usage: llama_reference.py --hf DIR TOKENS OUT [DIR TOKENS OUT ...]")
        for i in range(0, len(args), 3):
            hf_logits(args[i], [int(t) for t in args[i + 1].split(",")], args[i + 2])
        return
    train(sys.argv[1])


if __name__ == "__main__":
    main()
