/*
 * sample.cu - core/sample.c's sample_pick where the logprobs are: a
 * cluster of thread blocks a pick reads its row of V logprobs on the device
 * and writes back the token, its logprob and the top tokens (a few dozen bytes,
 * not V floats: a megabyte a stream a step for a vocabulary of 267,735).
 *
 * The host sorts the row (value descending, the lowest id first on ties),
 * keeps the first top_k, weighs them w_i = exp((lp_i - max) / T), keeps the
 * shortest prefix whose mass reaches top_p of theirs, and walks that prefix
 * until the running mass passes u times its total. No sort is needed to do
 * the same: every such cut is a point in that order, found as a level (a
 * value) by a radix select over the values' bits (four passes of 8 bits,
 * each a histogram of counts or of weights of the tokens still in, scanned
 * from the top by one warp), then a rank
 * among the tokens tied at that level, which all weigh the same and go by
 * id. So the device draws the token the host draws from the same u; only the
 * weights are integers (core's sample_weight) and their sums exact, so only
 * a weight's exp, the device's against the host's, can differ (in its last
 * bit, rarely), and with it a cut that falls within that bit.
 *
 * Values are ordered through their bits: key(v) of a finite float is an
 * unsigned int with key(a) > key(b) exactly when a > b (-0 read as +0).
 */
#include "gpu_internal.cuh"

#include <cooperative_groups.h>
#include <math.h>

namespace cg = cooperative_groups;

/* A row of up to PICK_SMALL tokens takes pick_small (below). A longer
 * row's pick is a cluster of PICK_CLUSTER blocks (Hopper's thread block
 * clusters; one block for a row of up to PICK_SMALL_V tokens, where the
 * cluster's synchronisations would cost more than its reading: a top-p
 * draw over 256 tokens took 104 us with 8 blocks on an H200), each reading
 * a share of the row: tiles of PICK_THREADS tokens dealt round the
 * cluster. What one block finds (a histogram, a best
 * token, a count) every block combines from the others' shared memory
 * (distributed shared memory), so that all of them go on with the same
 * state; block 0 writes the answer. */
#define PICK_THREADS 1024
#define PICK_WARPS (PICK_THREADS / 32)
#define PICK_CLUSTER 8
#define PICK_SMALL_V 16384

