"""A CPU interpreter for the PTX that kernels_ptx/mma_sync_gemm.ptx.j2 emits, to run kernels without a GPU.

The threads of one block execute in lockstep (the template's only branch, the K loop, is uniform),
one block after another; registers are NumPy arrays over the block's threads. Semantics follow
PTX ISA 9.0: integer ops on .u32/.u64, ``prmt`` (9.7.8.7), ``bfe``/``bfi`` (9.7.1.x), ``ldmatrix``
(9.7.14.5.15: lane l gives the address of row l % 8 of matrix l / 8; thread t receives word t % 4 of
row t / 4, or with .trans the 16-bit elements (2(t % 4), t / 4), (2(t % 4) + 1, t / 4)) and
``mma.sync`` m16n8kK with the fragment layouts of 9.7.14.5.8-11 (products in float64, f16
accumulators rounded to f16 after each MMA, f32 ones to f32). ``cp.async`` copies land as late as
``cp.async.wait_group`` allows: all groups but the newest N complete at the wait, never earlier, so
a pipeline that reads a stage too early reads stale bytes. Out-of-bounds global or shared accesses
fail. Only the instructions the template uses are known; anything else raises KeyError.
"""
from __future__ import annotations

import re

import numpy as np

from experiments.families.mma_sync.render import L2_POLICY
from experiments.gpu.verify import bf16_values, fp8_values, make_operands

__all__ = ["Interpreter", "run_gemm"]

M32 = np.uint64(0xFFFFFFFF)
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_ADDR = re.compile(r"\[(%\w+|\w+)(?:\+(\w+))?\]")


def _parse(line: str):
    pred = None
    if line.startswith("@"):
        p, line = line.split(None, 1)
        pred = (p[1:].lstrip("!"), p.startswith("@!"))
    op, _, rest = line.partition(" ")
    args, depth, cur = [], 0, ""
    for ch in rest:
        depth += ch in "{[" and 1 or (-1 if ch in "}]" else 0)
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return pred, op, args + ([cur.strip()] if cur.strip() else [])


