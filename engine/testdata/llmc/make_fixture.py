#!/usr/bin/python3
"""Reference fixture for gptui's GPT-2 engine (stand-in for llm.c's train_gpt2.c).

What this computes
------------------
An independent PyTorch (CPU, float32) implementation of a tiny GPT-2 and of
llm.c's training loop, used to produce files the Go engine test compares against:

  model.bin     initial weights, llm.c GPT-2 checkpoint format
                (header: 256 x int32 LE, [0]=20240326 magic, [1]=3 version
                (fp32, padded vocab), [2]=maxT, [3]=V, [4]=L, [5]=NH, [6]=C,
                [7]=Vp, rest 0; then float32 params in llm.c order, see PARAM_ORDER).
  data/tokens.bin training tokens, llm.c data shard format
                (header: 256 x int32 LE, [0]=20240520, [1]=1, [2]=ntokens;
                then ntokens x uint16 LE).
  expected.json per-step losses of 10 training steps and samples of the
                final parameters (plus step-0 gradient samples, a float64
                step-0 loss and per-tensor checksums).

Model: maxT=64, V=1000, Vp=1024, L=2, NH=4, C=64.  Forward as in llm.c:
  x = wte[idx] + wpe[pos]
  per layer: x += attproj(causal_attn(ln1(x))); x += fcproj(gelu_tanh(fc(ln2(x))))
  logits = lnf(x) @ wte.T   (all Vp columns are computed, but softmax and
  cross-entropy use only the first V columns; the padded columns get zero
  gradient, so wte rows V..Vp-1 never change)
  LayerNorm eps 1e-5 (biased variance), attention scale 1/sqrt(hs),
  GELU tanh approximation, loss = mean cross-entropy over B*T positions.

Training: B=4, T=64, 10 steps, batch i = tokens[i*B*T : i*B*T + B*T + 1]
(inputs = first B*T, targets = shifted by one).  AdamW written by hand with
llm.c's rule: lr 1e-4, beta1 0.9, beta2 0.999, eps 1e-8, weight decay 0,
  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
  m_hat = m/(1-b1^t);   v_hat = v/(1-b2^t)
  p -= lr * (m_hat/(sqrt(v_hat)+eps) + wd*p)
No clipping, no dropout.  losses[i] is the loss of step i before its update.

Re-run (deterministic; needs Debian's python3-torch and python3-numpy):
  /usr/bin/python3 engine/testdata/llmc/make_fixture.py
(from the repository root; files are written next to this script).
"""

import hashlib
import json
import math
import os
import struct

import numpy as np
import torch

# ---------------------------------------------------------------- config
MAXT, V, VP, L, NH, C = 64, 1000, 1024, 2, 4, 64
B, T, STEPS = 4, 64, 10
LR, BETA1, BETA2, EPS, WD = 1e-4, 0.9, 0.999, 1e-8, 0.0
NTOKENS = 3000
SEED = 1337
LN_EPS = 1e-5

OUTDIR = os.path.dirname(os.path.abspath(__file__))

# (name, shape) in llm.c's checkpoint order
PARAM_ORDER = [
    ("wte", (VP, C)),
    ("wpe", (MAXT, C)),
    ("ln1w", (L, C)),
    ("ln1b", (L, C)),
    ("qkvw", (L, 3 * C, C)),
    ("qkvb", (L, 3 * C)),
    ("attprojw", (L, C, C)),
    ("attprojb", (L, C)),
    ("ln2w", (L, C)),
    ("ln2b", (L, C)),
    ("fcw", (L, 4 * C, C)),
    ("fcb", (L, 4 * C)),
    ("fcprojw", (L, C, 4 * C)),
    ("fcprojb", (L, C)),
    ("lnfw", (C,)),
    ("lnfb", (C,)),
]


# ---------------------------------------------------------------- init
def init_params(gen):
    """Random initial parameters (float32), all paths non-trivial."""

    def normal(shape, std, mean=0.0):
        return (torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean)

    resid_std = 0.02 / math.sqrt(2 * L)
    p = {}
    for name, shape in PARAM_ORDER:
        if name in ("ln1w", "ln2w", "lnfw"):
            p[name] = normal(shape, 0.1, 1.0)
        elif name in ("ln1b", "ln2b", "lnfb"):
            p[name] = normal(shape, 0.1)
        elif name in ("attprojw", "fcprojw"):
            p[name] = normal(shape, resid_std)
        else:  # wte (incl. padded rows), wpe, qkvw, fcw, all linear biases
            p[name] = normal(shape, 0.02)
    return p