__device__ static inline unsigned fkey(float v)
{
    unsigned u = __float_as_uint(v + 0.0f);   /* -0 + 0 is +0 */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ static inline float keyf(unsigned k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* The radix select's digits: 8 bits a pass, four passes. Each pair of
 * warps fills its own copy of the histogram (PICK_COPIES), merged after:
 * the values of a row crowd into a few bins, and atomics of a thousand
 * threads on one address would wait on each other. */
#define PICK_BINS 256
#define PICK_COPIES 8
/* The tokens of the coarse level a select lands in, listed (when they are
 * this few) so that its finer passes visit them alone. */
#define PICK_LIST 2048

/* F(i, v, ok) for every index i of this block's share of the row (its
 * tiles; within a tile, consecutive threads, consecutive i), eight loads in
 * flight a thread (one load at a time leaves an SM waiting on memory);
 * every thread calls F the same number of times (OK 0 past the end), so F
 * may hold warp votes. */
#define PICK_UNROLL 8
template <typename F> __device__ static inline void each(const float *row, int V, F f)
{
    const int stride = (int)cg::this_cluster().num_blocks() * PICK_THREADS,
              first = (int)cg::this_cluster().block_rank() * PICK_THREADS;
    for (int base = first; base < V; base += PICK_UNROLL * stride) {
        float v[PICK_UNROLL];
#pragma unroll
        for (int u = 0; u < PICK_UNROLL; u++) {
            const int i = base + u * stride + (int)threadIdx.x;
            v[u] = i < V ? row[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < PICK_UNROLL; u++) {
            const int i = base + u * stride + (int)threadIdx.x;
            f(i, v[u], i < V);
        }
    }
}

/* What decides which tokens are in and what they weigh: a token is "in"
 * while it is among the top_k (key > kk, or key == kk and id <= idk) and
 * in the top_p prefix (the same with kp, idp). Each pass copies it into
 * registers (read from shared memory at every token, it costs more than the
 * token's own work). */
typedef struct {
    int has_k, has_p;
    unsigned kk, kp;
    int idk, idp;
    double mx, inv_t;
    float mxf, inv_tf;             /* the same in float, for the coarse levels */
} pick_set;

typedef struct {
    pick_set set;
    unsigned long long part[PICK_COPIES][PICK_BINS];
    int list[PICK_LIST];
    int n_list, listed;            /* the list's length, and whether it holds them all */
    unsigned long long hist[PICK_BINS];     /* this block's share */
    unsigned long long merged[PICK_BINS];   /* the cluster's */
    unsigned long long xch;                 /* this block's value in cluster_reduce */
    unsigned rkey[PICK_WARPS];
    int rid[PICK_WARPS], cnt[PICK_WARPS];
    unsigned level;                /* radix_level's answer */
    unsigned cbin, digit;          /* its coarse level, and the digit a pass found */
    unsigned long long above, at;  /* what lies above it, and at it */
    double target;
    int hit;                       /* whether radix_level found its level */
    int found;                     /* nth_tie's answer */
} pick_sh;

__device__ static inline int is_in(const pick_set &c, unsigned k, int i)
{
    return (!c.has_k || k > c.kk || (k == c.kk && i <= c.idk)) && (!c.has_p || k > c.kp || (k == c.kp && i <= c.idp));
}

/* core's sample_weight: exp((v - max) / T) as a float, times 2^SAMPLE_FIX */
__device__ static inline unsigned long long weight(const pick_set &c, float v)
{
    const float w = expf((float)(((double)v - c.mx) * c.inv_t));
    return (unsigned long long)((double)w * SAMPLE_SCALE);
}

/* (ka, ia) before (kb, ib) in the host's order: the value descending, the
 * id ascending; id -1 is nothing. */
__device__ static inline int before(unsigned ka, int ia, unsigned kb, int ib)
{
    return ia >= 0 && (ib < 0 || ka > kb || (ka == kb && ia < ib));
}

enum { RED_MAX, RED_MIN };

/* The cluster's max or min of each block's MINE (the same in all of a
 * block's threads), in every thread of every block. */
__device__ static unsigned long long cluster_reduce(pick_sh *s, unsigned long long mine, int op)
{
    cg::cluster_group cl = cg::this_cluster();
    if (threadIdx.x == 0) s->xch = mine;
    cl.sync();
    unsigned long long r = *cl.map_shared_rank(&s->xch, 0);
    for (unsigned b = 1; b < cl.num_blocks(); b++) {
        const unsigned long long x = *cl.map_shared_rank(&s->xch, b);
        r = op == RED_MAX ? (x > r ? x : r) : (x < r ? x : r);
    }
    cl.sync();   /* before any block writes its xch again */
    return r;
}

/* The first token in the host's order after (PK, PI) (PI -1: the very
 * first), or with LAST the last one that is in: its key in *KEY, its id
 * returned (-1: none). */
__device__ static int first_after(pick_sh *s, const float *row, int V, unsigned pk, int pi, int last, unsigned *key)
{
    const pick_set c = s->set;
    unsigned bk = 0;
    int bi = -1;
    each(row, V, [&](int i, float v, int ok) {
        const unsigned k = fkey(v);
        if (!ok || (last ? !is_in(c, k, i) : pi >= 0 && !before(pk, pi, k, i))) return;
        if (bi < 0 || (last ? before(bk, bi, k, i) : before(k, i, bk, bi))) bk = k, bi = i;
    });
    for (int o = 16; o; o >>= 1) {
        unsigned ok = __shfl_xor_sync(0xffffffffu, bk, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || (last ? before(bk, bi, ok, oi) : before(ok, oi, bk, bi)))) bk = ok, bi = oi;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s->rkey[threadIdx.x >> 5] = bk, s->rid[threadIdx.x >> 5] = bi;
    __syncthreads();
    bk = s->rkey[0], bi = s->rid[0];
    for (int w = 1; w < PICK_WARPS; w++) {
        const unsigned ok = s->rkey[w];
        const int oi = s->rid[w];
        if (oi >= 0 && (bi < 0 || (last ? before(bk, bi, ok, oi) : before(ok, oi, bk, bi)))) bk = ok, bi = oi;
    }
    /* the cluster's: the order packed into 64 bits as (key, ~id), the first the largest, the last the
     * smallest; nothing finite packs to 0 or to all ones */
    const unsigned long long none = last ? ~0ull : 0ull,
                             mine = bi < 0 ? none : ((unsigned long long)bk << 32) | ~(unsigned)bi,
                             r = cluster_reduce(s, mine, last ? RED_MIN : RED_MAX);
    if (r == none) return -1;
    *key = (unsigned)(r >> 32);
    return (int)~(unsigned)r;
}

/* Whether the running count or weight ACC has reached the target (GE) or
 * passed it: the host's test, on the same integers. */
__device__ static inline int reached(unsigned long long acc, double target, int ge)
{
    return ge ? (double)acc >= target : (double)acc > target;
}

/* The coarse level of a token of value V: its distance below the maximum
 * in units of T, d = (max - v) / T, in bins of 1/8 over [0, 32) (past 32 a
 * weight is below 2^-40: 0), the nearest the highest bin. It orders the
 * tokens as their values do (ties kept), and spreads them where weights
 * differ, which the values' leading bits (sign, exponent) do not. */
__device__ static inline unsigned coarse(const pick_set &c, float v)
{
    /* float is enough: any order-keeping bucketing is; the max itself is at 0 even when 1/T is infinite */
    const float gap = c.mxf - v, d = gap > 0.0f ? gap * c.inv_tf : 0.0f;
    return d < 32 ? PICK_BINS - 1 - (unsigned)(d * 8) : 0;
}

/* One pass of radix_level, into s->hist: the count or weight of the tokens
 * in, by their coarse level (SHIFT < 0), or, among those at coarse level
 * s->cbin whose key matches PREFIX under HIMASK, by the key's 8 bits at
 * SHIFT (those listed in s->list when LISTED). A warp adds its lanes of one
 * bin together first. */
__device__ static void histogram(pick_sh *s, const float *row, int V, int mass, unsigned prefix, unsigned himask,
                                 int shift, int listed)
{
    unsigned long long *h = s->part[(threadIdx.x >> 5) % PICK_COPIES];
    for (int b = threadIdx.x; b < PICK_COPIES * PICK_BINS; b += PICK_THREADS) (&s->part[0][0])[b] = 0;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const unsigned cbin = s->cbin;
    const pick_set c = s->set;
    auto add = [&](int i, float v, int ok) {
        const unsigned k = fkey(v);
        unsigned bin = 0xFFFFFFFFu;
        unsigned long long val = 0;
        if (ok && is_in(c, k, i)) {
            const unsigned cl = coarse(c, v);
            if (shift < 0 || (cl == cbin && (k & himask) == prefix)) {
                val = mass ? weight(c, v) : 1;
                if (val) bin = shift < 0 ? cl : (k >> shift) & (PICK_BINS - 1);   /* a weight of 0 adds nothing */
            }
        }
        if (!__any_sync(0xffffffffu, bin != 0xFFFFFFFFu)) return;
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (bin == 0xFFFFFFFFu) return;
        if (peers == 1u << lane) {
            atomicAdd(&h[bin], val);
            return;
        }
        /* the lanes of one bin: one adds their sum (a weight is at most 2^SAMPLE_FIX: halves of 20
         * and 21 bits sum over 32 lanes within 32 bits) */
        const unsigned lo = __reduce_add_sync(peers, (unsigned)(val & 0xFFFFFu)),
                       hi = __reduce_add_sync(peers, (unsigned)(val >> 20));
        if (lane == __ffs(peers) - 1) atomicAdd(&h[bin], ((unsigned long long)hi << 20) + lo);
    };
    if (listed)
        for (int base = 0; base < s->n_list; base += PICK_THREADS) {   /* the same trip count for every lane */
            const int j = base + (int)threadIdx.x, ok = j < s->n_list, i = ok ? s->list[j] : 0;
            add(i, ok ? row[i] : 0.0f, ok);
        }
    else
        each(row, V, add);
    __syncthreads();
    for (int b = threadIdx.x; b < PICK_BINS; b += PICK_THREADS) {
        unsigned long long t = 0;
        for (int c = 0; c < PICK_COPIES; c++) t += s->part[c][b];
        s->hist[b] = t;
    }
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    for (int b = threadIdx.x; b < PICK_BINS; b += PICK_THREADS) {
        unsigned long long t = 0;
        for (unsigned r = 0; r < cl.num_blocks(); r++) t += cl.map_shared_rank(s->hist, r)[b];
        s->merged[b] = t;
    }
    cl.sync();   /* before any block's next histogram */
}

/* Lists the tokens in at coarse level s->cbin (of weight above 0, for
 * MASS) of this block's share in s->list; whether every block's fit. */
__device__ static int list_level(pick_sh *s, const float *row, int V, int mass)
{
    if (threadIdx.x == 0) s->n_list = 0;
    __syncthreads();
    const unsigned cbin = s->cbin;
    const pick_set c = s->set;
    each(row, V, [&](int i, float v, int ok) {
        if (!ok || coarse(c, v) != cbin || !is_in(c, fkey(v), i) || (mass && !weight(c, v))) return;
        const int at = atomicAdd(&s->n_list, 1);
        if (at < PICK_LIST) s->list[at] = i;
    });
    __syncthreads();
    const int most = (int)cluster_reduce(s, (unsigned long long)s->n_list, RED_MAX);   /* every block's must fit */
    if (threadIdx.x == 0) s->listed = most <= PICK_LIST;
    __syncthreads();
    return s->listed;
}

/* Scans s->merged from the top bin down (one warp, 8 bins a lane) for the
 * first bin where s->above plus the running sum reaches TARGET (GE) or
 * passes it, TARGET first made a fraction of the total when FRAC: the bin
 * into *BIN, s->above and s->at updated, s->hit and s->target set. */
__device__ static void scan(pick_sh *s, double target, int frac, int ge, unsigned *bin)
{
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x, per = PICK_BINS / 32, hi = PICK_BINS - 1 - lane * per;
        unsigned long long sum = 0;
        for (int b = hi; b > hi - per; b--) sum += s->merged[b];
        unsigned long long inc = sum;
        for (int o = 1; o < 32; o <<= 1) {
            unsigned long long y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += y;
        }
        if (frac) target *= (double)__shfl_sync(0xffffffffu, inc, 31);   /* the total */
        const unsigned long long base = s->above;
        const unsigned hit = __ballot_sync(0xffffffffu, reached(base + inc, target, ge));
        if (lane == 0) s->hit = hit ? 1 : 0, s->target = target;
        if (hit && lane == __ffs(hit) - 1) {
            unsigned long long acc = base + inc - sum;
            for (int b = hi; b > hi - per; b--) {
                const unsigned long long h = s->merged[b];
                if (reached(acc + h, target, ge)) {
                    *bin = (unsigned)b;
                    s->above = acc;
                    s->at = h;
                    break;
                }
                acc += h;
            }
        }
    }
    __syncthreads();
}

/* The level where the running count (MASS 0) or weight (MASS 1) of the
 * tokens in, taken from the top, first reaches TARGET (GE 1) or passes it
 * (GE 0); with FRAC, TARGET is a fraction of their total. First the coarse
 * level, then the exact key within it, 8 bits a pass. Into s->level, with
 * what lies above it in s->above and at it in s->at; returns 0 when no
 * level does (a fraction of 1 or more). */
__device__ static int radix_level(pick_sh *s, const float *row, int V, int mass, double target, int frac, int ge)
{
    if (threadIdx.x == 0) s->above = 0;
    histogram(s, row, V, mass, 0, 0, -1, 0);
    scan(s, target, frac, ge, &s->cbin);
    if (!s->hit) return 0;
    target = s->target;
    /* within the coarse level (whose tokens reach the target, with what lies above it), the key */
    const int listed = list_level(s, row, V, mass);
    unsigned prefix = 0, himask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        histogram(s, row, V, mass, prefix, himask, shift, listed);
        scan(s, target, 0, ge, &s->digit);
        prefix |= s->digit << shift;
        himask |= (unsigned)(PICK_BINS - 1) << shift;
    }
    if (threadIdx.x == 0) s->level = prefix;
    __syncthreads();
    return 1;
}

/* The id of the J-th (from 0) token in at level K, by id. The first is the
 * least id (one pass, the cluster's least); a later one (tied values) is
 * found by block 0 alone walking the whole row a tile of PICK_THREADS ids
 * at a time, counting the tile's ties at a barrier. */
__device__ static int nth_tie(pick_sh *s, const float *row, int V, unsigned K, int j)
{
    const pick_set c = s->set;
    if (threadIdx.x == 0) s->found = 0x7fffffff;
    __syncthreads();
    if (j == 0) {   /* the tokens at K are among those radix_level listed, if it could */
        int least = 0x7fffffff;
        auto least_of = [&](int i, float v, int ok) {
            const unsigned k = fkey(v);
            if (ok && k == K && is_in(c, k, i) && i < least) least = i;
        };
        if (s->listed)
            for (int j2 = threadIdx.x; j2 < s->n_list; j2 += PICK_THREADS) least_of(s->list[j2], row[s->list[j2]], 1);
        else
            each(row, V, least_of);
        atomicMin(&s->found, least);
        __syncthreads();
        return (int)cluster_reduce(s, (unsigned long long)s->found, RED_MIN);
    }
    if (cg::this_cluster().block_rank() == 0) {
        int seen = 0;
        for (int base = 0; base < V; base += PICK_THREADS) {
            const int i = base + threadIdx.x;
            const unsigned k = i < V ? fkey(row[i]) : 0;
            const int tie = i < V && k == K && is_in(c, k, i), in_tile = __syncthreads_count(tie);
            if (seen + in_tile > j) {   /* in this tile: the tie's rank among the tile's, from the warps' counts */
                const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
                const unsigned votes = __ballot_sync(0xffffffffu, tie);
                if (lane == 0) s->cnt[w] = __popc(votes);
                __syncthreads();
                int rank = seen + __popc(votes & ((1u << lane) - 1));
                for (int x = 0; x < w; x++) rank += s->cnt[x];
                if (tie && rank == j) s->found = i;
                break;
            }
            seen += in_tile;
        }
    }
    __syncthreads();
    return (int)cluster_reduce(s, (unsigned long long)s->found, RED_MIN);   /* block 0's; the others hold none */
}

/* Among the TIES tokens of weight W at the level radix_level found (with
 * ABOVE before them), how many the host's walk takes until the running
 * weight reaches (GE) or passes TARGET: the fewest n with
 * reached(above + n w); at least 1, at most TIES. */
__device__ static int ties_taken(unsigned long long above, unsigned long long w, int ties, double target, int ge)
{
    int n = w ? (int)fmin((double)ties, fmax(1.0, floor((target - (double)above) / (double)w))) : ties;
    while (n > 1 && reached(above + (unsigned long long)(n - 1) * w, target, ge)) n--;
    while (n < ties && !reached(above + (unsigned long long)n * w, target, ge)) n++;
    return n;
}

__global__ static void __launch_bounds__(PICK_THREADS)
    pick_kernel(const float *logprobs, int V, const pick_req *req, pick_out *out)
{
    __shared__ pick_sh s;
    const unsigned nb = cg::this_cluster().num_blocks();   /* (gpu_pick's cluster: 1 or PICK_CLUSTER blocks) */
    const pick_req q = req[blockIdx.x / nb];
    const float *row = logprobs + (size_t)q.row * V;
    const int writer = cg::this_cluster().block_rank() == 0 && threadIdx.x == 0;
    pick_out *o = out + blockIdx.x / nb;
    int bad = 0;
    each(row, V, [&](int i, float v, int ok) {
        (void)i;
        bad |= ok && !isfinite(v);
    });
    if (threadIdx.x == 0) s.set.has_k = s.set.has_p = s.listed = 0;
    if (writer)
        for (int t = 0; t < PICK_MAX_TOP; t++) o->top[t] = 0, o->top_lp[t] = 0;   /* what is not asked for reads as nothing */
    bad = __syncthreads_or(bad);
    if (cluster_reduce(&s, (unsigned long long)bad, RED_MAX)) {
        if (writer) o->token = -1, o->lp = 0;
        return;
    }
    /* the top tokens; the first of them is the greedy pick and the max */
    const int n = q.top_n > PICK_MAX_TOP ? PICK_MAX_TOP : q.top_n;
    unsigned k0 = 0, kt = 0;
    int id0 = first_after(&s, row, V, 0, -1, 0, &k0), it = id0;
    kt = k0;
    for (int t = 0; t < n; t++) {
        if (t) it = it >= 0 ? first_after(&s, row, V, kt, it, 0, &kt) : -1;
        if (writer) o->top[t] = it, o->top_lp[t] = it >= 0 ? row[it] : -INFINITY;
    }
    int token = 0;
    if (q.sample && !(q.sp.temperature > 0 && q.sp.top_k != 1)) token = id0;   /* greedy (sample_draws) */
    else if (q.sample) {
        if (threadIdx.x == 0)
            s.set.mx = keyf(k0), s.set.inv_t = 1.0 / q.sp.temperature, s.set.mxf = keyf(k0), s.set.inv_tf = (float)s.set.inv_t;
        __syncthreads();
        if (q.sp.top_k > 0 && q.sp.top_k < V) {   /* the first top_k: a level by count, then the ties by id */
            radix_level(&s, row, V, 0, q.sp.top_k, 0, 1);
            const unsigned K = s.level;
            const int last = nth_tie(&s, row, V, K, q.sp.top_k - (int)s.above - 1);
            if (threadIdx.x == 0) s.set.kk = K, s.set.idk = last, s.set.has_k = 1;
            __syncthreads();
        }
        if (q.sp.top_p > 0 && q.sp.top_p < 1) {   /* the shortest prefix of weight >= top_p of theirs */
            radix_level(&s, row, V, 1, q.sp.top_p, 1, 1);
            const unsigned K = s.level;
            const unsigned long long w = weight(s.set, keyf(K));
            const int j = ties_taken(s.above, w, (int)(s.at / w), s.target, 1);
            const int last = nth_tie(&s, row, V, K, j - 1);
            if (threadIdx.x == 0) s.set.kp = K, s.set.idp = last, s.set.has_p = 1;
            __syncthreads();
        }
        /* the draw: the first token whose running weight passes u times the total */
        if (radix_level(&s, row, V, 1, q.u, 1, 0)) {
            const unsigned K = s.level;
            const unsigned long long w = weight(s.set, keyf(K));
            const int j = ties_taken(s.above, w, (int)(s.at / w), s.target, 0);
            token = nth_tie(&s, row, V, K, j - 1);
        } else {   /* past the end, by rounding: the last token in */
            unsigned kl;
            token = first_after(&s, row, V, 0, -1, 1, &kl);
        }
    }
    if (writer) {
        o->token = token >= 0 && token < V ? token : id0;   /* (always in: a level found has its tokens) */
        o->lp = row[o->token];
    }
}

/* A row of up to PICK_SMALL tokens: one block a pick, a token a thread,
 * the host's own walk. The tokens are sorted in the host's order (value
 * descending, the lowest id first on ties) as keys (value, ~id) in shared
 * memory: a row of up to PICK_RANK_MAX tokens by rank (each token counts
 * the keys above its own: V^2 / 32 cycles of an SM, no barrier), a longer
 * one by a bitonic sort (log2(N)^2 / 2 barriers, which cost more below
 * it); their weights are summed as a running scan of the same integers
 * (exact), and each cut is the first position where the host's test holds.
 * On a row of 256 tokens the radix select's many rounds of block and
 * cluster synchronisation took 86 to 104 us a draw (H200). */
#define PICK_SMALL 1024
#define PICK_SMALL_WARPS (PICK_SMALL / 32)
#define PICK_RANK_MAX 512

/* The inclusive running sum of each thread's W over threads 0..t (exact) */
__device__ static unsigned long long scan_u64(unsigned long long w, unsigned long long *warp_tot)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long x = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += x;
    }
    if (lane == 31) warp_tot[warp] = w;
    __syncthreads();
    if (warp == 0) {
        unsigned long long x = lane < PICK_SMALL_WARPS ? warp_tot[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane < PICK_SMALL_WARPS) warp_tot[lane] = x;
    }
    __syncthreads();
    return warp ? w + warp_tot[warp - 1] : w;
}