class Interpreter:
    """Runs entry ``spec.entry`` of a rendered module: ``Interpreter(ptx, spec).run(grid, params, gmem)``."""

    def __init__(self, ptx: str, spec):
        self.spec = spec
        body = ptx[ptx.index(f".visible .entry {spec.entry}("):]
        self.prog, self.labels = [], {}
        for raw in body[body.index("{"):].splitlines():
            line = raw.split("//")[0].strip()
            if not line or line[0] in ".{}":
                continue
            if line.endswith(":"):
                self.labels[line[:-1]] = len(self.prog)
            else:
                self.prog.append(_parse(line.rstrip(";")))

    # ---------------------------------------------------------------------------------- operands
    def val(self, a: str) -> np.ndarray:
        if a in self.r:
            return self.r[a]
        if a in self.special:
            return np.broadcast_to(np.uint64(self.special[a]), (self.T,)) if np.isscalar(
                self.special[a]) else self.special[a]
        if a in self.params:
            return np.full(self.T, self.params[a], dtype=np.uint64)
        return np.full(self.T, int(a, 0), dtype=np.uint64)          # immediate; KeyError-free ints only

    def addr(self, a: str) -> np.ndarray:
        base, off = _ADDR.fullmatch(a).groups()
        return ((self.val(base) + (self.val(off) if off else np.uint64(0))) & M64).astype(np.int64)

    def set(self, d: str, v, mask) -> None:
        v = np.asarray(v, dtype=np.uint64)
        old = self.r.get(d, np.zeros(self.T, dtype=np.uint64))
        self.r[d] = np.where(mask, v, old)

    # ---------------------------------------------------------------------------------- driver
    def run(self, grid: tuple, params: dict, gmem: np.ndarray) -> None:
        """Execute every block of ``grid`` (x, y) on ``gmem`` (uint8, byte addresses = ``params``)."""
        self.params, self.gmem, self.T = params, gmem, self.spec.threads
        for by in range(grid[1]):
            for bx in range(grid[0]):
                self.special = {"%tid.x": np.arange(self.T, dtype=np.uint64), "%ctaid.x": bx,
                                "%ctaid.y": by, "%nctaid.x": grid[0], "%nctaid.y": grid[1], "smem": 0}
                self._block()

    def _block(self) -> None:
        self.r, self.groups, self.current = {}, [], []
        self.smem = np.zeros(self.spec.smem_bytes, dtype=np.uint8)
        pc = 0
        while True:
            pred, op, args = self.prog[pc]
            pc += 1
            mask = np.ones(self.T, dtype=bool)
            if pred:
                mask = self.r[pred[0]].astype(bool) ^ pred[1]
            if op == "ret":
                return
            if op.startswith("bra"):
                assert mask.all() or not mask.any(), "divergent branch"
                pc = self.labels[args[0]] if mask.all() else pc
                continue
            getattr(self, "_" + op.split(".")[0])(op, args, mask)

    # ---------------------------------------------------------------------------------- scalar ops
    def _w(self, op):
        return M64 if op.endswith("64") else M32

    def _ld(self, op, args, mask):
        if ".param" in op:
            return self.set(args[0], self.val(args[1].strip("[]")), mask)
        n = 1 if op.endswith("u8") else 2
        a = self.addr(args[1])
        assert ((a >= 0) & (a + n <= len(self.smem)))[mask].all(), "shared read out of bounds"
        b = self.smem[np.clip(a, 0, len(self.smem) - n)[:, None] + np.arange(n)].astype(np.uint64)
        self.set(args[0], b[:, 0] | (b[:, -1] << np.uint64(8)) * (n == 2), mask)

    def _mov(self, op, args, mask):
        if args[1].startswith("{"):                                   # mov.b32 d, {lo16, hi16}
            lo, hi = (self.val(x.strip()) & np.uint64(0xFFFF) for x in args[1].strip("{}").split(","))
            return self.set(args[0], lo | hi << np.uint64(16), mask)
        self.set(args[0], self.val(args[1]), mask)

    def _cvta(self, op, args, mask):
        self.set(args[0], self.val(args[1]), mask)

    def _cvt(self, op, args, mask):
        self.set(args[0], self.val(args[1]) & M32, mask)

    def _and(self, op, args, mask):
        self.set(args[0], self.val(args[1]) & self.val(args[2]), mask)

    def _xor(self, op, args, mask):
        self.set(args[0], self.val(args[1]) ^ self.val(args[2]), mask)

    def _shr(self, op, args, mask):
        self.set(args[0], (self.val(args[1]) & self._w(op)) >> self.val(args[2]), mask)

    def _shl(self, op, args, mask):
        self.set(args[0], (self.val(args[1]) << self.val(args[2])) & self._w(op), mask)

    def _div(self, op, args, mask):
        self.set(args[0], (self.val(args[1]) & M32) // (self.val(args[2]) & M32), mask)

    def _rem(self, op, args, mask):
        self.set(args[0], (self.val(args[1]) & M32) % (self.val(args[2]) & M32), mask)

    def _min(self, op, args, mask):
        self.set(args[0], np.minimum(self.val(args[1]) & M32, self.val(args[2]) & M32), mask)

    def _add(self, op, args, mask):
        self.set(args[0], (self.val(args[1]) + self.val(args[2])) & self._w(op), mask)

    def _sub(self, op, args, mask):
        self.set(args[0], (self.val(args[1]) - self.val(args[2])) & self._w(op), mask)

    def _mul(self, op, args, mask):
        prod_ = (self.val(args[1]) & M32) * (self.val(args[2]) & M32)
        self.set(args[0], prod_ if ".wide" in op else prod_ & M32, mask)

    def _mad(self, op, args, mask):
        self.set(args[0], (self.val(args[1]) * self.val(args[2]) + self.val(args[3])) & M32, mask)

    def _setp(self, op, args, mask):
        a, b = self.val(args[1]) & M32, self.val(args[2]) & M32
        self.set(args[0], {"lt": a < b, "gt": a > b, "eq": a == b}[op.split(".")[1]], mask)

    def _selp(self, op, args, mask):
        self.set(args[0], np.where(self.val(args[3]).astype(bool), self.val(args[1]), self.val(args[2])), mask)

    def _prmt(self, op, args, mask):
        both = (self.val(args[1]) & M32) | (self.val(args[2]) & M32) << np.uint64(32)
        sel, out = int(args[3], 0), np.zeros(self.T, dtype=np.uint64)
        for i in range(4):
            out |= ((both >> np.uint64(8 * ((sel >> 4 * i) & 7))) & np.uint64(0xFF)) << np.uint64(8 * i)
        self.set(args[0], out, mask)

    def _bfe(self, op, args, mask):
        ln = np.uint64((1 << int(args[3])) - 1)
        self.set(args[0], ((self.val(args[1]) & M32) >> self.val(args[2])) & ln, mask)

    def _bfi(self, op, args, mask):
        pos, ln = int(args[3]), int(args[4])
        field = np.uint64(((1 << ln) - 1) << pos)
        self.set(args[0], (self.val(args[2]) & ~field & M32) | ((self.val(args[1]) << np.uint64(pos)) & field), mask)

    def _bar(self, op, args, mask):
        assert mask.all(), "bar.sync under a predicate"

    # ---------------------------------------------------------------------------------- memory
    def _cp(self, op, args, mask):
        if op == "cp.async.commit_group":
            self.groups.append(self.current)
            self.current = []
        elif op == "cp.async.wait_group":
            while len(self.groups) > int(args[0]):
                for dst, src in self.groups.pop(0):
                    self.smem[dst[:, None] + np.arange(16)] = self.gmem[src[:, None] + np.arange(16)]
        else:
            assert args[2] == "16" and (len(args) == 4) == (".L2::cache_hint" in op)
            if len(args) == 4:
                policies = [int(v, 16) for v in L2_POLICY.values()]
                assert np.isin(self.val(args[3])[mask], np.array(policies, dtype=np.uint64)).all(), \
                    "cache hint without a cache policy"
            dst, src = self.addr(args[0])[mask], self.addr(args[1])[mask]
            assert ((src >= 0) & (src + 16 <= len(self.gmem))).all(), "global read out of bounds"
            assert ((dst >= 0) & (dst + 16 <= len(self.smem))).all(), "shared write out of bounds"
            self.current.append((dst, src))

    def _st(self, op, args, mask):
        a = self.addr(args[0])[mask]
        vals = [self.val(x.strip())[mask] for x in args[1].strip("{}").split(",")]
        for j, v in enumerate(vals):
            where = a + 4 * j
            assert ((where >= 0) & (where + 4 <= len(self.gmem))).all(), "global write out of bounds"
            self.gmem[where[:, None] + np.arange(4)] = (v & M32).astype("<u4").view(np.uint8).reshape(-1, 4)

    # ---------------------------------------------------------------------------------- warp level
    def _ldmatrix(self, op, args, mask):
        assert mask.all()
        regs = [x.strip() for x in args[0].strip("{}").split(",")]
        lanes = self.addr(args[1]).reshape(-1, 32)                      # (warps, 32)
        t = np.arange(32)
        for j, reg in enumerate(regs):
            rows = lanes[:, 8 * j:8 * j + 8]                            # row addresses of matrix j
            if ".trans" in op:
                c = 2 * (t // 4)
                idx = np.concatenate([rows[:, 2 * (t % 4)][..., None] + c[:, None] + [0, 1],
                                      rows[:, 2 * (t % 4) + 1][..., None] + c[:, None] + [0, 1]], axis=-1)
            else:
                idx = rows[:, t // 4][..., None] + (4 * (t % 4))[:, None] + np.arange(4)
            assert ((idx >= 0) & (idx < len(self.smem))).all(), "ldmatrix out of bounds"
            b = self.smem[idx].astype(np.uint64)
            self.set(reg, (b[..., 0] | b[..., 1] << np.uint64(8) | b[..., 2] << np.uint64(16)
                           | b[..., 3] << np.uint64(24)).reshape(-1), mask)

    def _decode(self, words: np.ndarray) -> np.ndarray:
        """(..., ) 32-bit fragment registers -> (..., E) element values, low element first."""
        p, bits = self.spec.precision, self.spec.prec.bits
        w = words.astype("<u4")
        if bits == 16:
            h = w[..., None].view(np.uint16)
            return h.view(np.float16).astype(np.float64) if p == "fp16" else bf16_values(h).astype(np.float64)
        b = w[..., None].view(np.uint8)
        if bits == 8:
            return b.view(np.int8).astype(np.float64) if p == "int8" else fp8_values(b, p).astype(np.float64)
        nib = np.stack([b & 0xF, b >> 4], axis=-1).reshape(*b.shape[:-1], 8).astype(np.int64)
        return np.where(nib > 7, nib - 16, nib).astype(np.float64)

    def _mma(self, op, args, mask):
        assert mask.all()
        s, (d, a, b, c) = self.spec, ([x.strip() for x in arg.strip("{}").split(",")] for arg in args)
        k, e, nw = s.mma_k, 32 // s.prec.bits, self.T // 32
        g, tig = np.arange(32) // 4, np.arange(32) % 4
        A, B = np.zeros((nw, 16, k)), np.zeros((nw, k, 8))
        for i, reg in enumerate(a):
            cols = (i // 2) * (k // 2) + tig[:, None] * e + np.arange(e)
            A[:, (g + 8 * (i % 2))[:, None], cols] = self._decode(self.r[reg].reshape(nw, 32))
        for i, reg in enumerate(b):
            rows = i * (k // 2) + tig[:, None] * e + np.arange(e)
            B[:, rows, g[:, None]] = self._decode(self.r[reg].reshape(nw, 32))
        C = np.zeros((nw, 16, 8))
        if s.acc == "f16":
            for i, reg in enumerate(c):
                h = self.r[reg].reshape(nw, 32).astype("<u4")[..., None].view(np.float16).astype(np.float64)
                C[:, (g + 8 * i)[:, None], 2 * tig[:, None] + np.arange(2)] = h
        else:
            kind = np.float32 if s.prec.is_float else np.int32
            for i, reg in enumerate(c):
                C[:, g + 8 * (i // 2), 2 * tig + i % 2] = self.r[reg].reshape(nw, 32).astype("<u4").view(kind)
        D = A @ B + C
        if s.acc == "f16":
            for i, reg in enumerate(d):
                h = D[:, (g + 8 * i)[:, None], 2 * tig[:, None] + np.arange(2)].astype(np.float16)
                self.r[reg] = np.ascontiguousarray(h).view("<u4").reshape(-1).astype(np.uint64)
        else:
            for i, reg in enumerate(d):
                v = D[:, g + 8 * (i // 2), 2 * tig + i % 2].reshape(-1)
                bits = v.astype(np.float32).view("<u4") if s.prec.is_float else np.rint(v).astype(np.int64)
                self.r[reg] = bits.astype(np.uint64) & M32


def run_gemm(spec, ptx: str, m: int, n: int, k: int, seed: int):
    """Run the rendered kernel on fresh operands (:func:`experiments.gpu.verify.make_operands`, B laid
    out as the spec says) with C poisoned (0xFF bytes); returns (C as NumPy, Operands)."""
    ops = make_operands(spec.precision, m, n, k, seed, xp=np, b_layout=spec.b_layout)
    a = np.ascontiguousarray(ops.a).view(np.uint8).reshape(-1)
    b = np.ascontiguousarray(ops.b).view(np.uint8).reshape(-1)
    c_bytes = m * n * spec.accum.c_bytes
    base_a, base_b = 256, 256 + (len(a) + 255) // 256 * 256
    base_c = base_b + (len(b) + 255) // 256 * 256
    gmem = np.zeros(base_c + c_bytes, dtype=np.uint8)
    gmem[base_a:base_a + len(a)], gmem[base_b:base_b + len(b)], gmem[base_c:] = a, b, 0xFF
    Interpreter(ptx, spec).run((n // spec.bn, m // spec.bm),
                               {"A": base_a, "B": base_b, "C": base_c, "M": m, "N": n, "K": k}, gmem)
    return gmem[base_c:].view(np.dtype(spec.accum.c_dtype)).reshape(m, n), ops