# ---------------------------------------------------------------- data
def make_tokens(gen):
    """Sparse random Markov chain over [0, V) with noise; contains 0 and V-1."""
    nsucc = 4
    succ = torch.randint(0, V, (V, nsucc), generator=gen)
    succ_p = torch.tensor([0.55, 0.25, 0.12, 0.08])
    toks = [int(torch.randint(0, V, (1,), generator=gen))]
    for _ in range(NTOKENS - 1):
        if float(torch.rand(1, generator=gen)) < 0.1:  # noise
            nxt = int(torch.randint(0, V, (1,), generator=gen))
        else:
            j = int(torch.multinomial(succ_p, 1, generator=gen))
            nxt = int(succ[toks[-1], j])
        toks.append(nxt)
    # make sure the vocabulary extremes appear inside the trained region,
    # both as inputs and as targets
    for pos, tok in ((5, 0), (6, V - 1), (300, V - 1), (301, 0), (777, 0), (1500, V - 1)):
        toks[pos] = tok
    return torch.tensor(toks, dtype=torch.int64)


# ---------------------------------------------------------------- model
def layernorm(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(dim=-1, keepdim=True)  # biased variance, as llm.c
    return xc * torch.rsqrt(var + LN_EPS) * w + b


def gelu_tanh(x):
    s = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + torch.tanh(s * (x + 0.044715 * x * x * x)))


def linear(x, w, b):
    # w stored (out, in) like nn.Linear.weight
    return x @ w.t() + b


