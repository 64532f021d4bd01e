#!/usr/bin/env python3
"""Evaluate a GPT-2 checkpoint directory written by gptui's hf.Export.

Usage: gpt2_reference.py DIR B T INPUTS TARGETS
INPUTS and TARGETS are comma-separated token ids, B*T of each, row-major.

Prints one JSON line: {"loss": L} where L is the mean next-token
cross-entropy computed with PyTorch alone, following transformers'
modeling_gpt2 (Conv1D: y = x @ W + b with W stored [in, out]; GELU tanh
approximation; LayerNorm eps from config.json; lm_head tied to wte). Where
transformers is installed it also loads the directory with
GPT2LMHeadModel.from_pretrained and adds "transformers_loss".
The safetensors file is parsed by hand: the safetensors package is not needed.
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    tensors = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            raise SystemExit(f"{name}: dtype {e['dtype']}, this script reads F32 only")
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + b : base + end]), dtype=torch.float32)
        key = name[len("transformer.") :] if name.startswith("transformer.") else name
        tensors[key] = t.reshape(e["shape"]).double()
    return tensors


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def logits(sd, cfg, idx):
    B, T = idx.shape
    C, nh = cfg["n_embd"], cfg["n_head"]
    hs = C // nh
    eps = cfg["layer_norm_epsilon"]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = sd["wte.weight"][idx] + sd["wpe.weight"][:T]
    for l in range(cfg["n_layer"]):
        p = lambda s: sd[f"h.{l}.{s}"]
        h = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), eps)
        qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), eps)
        h = gelu_new(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"))
        x = x + h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), sd["ln_f.weight"], sd["ln_f.bias"], eps)
    return x @ sd["wte.weight"].T


def main():
    d, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    idx = torch.tensor([int(t) for t in sys.argv[4].split(",")]).view(B, T)
    tgt = torch.tensor([int(t) for t in sys.argv[5].split(",")]).view(B, T)
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    sd = load_safetensors(f"{d}/model.safetensors")
    V = cfg["vocab_size"]
    out = {"loss": F.cross_entropy(logits(sd, cfg, idx).view(-1, V), tgt.view(-1)).item()}
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:
        pass
    else:
        model = GPT2LMHeadModel.from_pretrained(d).eval()
        with torch.no_grad():
            lg = model(idx).logits
        out["transformers_loss"] = F.cross_entropy(lg.view(-1, V), tgt.view(-1)).item()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