__global__ static void __launch_bounds__(PICK_SMALL)
    pick_small(const float *logprobs, int V, int N, const pick_req *req, pick_out *out)
{
    __shared__ __align__(16) unsigned long long key[2 * PICK_SMALL];   /* the keys, then (by rank) in order */
    __shared__ unsigned long long warp_tot[PICK_SMALL_WARPS];
    __shared__ int first;
    const pick_req q = req[blockIdx.x];
    const float *row = logprobs + (size_t)q.row * V;
    pick_out *o = out + blockIdx.x;
    const int t = threadIdx.x;
    const float v = t < V ? row[t] : 0.0f;
    if (__syncthreads_or(t < V && !isfinite(v))) {
        if (t == 0) {
            for (int k = 0; k < PICK_MAX_TOP; k++) o->top[k] = 0, o->top_lp[k] = 0;
            o->token = -1, o->lp = 0;
        }
        return;
    }
    /* the host's order: the keys, then padding below every token's (0) up to a multiple of 4 (by rank) or N
     * (a power of two >= V: the bitonic sort) */
    const int rank = V <= PICK_RANK_MAX, pad = rank ? (V + 3) & ~3 : N;
    if (t < pad) key[t] = t < V ? (unsigned long long)fkey(v) << 32 | (0xffffffffu - (unsigned)t) : 0ull;
    __syncthreads();
    const unsigned long long *srt = key;   /* the keys in order */
    if (rank) {   /* each key's place: how many are above it (the keys differ: their ids do) */
        if (t < V) {
            const unsigned long long mine = key[t];
            int r = 0;
            for (int j = 0; j < pad; j += 4) {
                const ulonglong2 a = *(const ulonglong2 *)(key + j), b = *(const ulonglong2 *)(key + j + 2);
                r += (a.x > mine) + (a.y > mine) + (b.x > mine) + (b.y > mine);
            }
            key[PICK_SMALL + r] = mine;
        }
        srt = key + PICK_SMALL;
    } else
        for (int k = 2; k <= N; k <<= 1)
            for (int j = k >> 1; j > 0; j >>= 1) {
                const int p = t ^ j;
                if (t < N && p > t) {
                    const unsigned long long a = key[t], b = key[p];
                    if ((t & k) == 0 ? a < b : a > b) key[t] = b, key[p] = a;
                }
                __syncthreads();
            }
    __syncthreads();
    const int id = t < V ? (int)(0xffffffffu - (unsigned)(srt[t] & 0xffffffffu)) : -1;   /* the t-th in order */
    const int ntop = q.top_n < 0 ? 0 : q.top_n > PICK_MAX_TOP ? PICK_MAX_TOP : q.top_n;
    if (t < PICK_MAX_TOP) {   /* the top tokens; what is not asked for reads as nothing */
        o->top[t] = t < ntop ? id : 0;
        o->top_lp[t] = t < ntop ? (id >= 0 ? row[id] : -INFINITY) : 0;
    }
    if (t == 0) first = -1;
    __syncthreads();
    int token = 0;
    if (q.sample && !(q.sp.temperature > 0 && q.sp.top_k != 1)) {   /* greedy (sample_draws): the first in order */
        if (t == 0) first = id;
        __syncthreads();
        token = first;
    } else if (q.sample) {
        __shared__ int cut;
        int n = q.sp.top_k > 0 && q.sp.top_k < V ? q.sp.top_k : V;
        __shared__ unsigned long long tot[2];
        pick_set c = {};
        c.mx = (double)row[(int)(0xffffffffu - (unsigned)(srt[0] & 0xffffffffu))];   /* the first in order */
        c.inv_t = 1.0 / q.sp.temperature;
        const unsigned long long w = t < n ? weight(c, row[id]) : 0;
        const unsigned long long cum = scan_u64(w, warp_tot);   /* running weight through position t */
        /* the shortest prefix whose weight reaches top_p of the total */
        if (t == n - 1) tot[0] = cum;
        __syncthreads();
        unsigned long long total = tot[0];
        if (q.sp.top_p > 0 && q.sp.top_p < 1) {
            const double target = q.sp.top_p * (double)total;
            if (t == 0) cut = n;
            __syncthreads();
            if (t < n && (double)cum >= target) atomicMin(&cut, t + 1);
            __syncthreads();
            n = cut;
            if (t == n - 1) tot[1] = cum;
            __syncthreads();
            total = tot[1];
        }
        /* the first position whose running weight passes u times the total, else the last in */
        const double target = q.u * (double)total;
        if (t == 0) cut = n - 1;
        __syncthreads();
        if (t < n && (double)cum > target) atomicMin(&cut, t);
        __syncthreads();
        if (t == cut) first = id;
        __syncthreads();
        token = first;
    }
    if (t == 0) {
        o->token = token >= 0 && token < V ? token : 0;
        o->lp = row[o->token];
    }
}

int gpu_pick(gpu_model *g, int n, const pick_req *d_req, pick_out *d_out, char *err)
{
    if (n <= 0) return 0;
    const int V = g->m->V;
    if (V <= PICK_SMALL) {
        int N = 32;
        while (N < V) N <<= 1;
        pick_small<<<n, PICK_SMALL, 0, g->stream>>>(g->logits, V, N, d_req, d_out);
        CU_TRY(cudaGetLastError(), err, "pick_small");
        return 0;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = V <= PICK_SMALL_V ? 1 : PICK_CLUSTER;
    at[0].val.clusterDim.y = at[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3((unsigned)n * at[0].val.clusterDim.x);
    cfg.blockDim = dim3(PICK_THREADS);
    cfg.stream = g->stream;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CU_TRY(cudaLaunchKernelEx(&cfg, pick_kernel, (const float *)g->logits, V, d_req, d_out), err, "pick_kernel");
    return 0;
}