def attention(qkv):
    Bq, Tq, _ = qkv.shape
    hs = C // NH
    q, k, v = qkv.split(C, dim=-1)  # channel order: q | k | v

    def heads(z):  # (B,T,C) -> (B,NH,T,hs); head h = channels h*hs..(h+1)*hs
        return z.view(Bq, Tq, NH, hs).transpose(1, 2)

    q, k, v = heads(q), heads(k), heads(v)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    mask = torch.ones(Tq, Tq, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf"))
    att = torch.softmax(att, dim=-1)
    y = att @ v  # (B,NH,T,hs)
    return y.transpose(1, 2).contiguous().view(Bq, Tq, C)


def forward_loss(p, idx, targets):
    Bq, Tq = idx.shape
    x = p["wte"][idx] + p["wpe"][:Tq].unsqueeze(0)
    for l in range(L):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        qkv = linear(h, p["qkvw"][l], p["qkvb"][l])
        x = x + linear(attention(qkv), p["attprojw"][l], p["attprojb"][l])
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        h = gelu_tanh(linear(h, p["fcw"][l], p["fcb"][l]))
        x = x + linear(h, p["fcprojw"][l], p["fcprojb"][l])
    x = layernorm(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"].t()  # (B,T,Vp): padded vocab columns computed...
    logits = logits[..., :V]  # ...but only the real vocab enters the softmax
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return nll.mean()


# ---------------------------------------------------------------- files
def write_model(path, p):
    header = [0] * 256
    header[:8] = [20240326, 3, MAXT, V, L, NH, C, VP]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        for name, shape in PARAM_ORDER:
            a = p[name].detach().numpy().astype("<f4")
            assert a.shape == shape, (name, a.shape, shape)
            f.write(a.tobytes(order="C"))


def write_tokens(path, toks):
    header = [0] * 256
    header[:3] = [20240520, 1, len(toks)]
    a = toks.numpy()
    assert a.min() >= 0 and a.max() < 65536
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(a.astype("<u2").tobytes())


def layout():
    out, off = [], 0
    for name, shape in PARAM_ORDER:
        n = int(np.prod(shape))
        out.append({"name": name, "shape": list(shape), "float_offset": off,
                    "byte_offset": 1024 + 4 * off, "numel": n})
        off += n
    return out, off


def flist(t):
    return [float(v) for v in t.detach().reshape(-1).tolist()]


# ---------------------------------------------------------------- main
def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)

    params = init_params(gen)
    tokens = make_tokens(gen)
    assert int(tokens.min()) == 0 and int(tokens.max()) == V - 1
    assert STEPS * B * T + 1 <= len(tokens)

    write_model(os.path.join(OUTDIR, "model.bin"), params)
    os.makedirs(os.path.join(OUTDIR, "data"), exist_ok=True)
    write_tokens(os.path.join(OUTDIR, "data", "tokens.bin"), tokens)

    # re-read what was written, so training starts from exactly the file contents
    with open(os.path.join(OUTDIR, "model.bin"), "rb") as f:
        raw = f.read()
    flat = np.frombuffer(raw[1024:], dtype="<f4")
    lay, total = layout()
    assert flat.size == total
    p = {}
    for e in lay:
        a = flat[e["float_offset"]:e["float_offset"] + e["numel"]].reshape(e["shape"])
        p[e["name"]] = torch.tensor(a.copy(), dtype=torch.float32, requires_grad=True)
    wte_pad_init = p["wte"][V:].detach().clone()

    def batch(i):
        buf = tokens[i * B * T: i * B * T + B * T + 1]
        return buf[:-1].view(B, T), buf[1:].view(B, T)

    # float64 sanity forward of step 0
    with torch.no_grad():
        p64 = {k: v.detach().double() for k, v in p.items()}
        x0, y0 = batch(0)
        loss0_f64 = float(forward_loss(p64, x0, y0))

    m = {k: torch.zeros_like(v) for k, v in p.items()}
    vv = {k: torch.zeros_like(v) for k, v in p.items()}
    losses = []
    grad_samples = {}
    for step in range(STEPS):
        x, y = batch(step)
        for t in p.values():
            t.grad = None
        loss = forward_loss(p, x, y)
        loss.backward()
        losses.append(float(loss))
        if step == 0:
            g = {k: t.grad for k, t in p.items()}
            assert float(g["wte"][V:].abs().max()) == 0.0
            grad_samples = {
                "wte[0:8]": flist(g["wte"].reshape(-1)[0:8]),
                "qkvw[0][0:8]": flist(g["qkvw"][0].reshape(-1)[0:8]),
                "fcprojb[1][0:8]": flist(g["fcprojb"][1][0:8]),
                "lnfw[0:8]": flist(g["lnfw"][0:8]),
                "grad_l2_norm": float(torch.sqrt(sum((t.double() ** 2).sum() for t in g.values()))),
            }
        t_ = step + 1
        with torch.no_grad():
            for k, t in p.items():
                gr = t.grad
                m[k].mul_(BETA1).add_((1 - BETA1) * gr)
                vv[k].mul_(BETA2).add_((1 - BETA2) * gr * gr)
                m_hat = m[k] / (1 - BETA1 ** t_)
                v_hat = vv[k] / (1 - BETA2 ** t_)
                t.sub_(LR * (m_hat / (torch.sqrt(v_hat) + EPS) + WD * t))
        print(f"step {step}: loss {losses[-1]:.6f}")

    assert torch.equal(p["wte"][V:].detach(), wte_pad_init)

    final = {k: t.detach() for k, t in p.items()}
    allbytes = b"".join(final[name].numpy().astype("<f4").tobytes() for name, _ in PARAM_ORDER)
    samples = {
        "wte[0:8]": flist(final["wte"].reshape(-1)[0:8]),
        "wte[999][0:8]": flist(final["wte"][V - 1][0:8]),
        "wte[1000][0:8]": flist(final["wte"][V][0:8]),
        "wpe[3][0:8]": flist(final["wpe"][3][0:8]),
        "qkvw[0][0:8]": flist(final["qkvw"][0].reshape(-1)[0:8]),
        "qkvb[1][64:72]": flist(final["qkvb"][1][64:72]),
        "attprojw[1][0:8]": flist(final["attprojw"][1].reshape(-1)[0:8]),
        "fcw[0][0:8]": flist(final["fcw"][0].reshape(-1)[0:8]),
        "fcprojw[1][0:8]": flist(final["fcprojw"][1].reshape(-1)[0:8]),
        "ln1w[0][0:8]": flist(final["ln1w"][0][0:8]),
        "lnfw[0:8]": flist(final["lnfw"][0:8]),
        "lnfb[0:8]": flist(final["lnfb"][0:8]),
    }
    sums = {name: float(final[name].double().sum()) for name, _ in PARAM_ORDER}

    expected = {
        "description": (
            "Reference for gptui's GPT-2 engine, computed by an independent PyTorch "
            "(CPU float32) implementation of llm.c's train_gpt2.c: model.bin (llm.c "
            "checkpoint v3: fp32, padded vocab) trained on tokens.bin (llm.c shard) "
            "with B=4,T=64, sequential batches, 10 steps of AdamW(lr 1e-4, b1 0.9, "
            "b2 0.999, eps 1e-8, wd 0). losses[i] = mean CE over B*T of step i "
            "before its update; softmax over the first V of Vp logits. "
            "final_param_samples are the parameters after 10 updates; sample keys "
            "index llm.c tensors, '[l]' picks layer l, '[a:b]' slices the row-major "
            "flattened remainder. step0_grad_samples are gradients of step 0. "
            "Regenerate: /usr/bin/python3 engine/testdata/llmc/make_fixture.py"),
        "config": {"max_seq_len": MAXT, "vocab_size": V, "padded_vocab_size": VP,
                   "num_layers": L, "num_heads": NH, "channels": C},
        "B": B, "T": T, "steps": STEPS, "lr": LR, "beta1": BETA1, "beta2": BETA2,
        "eps": EPS, "weight_decay": WD,
        "ntokens": len(tokens),
        "num_parameters": total,
        "losses": losses,
        "step0_loss_float64": loss0_f64,
        "step0_grad_samples": grad_samples,
        "final_param_samples": samples,
        "final_param_sums": sums,
        "final_params_sha256": hashlib.sha256(allbytes).hexdigest(),
        "final_params_sha256_note": "sha256 of the final float32 params in checkpoint "
                                    "order (this PyTorch run only; not bit-reproducible "
                                    "by other implementations)",
        "param_layout": lay,
    }
    with open(os.path.join(OUTDIR, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print(f"step0 loss float64 {loss0_f64:.8f} (float32 {losses[0]:.8f})")
    print(f"num_parameters {total}")


if __name__ == "__main__":
    main()
