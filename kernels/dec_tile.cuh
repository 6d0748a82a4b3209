/*
 * dec_tile.cuh - what the decode attentions of many streams share
 * (aspan_decode.cu's aspan_decode_bw_kernel, rel_decode.cu): a tile's
 * scores summed over a key's lanes, the warp's running softmax over the
 * tile, and the block's warps met.
 *
 * A key's rows are read by LPK = DH / 8 lanes, 8 dims (16 bytes) each; a
 * warp takes R rounds of 32 / LPK keys. A lane keeps its 8 dims of the
 * weighted values (ACC); the warp's maximum MX, Z = sum e and (adaptive-
 * span) W = sum e m(d) are the same in every lane.
 */
#ifndef SPANSERVE_DEC_TILE_CUH
#define SPANSERVE_DEC_TILE_CUH

/* 8 bf16 (16 bytes) as floats */
static __device__ __forceinline__ void unpack_bf8(const uint4 &v, float *o)
{
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[k]);
        o[2 * k] = f.x, o[2 * k + 1] = f.y;
    }
}

/* 8 fp16 (16 bytes) as floats */
static __device__ __forceinline__ void unpack_h8(const uint4 &v, float *o)
{
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 f = __half22float2(*(const __half2 *)&w[k]);
        o[2 * k] = f.x, o[2 * k + 1] = f.y;
    }
}

/* The lanes' parts of a tile's R scores summed over each key's LPK lanes */
template <int LPK, int R> static __device__ __forceinline__ void dec_sum_parts(float (&sc)[R])
{
#pragma unroll
    for (int o = 1; o < LPK; o <<= 1)
#pragma unroll
        for (int i = 0; i < R; i++) sc[i] += __shfl_xor_sync(0xffffffffu, sc[i], o);
}

/* The warp's running softmax over a tile of scores SC (-inf: no key) and
 * value rows VV: with MASKED (adaptive-span) each e is weighted by MW into
 * W and the values, else (relative attention) the values take e and W is
 * left alone */
template <int LPK, int R, bool MASKED>
static __device__ __forceinline__ void dec_softmax(const float (&sc)[R], const float (&mw)[R], const uint4 (&vv)[R],
                                                   float &mx, float &z, float &w, float (&acc)[8])
{
    float tm = -INFINITY;
#pragma unroll
    for (int i = 0; i < R; i++) tm = fmaxf(tm, sc[i]);
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
    if (tm > mx) {   /* warp-uniform */
        const float f = mx == -INFINITY ? 0.0f : expf(mx - tm);
        z *= f;
        if (MASKED) w *= f;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] *= f;
        mx = tm;
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        const float e = sc[i] == -INFINITY ? 0.0f : expf(sc[i] - mx), wt = MASKED ? e * mw[i] : e;
        float vf[8];
        unpack_bf8(vv[i], vf);
        z += e;
        if (MASKED) w += wt;
#pragma unroll
        for (int x = 0; x < 8; x++) acc[x] = fmaf(wt, vf[x], acc[x]);
    }
}

/* The warp's key groups, then the block's NW warps, met in WST (a row a
 * warp: m, Z, W, pad, its DH dims of O): *M the block's maximum, *Z and *W
 * its sums, EV each warp's factor exp(m - M). Ends with the block's
 * barrier after the writes (and so after the block's reads). */
template <int LPK, int NW, int DH>
static __device__ __forceinline__ void dec_meet(float (&wst)[NW][4 + DH], float mx, float z, float w, float (&acc)[8],
                                                float &M, float &Z, float &W, float (&ev)[NW])
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = lane % LPK, grp = lane / LPK;
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) {
        z += __shfl_xor_sync(0xffffffffu, z, o);
        w += __shfl_xor_sync(0xffffffffu, w, o);
#pragma unroll
        for (int x = 0; x < 8; x++) acc[x] += __shfl_xor_sync(0xffffffffu, acc[x], o);
    }
    if (grp == 0) {
        *(float4 *)&wst[warp][4 + 8 * c] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        *(float4 *)&wst[warp][4 + 8 * c + 4] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
    if (lane == 0) wst[warp][0] = mx, wst[warp][1] = z, wst[warp][2] = w;
    __syncthreads();
    M = -INFINITY;
    for (int v = 0; v < NW; v++) M = fmaxf(M, wst[v][0]);
    Z = 0.0f, W = 0.0f;
    for (int v = 0; v < NW; v++) {
        ev[v] = wst[v][0] == -INFINITY ? 0.0f : expf(wst[v][0] - M);
        Z += wst[v][1] * ev[v];
        W += wst[v][2] * ev[v];
    }
}

#endif
