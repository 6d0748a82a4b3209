#!/usr/bin/env python3
"""bench_par_torch.py - the baseline of `make bench`'s PAR training figure:
the PAR Transformer-XL of tests/bench_train.c (par-base's shape: 24 blocks
`afff` x 4 + `f` x 8, d_model 512, 8 heads of 64, d_inner 2048, mem_len 512,
vocabulary 256; segments of 512, 16 streams) written in PyTorch from the
semantics of ../shared/fixtures/README.md and core/train_par.c, eager mode,
float32 (TF32 off), measured as bench_train measures the CUDA trainer: a
whole training step (forward with the memory carried, loss, backward, the
global gradient clip, Adam), random weights and tokens, wall time of 10
steps after 3, median of 3 runs.

Attention is Transformer-XL's relative attention as its reference writes
it (kimiyoung/transformer-xl's RelPartialLearnableMultiHeadAttn: scores
(q+u).k + (q+v).r with the relative shift, post-LayerNorm); a block is
LN(x + Attn(x)) or LN(x + FF(x)); the embedding is scaled by sqrt(d_model)
and tied to the output layer. Prints one line; skips without CUDA or torch.
"""
import argparse
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tgt-len", type=int, default=512)
    ap.add_argument("--mem-len", type=int, default=512)
    ap.add_argument("--search", action="store_true", help="every block computes both branches, mixed by a Gumbel-softmax")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError:
        print("SKIP bench_par_torch: no torch")
        return 0
    if not torch.cuda.is_available():
        print("SKIP bench_par_torch: no CUDA device")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    L, D, NH, DH, DI, V = 24, 512, 8, 64, 2048, 256
    B, M, ML = a.streams, a.tgt_len, a.mem_len
    arch = ["attn" if (l < 16 and l % 4 == 0) else "ffn" for l in range(L)]

    class RelAttn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv_net = nn.Linear(D, 3 * NH * DH, bias=False)
            self.r_net = nn.Linear(D, NH * DH, bias=False)
            self.o_net = nn.Linear(NH * DH, D, bias=False)
            self.layer_norm = nn.LayerNorm(D)
            self.scale = 1 / DH ** 0.5

        @staticmethod
        def rel_shift(x):   # [qlen, klen, B, NH]
            zp = torch.zeros((x.size(0), 1) + x.size()[2:], device=x.device, dtype=x.dtype)
            xp = torch.cat([zp, x], 1).view(x.size(1) + 1, x.size(0), *x.size()[2:])
            return xp[1:].view_as(x)

        def forward(self, x, mem, r_emb, u, v):   # x [M, B, D]; mem [mlen, B, D]
            cat = torch.cat([mem, x], 0) if mem is not None and mem.size(0) else x
            klen, qlen = cat.size(0), x.size(0)
            q, k, vv = self.qkv_net(cat).chunk(3, -1)
            q = q[-qlen:].view(qlen, B, NH, DH)
            k = k.view(klen, B, NH, DH)
            vv = vv.view(klen, B, NH, DH)
            r = self.r_net(r_emb[-klen:]).view(klen, NH, DH)   # distances klen-1 .. 0
            ac = torch.einsum("ibnd,jbnd->ijbn", q + u, k)
            bd = self.rel_shift(torch.einsum("ibnd,jnd->ijbn", q + v, r))
            s = (ac + bd) * self.scale
            mask = torch.triu(torch.ones(qlen, klen, device=x.device, dtype=torch.bool), diagonal=1 + klen - qlen)
            s = s.masked_fill(mask[:, :, None, None], float("-inf"))
            p = F.softmax(s, dim=1)
            o = torch.einsum("ijbn,jbnd->ibnd", p, vv).reshape(qlen, B, NH * DH)
            return self.layer_norm(x + self.o_net(o))

    class FF(nn.Module):
        def __init__(self):
            super().__init__()
            self.CoreNet = nn.Sequential(nn.Linear(D, DI), nn.ReLU(inplace=True), nn.Linear(DI, D))
            self.layer_norm = nn.LayerNorm(D)

        def forward(self, x):
            return self.layer_norm(x + self.CoreNet(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.ff = RelAttn(), FF()
            self.alpha = nn.Parameter(torch.zeros(3))

    class PAR(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.out_bias = nn.Parameter(torch.zeros(V))
            self.r_w_bias = nn.Parameter(torch.randn(NH, DH) * 0.02)
            self.r_r_bias = nn.Parameter(torch.randn(NH, DH) * 0.02)
            self.blocks = nn.ModuleList([Block() for _ in range(L)])
            for n, p in self.named_parameters():
                if p.dim() == 2 and "bias" not in n:
                    nn.init.normal_(p, 0, 0.02)
            pos = torch.arange(ML + M - 1, -1, -1.0)
            inv = 1 / (10000 ** (torch.arange(0, D, 2.0) / D))
            ang = pos[:, None] * inv[None]
            self.register_buffer("r_emb", torch.cat([ang.sin(), ang.cos()], -1))

        def forward(self, x, y, mems, tau):
            h = self.emb(x) * D ** 0.5   # [M, B, D]
            new = []
            for l, blk in enumerate(self.blocks):
                mem = mems[l]
                new.append(torch.cat([mem, h], 0)[-ML:].detach() if ML else None)
                if a.search:
                    g = -torch.log(-torch.log(torch.rand(3, device=h.device)))
                    w = F.softmax((blk.alpha + g) / tau, -1)
                    h = w[0] * blk.attn(h, mem, self.r_emb, self.r_w_bias, self.r_r_bias) + w[1] * blk.ff(h) + w[2] * h
                elif arch[l] == "attn":
                    h = blk.attn(h, mem, self.r_emb, self.r_w_bias, self.r_r_bias)
                else:
                    h = blk.ff(h)
            logits = F.linear(h, self.emb.weight, self.out_bias)
            return F.cross_entropy(logits.view(-1, V), y.view(-1)), new

    torch.manual_seed(1)
    model = PAR().to(dev)
    params = [p for n, p in model.named_parameters() if not n.endswith("alpha")]
    opt = torch.optim.Adam(params, lr=2.5e-4)
    opt_a = torch.optim.Adam([b.alpha for b in model.blocks], lr=3e-3)
    mems = [torch.zeros(0, B, D, device=dev) for _ in range(L)]

    def step(mems):
        x = torch.randint(0, V, (M, B), device=dev)
        y = torch.randint(0, V, (M, B), device=dev)
        loss, mems = model(x, y, mems, 1.0)
        opt.zero_grad(set_to_none=True)
        opt_a.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.25)
        opt.step()
        if a.search:
            opt_a.step()
        return mems

    runs = []
    for _ in range(3):
        for s in range(13):
            if s == 3:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            mems = step(mems)
        torch.cuda.synchronize()
        runs.append(10 * B * M / (time.perf_counter() - t0))
    tps = statistics.median(runs)
    print(f"bench_par_torch: {torch.cuda.get_device_name()}, PAR {'search' if a.search else 'afff x4 + f x8'}, "
          f"PyTorch {torch.__version__} eager fp32: {tps:.0f} tokens/s, {1e3 * B * M / tps:.1f} ms a step, "
          f"{torch.cuda.max_memory_allocated() / 1e9:.2f} GB peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
