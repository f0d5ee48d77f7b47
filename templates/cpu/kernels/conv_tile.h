/* The direct conv's register tile and work unit for one vector width (kernels/conv.h includes this file once per
 * width). A fixed RLX kernel header: no template code.
 *
 * Before each inclusion conv.h defines RLX_CONV_TILE_V (floats per vector: 8 or 16, ConvPlan.vector),
 * RLX_CONV_TILE_T (a GCC/Clang vector type of that many floats) and RLX_CONV_TILE_TU (the same at any float's
 * address); this file defines, for V = RLX_CONV_TILE_V (a tile and panel: 2 V pixels, RLX_CONV_PX<V>),
 *   rlx_conv_direct_tile<V>  RLX_CONV_OR output channels x 2 V pixels accumulated in 12 vector registers;
 *   rlx_conv_direct_unit<V>  a block of output channels over a run of panels, RLX_CONV_CB input channels at a time;
 *   rlx_conv_dw_plane<V>     a depthwise window over one plane, RLX_DW_VEC outputs at a time;
 *   rlx_conv_dw_s2_row<V>    one output row of a 3 x 3, stride-2 depthwise window read straight from the plane;
 *   rlx_conv_dw_s1_plane<V>  a depthwise window of strides 1 or 2 on a plane whose output rows fit a vector (at
 *                            most V of them), each input row one vector (or two, split by column parity), its taps
 *                            lane shifts of it;
 *   rlx_pool_max_s2_row<V>   one output row of a 3 x 3, stride-2 max pool read straight from the plane;
 *   rlx_conv_lanes_block<V>  up to V output pixels of a row x V output channels of a conv, the channels in the
 *                            lanes (each input value broadcast once per window row), transposed into V rows of
 *                            V pixels;
 * and undefines the three parameters. No include guard: each inclusion is another width. */

#define RLX_CONV_CAT_(a, b) a##b
#define RLX_CONV_CAT(a, b) RLX_CONV_CAT_(a, b)
#define RLX_CONV_TILE_FN RLX_CONV_CAT(rlx_conv_direct_tile, RLX_CONV_TILE_V)
#define RLX_CONV_UNIT_FN RLX_CONV_CAT(rlx_conv_direct_unit, RLX_CONV_TILE_V)
#define RLX_CONV_TILE_PX (2 * RLX_CONV_TILE_V)
#define RLX_CONV_DW_FN RLX_CONV_CAT(rlx_conv_dw_plane, RLX_CONV_TILE_V)
#define RLX_CONV_DW_NV (RLX_DW_VEC / RLX_CONV_TILE_V)  /* vectors of a run of RLX_DW_VEC outputs: 4 or 2 */
#define RLX_CONV_DW_G (8 / RLX_CONV_DW_NV)  /* groups of taps summed apart: 8 independent chains of multiply-adds */
#define RLX_CONV_DW2_FN RLX_CONV_CAT(rlx_conv_dw_s2_row, RLX_CONV_TILE_V)
#define RLX_CONV_S2_TAPS_FN RLX_CONV_CAT(rlx_conv_s2_taps, RLX_CONV_TILE_V)
#define RLX_CONV_DWS_FN RLX_CONV_CAT(rlx_conv_dw_s1_plane, RLX_CONV_TILE_V)
#define RLX_CONV_DWT_FN RLX_CONV_CAT(rlx_conv_dw_s1_tail, RLX_CONV_TILE_V)
#define RLX_CONV_SHIFT_FN RLX_CONV_CAT(rlx_conv_lane_shift, RLX_CONV_TILE_V)
#define RLX_CONV_TILE_I RLX_CONV_CAT(rlx_conv_lanes, RLX_CONV_TILE_V)
#define RLX_CONV_LANES_FN RLX_CONV_CAT(rlx_conv_lanes_block, RLX_CONV_TILE_V)
#define RLX_POOL_MAX2_FN RLX_CONV_CAT(rlx_pool_max_s2_row, RLX_CONV_TILE_V)
#define RLX_POOL_TAKE_FN RLX_CONV_CAT(rlx_pool_take, RLX_CONV_TILE_V)
#define RLX_CONV_TRANSPOSE_FN RLX_CONV_CAT(rlx_conv_transpose, RLX_CONV_TILE_V)
typedef int RLX_CONV_TILE_I __attribute__((vector_size(RLX_CONV_TILE_V * 4)));
/* lanes of two V-float vectors (a, b): the even ones, the odd ones, and a's last then b's first V - 1 */
#if RLX_CONV_TILE_V == 16
#define RLX_CONV_DW2_EVEN 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define RLX_CONV_DW2_ODD 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#define RLX_CONV_DW2_PREV 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30
#else
#define RLX_CONV_DW2_EVEN 0, 2, 4, 6, 8, 10, 12, 14
#define RLX_CONV_DW2_ODD 1, 3, 5, 7, 9, 11, 13, 15
#define RLX_CONV_DW2_PREV 7, 8, 9, 10, 11, 12, 13, 14
#endif

/* Tile rows [0, mr) of out (rows ldo apart, 2 V pixels each) (+)= the sum over channels c < C and taps t < T of
 * w[r * K + c * T + t] * xq[c * CS + tap[t] + (0 .. 2 V - 1)]: two unaligned vector loads of the plane, one
 * broadcast weight per row and twelve multiply-adds per (c, t); `accumulate` adds to what out holds. */
static inline __attribute__((always_inline)) void RLX_CONV_TILE_FN(const int mr, const float *restrict xq,
        int64_t CS, int64_t C, const int64_t *restrict tap, int64_t T, const float *restrict w, int64_t K,
        float *restrict out, int64_t ldo, int accumulate)
{
    RLX_CONV_TILE_T c0[RLX_CONV_OR], c1[RLX_CONV_OR];
    #pragma GCC unroll 6
    for (int r = 0; r < RLX_CONV_OR; r++)
        if (r < mr) {
            if (accumulate) {
                c0[r] = ((const RLX_CONV_TILE_TU *)(out + r * ldo))[0];
                c1[r] = ((const RLX_CONV_TILE_TU *)(out + r * ldo))[1];
            } else {
                c0[r] = (RLX_CONV_TILE_T){0.0f};
                c1[r] = c0[r];
            }
        }
    for (int64_t c = 0; c < C; c++) {
        const float *restrict xc = xq + c * CS;
        const float *restrict wc = w + c * T;
        #pragma GCC unroll 9
        for (int64_t t = 0; t < T; t++) {
            const RLX_CONV_TILE_TU *src = (const RLX_CONV_TILE_TU *)(xc + tap[t]);
            const RLX_CONV_TILE_T b0 = src[0], b1 = src[1];
            #pragma GCC unroll 6
            for (int r = 0; r < RLX_CONV_OR; r++)
                if (r < mr) {
                    const float a = wc[r * K + t];
                    c0[r] += a * b0;
                    c1[r] += a * b1;
                }
        }
    }
    #pragma GCC unroll 6
    for (int r = 0; r < RLX_CONV_OR; r++)
        if (r < mr) {
            RLX_CONV_TILE_TU *o = (RLX_CONV_TILE_TU *)(out + r * ldo);
            o[0] = c0[r];
            o[1] = c1[r];
        }
}

/* Output channels [0, oc) of w (rows K apart) over the pixel panels [p0, p1) of phase planes xq into stage
 * (row o at o * lds, panel p at (p - p0) * 2 V), RLX_CONV_CB input channels at a time: a block's input
 * under one panel (3 x 3 window: CB x 3 rows x 2 lines) and a tile's weights for it stay in L1 while every
 * channel block of the unit passes; the unit's weights (oc x K) stay in L2 across its panels. Inlined into each
 * conv with its window, strides and planes as constants (the taps' offsets are then immediate). */
static inline __attribute__((always_inline)) void RLX_CONV_UNIT_FN(const float *xq, const int64_t CS,
        const int64_t C, const int64_t *tap, const int64_t T, const float *w, int64_t oc, int64_t p0, int64_t p1,
        float *stage, const int64_t lds)
{
    const int64_t K = C * T;
    for (int64_t c0 = 0; c0 < C; c0 += RLX_CONV_CB) {
        const int64_t cn = C - c0 < RLX_CONV_CB ? C - c0 : RLX_CONV_CB;
        for (int64_t p = p0; p < p1; p++) {
            const float *xp = xq + c0 * CS + p * RLX_CONV_TILE_PX;
            const float *wc = w + c0 * T;
            float *sp = stage + (p - p0) * RLX_CONV_TILE_PX;
            const int acc = c0 > 0;
            for (int64_t o = 0; o < oc;) {
                const int64_t r = oc - o >= 6 ? 6 : oc - o >= 4 ? 4 : oc - o >= 2 ? 2 : 1;
                switch (r) {
                case 6: RLX_CONV_TILE_FN(6, xp, CS, cn, tap, T, wc + o * K, K, sp + o * lds, lds, acc); break;
                case 4: RLX_CONV_TILE_FN(4, xp, CS, cn, tap, T, wc + o * K, K, sp + o * lds, lds, acc); break;
                case 2: RLX_CONV_TILE_FN(2, xp, CS, cn, tap, T, wc + o * K, K, sp + o * lds, lds, acc); break;
                default: RLX_CONV_TILE_FN(1, xp, CS, cn, tap, T, wc + o * K, K, sp + o * lds, lds, acc); break;
                }
                o += r;
            }
        }
    }
}

/* bias + the window of w[KH, KW] over one plane x[H, W], returned WQ wide (output row oh at oh * WQ, columns
 * OW .. WQ-1 dropped) inside q, which holds rlx_conv_dw_scratch floats. tap[kh * KW + kw] is window tap (kh, kw)'s
 * offset into the phase planes (its phase plane, row and column: rlx/codegen/cpu/conv.py's tap_offsets, a constant
 * array of the generated source). Inlined into each conv with its geometry as constants: no division per plane.
 * A run of RLX_DW_VEC outputs is accumulated over every tap in 8 vector registers: its RLX_CONV_DW_NV vectors x
 * RLX_CONV_DW_G groups of taps (tap t into group t % G), the groups added at the end: one chain per vector waited on
 * each multiply-add's latency (a 5 x 5 window on a 14 x 14 plane: 25 dependent steps per run). */
static inline __attribute__((always_inline)) const float *RLX_CONV_DW_FN(const float *restrict x,
        const float *restrict w, float bias, const rlx_conv_geom *g, const int64_t *restrict tap, float *restrict q)
{
    const int64_t WQ = rlx_conv_dw_wq(g);
    const int64_t L = g->OH * WQ, LP = (L + RLX_DW_VEC - 1) / RLX_DW_VEC * RLX_DW_VEC;
    float *restrict acc = q + g->SH * g->SW * rlx_conv_dw_phase(g);  /* the phase planes, then the output */
    rlx_conv_phase_copy(x, g, q);
    const int64_t taps = g->KH * g->KW;
    for (int64_t i0 = 0; i0 < LP; i0 += RLX_DW_VEC) {
        RLX_CONV_TILE_T s[RLX_CONV_DW_G][RLX_CONV_DW_NV];
        #pragma GCC unroll 4
        for (int j = 0; j < RLX_CONV_DW_G; j++)
            #pragma GCC unroll 4
            for (int v = 0; v < RLX_CONV_DW_NV; v++)
                s[j][v] = (RLX_CONV_TILE_T){0.0f} + (j == 0 ? bias : 0.0f);
        const float *qi = q + i0;
        int64_t t = 0;
        for (; t + RLX_CONV_DW_G <= taps; t += RLX_CONV_DW_G)
            #pragma GCC unroll 4
            for (int j = 0; j < RLX_CONV_DW_G; j++) {
                const RLX_CONV_TILE_TU *src = (const RLX_CONV_TILE_TU *)(qi + tap[t + j]);
                const float wv = w[t + j];
                #pragma GCC unroll 4
                for (int v = 0; v < RLX_CONV_DW_NV; v++)
                    s[j][v] += wv * src[v];
            }
        for (; t < taps; t++) {  /* the last taps, fewer than a group: into group 0 */
            const RLX_CONV_TILE_TU *src = (const RLX_CONV_TILE_TU *)(qi + tap[t]);
            const float wv = w[t];
            #pragma GCC unroll 4
            for (int v = 0; v < RLX_CONV_DW_NV; v++)
                s[0][v] += wv * src[v];
        }
        RLX_CONV_TILE_TU *out = (RLX_CONV_TILE_TU *)(acc + i0);
        #pragma GCC unroll 4
        for (int v = 0; v < RLX_CONV_DW_NV; v++) {
            RLX_CONV_TILE_T sum = s[0][v];
            #pragma GCC unroll 4
            for (int j = 1; j < RLX_CONV_DW_G; j++)
                sum += s[j][v];
            out[v] = sum;
        }
    }
    return acc;
}

/* The three taps of a stride-2 window row for V outputs from input column c0 (tap kw = 1 of the first) on row ih of
 * the plane (xr = its first column): *even (kw = 1) and *odd (kw = 2) from two vectors of input columns, *prev (kw =
 * 0) the odd ones moved one lane up behind column c0 - 1; columns outside the plane read `fill` (0 for a conv, -inf
 * for a max pool). */
static inline __attribute__((always_inline)) void RLX_CONV_S2_TAPS_FN(const float *restrict xr, const int64_t c0,
        const rlx_conv_geom *g, const int64_t ih, const float fill, RLX_CONV_TILE_T *prev, RLX_CONV_TILE_T *even,
        RLX_CONV_TILE_T *odd)
{
    const int64_t V = RLX_CONV_TILE_V;
    const float left = c0 > 0 && c0 - 1 < g->W ? xr[c0 - 1] : fill;
    RLX_CONV_TILE_T a, b;
    /* whole vectors where they stay inside the plane: past the row's end (lanes of outputs past OW, never of a
       column W: W even) they read the next row's first columns */
    if (c0 + 2 * V <= g->W || (g->W % 2 == 0 && ih + 1 < g->H && c0 + 2 * V <= 2 * g->W)) {
        a = *(const RLX_CONV_TILE_TU *)(xr + c0);
        b = *(const RLX_CONV_TILE_TU *)(xr + c0 + V);
    } else {
        float buf[2 * RLX_CONV_TILE_V] __attribute__((aligned(64)));
        const int64_t n = g->W - c0 < 0 ? 0 : g->W - c0;
        for (int64_t i = 0; i < n && i < 2 * V; i++)
            buf[i] = xr[c0 + i];
        for (int64_t i = n; i < 2 * V; i++)
            buf[i] = fill;
        a = *(const RLX_CONV_TILE_T *)buf;
        b = *(const RLX_CONV_TILE_T *)(buf + V);
    }
    *even = __builtin_shufflevector(a, b, RLX_CONV_DW2_EVEN);
    *odd = __builtin_shufflevector(a, b, RLX_CONV_DW2_ODD);
    *prev = __builtin_shufflevector((RLX_CONV_TILE_T){0.0f} + left, *odd, RLX_CONV_DW2_PREV);
}

/* One output row oh of a 3 x 3, stride-2, undilated depthwise window (left pad 1; ConvPlan layout nchw_rows) read
 * straight from the plane x[H, W], no phase copy: row[ow] = bias + sum of w[kh, kw] * x[2 oh - PH + kh, 2 ow - 1 + kw]
 * (zeros outside the plane) for ow < OW; row holds OW rounded up to V floats. V outputs at a time: the two vectors of
 * input columns 2 ow0 .. 2 ow0 + 2 V - 1 are split into their even columns (tap kw = 1) and odd ones (kw = 2), and the
 * odd ones moved one lane up behind column 2 ow0 - 1 (kw = 0): three shuffles and three multiply-adds per input row,
 * each input row's sum in its own register. Where two vectors would pass the plane's end or a pad column (W odd), they
 * come from a zero-padded copy of 2 V floats.
 * (The phase copy's de-interleave, then the window over the copy and a store from it: MobileNetV3-small's 3 x 3
 * stride-2 convs on 112 and 56-wide planes spent three quarters of their time copying and storing.) */
static inline __attribute__((always_inline)) void RLX_CONV_DW2_FN(const float *restrict x, const float *restrict w,
        float bias, const rlx_conv_geom *g, int64_t oh, float *restrict row)
{
    const int64_t V = RLX_CONV_TILE_V;
    for (int64_t o0 = 0; o0 < g->OW; o0 += V) {
        RLX_CONV_TILE_T s[3] = {(RLX_CONV_TILE_T){0.0f} + bias, (RLX_CONV_TILE_T){0.0f}, (RLX_CONV_TILE_T){0.0f}};
        const int64_t c0 = 2 * o0;  /* the input column of tap kw = 1 of output column o0 */
        #pragma GCC unroll 3
        for (int kh = 0; kh < 3; kh++) {
            const int64_t ih = oh * 2 - g->PH + kh;
            if (ih < 0 || ih >= g->H)
                continue;
            RLX_CONV_TILE_T prev, even, odd;
            RLX_CONV_S2_TAPS_FN(x + ih * g->W, c0, g, ih, 0.0f, &prev, &even, &odd);
            s[kh] += w[kh * 3] * prev + w[kh * 3 + 1] * even + w[kh * 3 + 2] * odd;
        }
        *(RLX_CONV_TILE_TU *)(row + o0) = s[0] + s[1] + s[2];
    }
}

/* Lane by lane: v where v > a or v is a NaN, else a (a max pool's rule: a NaN met is taken and kept, as
 * rlx_pool_max_phases). */
static inline __attribute__((always_inline)) RLX_CONV_TILE_T RLX_POOL_TAKE_FN(const RLX_CONV_TILE_T a,
        const RLX_CONV_TILE_T v)
{
    const RLX_CONV_TILE_I take = (v > a) | (v != v);
    return (RLX_CONV_TILE_T)((take & (RLX_CONV_TILE_I)v) | (~take & (RLX_CONV_TILE_I)a));
}

/* One output row oh of a 3 x 3, stride-2, undilated max pool (left and top pads 1; PoolPlan layout nchw_rows) read
 * straight from the plane x[H, W], no phase copy: row[ow] = the max of x[2 oh - 1 + kh, 2 ow - 1 + kw] over the
 * window's cells inside the plane, for ow < OW; row holds OW rounded up to V floats. As rlx_conv_dw_s2_row<V>: V
 * outputs at a time from two vectors of input columns split into even (kw = 1) and odd (kw = 2) lanes, the odd ones
 * moved one lane up behind column 2 ow0 - 1 (kw = 0); -inf in the pads; taps taken in the window's order. */
static inline __attribute__((always_inline)) void RLX_POOL_MAX2_FN(const float *restrict x, const rlx_conv_geom *g,
        int64_t oh, float *restrict row)
{
    const int64_t V = RLX_CONV_TILE_V;
    const RLX_CONV_TILE_T none = (RLX_CONV_TILE_T){0.0f} - INFINITY;
    for (int64_t o0 = 0; o0 < g->OW; o0 += V) {
        RLX_CONV_TILE_T m = none;
        const int64_t c0 = 2 * o0;  /* the input column of tap kw = 1 of output column o0 */
        #pragma GCC unroll 3
        for (int kh = 0; kh < 3; kh++) {
            const int64_t ih = oh * 2 - g->PH + kh;
            if (ih < 0 || ih >= g->H)
                continue;
            RLX_CONV_TILE_T prev, even, odd;
            RLX_CONV_S2_TAPS_FN(x + ih * g->W, c0, g, ih, -INFINITY, &prev, &even, &odd);
            m = RLX_POOL_TAKE_FN(m, prev);
            m = RLX_POOL_TAKE_FN(m, even);
            m = RLX_POOL_TAKE_FN(m, odd);
        }
        *(RLX_CONV_TILE_TU *)(row + o0) = m;
    }
}

/* Lane j of the result: v[j + s] where 0 <= j + s < V, else 0, for |s| <= 4 (a constant where inlined: one shuffle). */
static inline __attribute__((always_inline)) RLX_CONV_TILE_T RLX_CONV_SHIFT_FN(const RLX_CONV_TILE_T v, const int s)
{
    const RLX_CONV_TILE_T z = {0.0f};
    switch (s) {
#if RLX_CONV_TILE_V == 16
    case -4: return __builtin_shufflevector(v, z, 16, 16, 16, 16, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    case -3: return __builtin_shufflevector(v, z, 16, 16, 16, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
    case -2: return __builtin_shufflevector(v, z, 16, 16, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13);
    case -1: return __builtin_shufflevector(v, z, 16, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14);
    case 1: return __builtin_shufflevector(v, z, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
    case 2: return __builtin_shufflevector(v, z, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 16);
    case 3: return __builtin_shufflevector(v, z, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 16, 16);
    case 4: return __builtin_shufflevector(v, z, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 16, 16, 16);
#else
    case -4: return __builtin_shufflevector(v, z, 8, 8, 8, 8, 0, 1, 2, 3);
    case -3: return __builtin_shufflevector(v, z, 8, 8, 8, 0, 1, 2, 3, 4);
    case -2: return __builtin_shufflevector(v, z, 8, 8, 0, 1, 2, 3, 4, 5);
    case -1: return __builtin_shufflevector(v, z, 8, 0, 1, 2, 3, 4, 5, 6);
    case 1: return __builtin_shufflevector(v, z, 1, 2, 3, 4, 5, 6, 7, 8);
    case 2: return __builtin_shufflevector(v, z, 2, 3, 4, 5, 6, 7, 8, 8);
    case 3: return __builtin_shufflevector(v, z, 3, 4, 5, 6, 7, 8, 8, 8);
    case 4: return __builtin_shufflevector(v, z, 4, 5, 6, 7, 8, 8, 8, 8);
#endif
    default: return v;
    }
}

/* A depthwise window w[KH, KW] of strides SH, SW in {1, 2}, undilated, over a plane x[H, W] whose output rows fit one
 * vector, as do its input rows (two vectors with SW 2), with at most V output rows (W <= SW V, OW, OH <= V; ConvPlan
 * layout nchw_row_shifts): out[oh * V + ow] = bias + sum of w[kh, kw] * x[SH oh - PH + kh, SW ow - PW + kw] (zeros
 * outside the plane) for ow < OW. Straight from the plane, every output row accumulated in a register of its own:
 * each input row is loaded once (lanes W.. zeroed; from `tail`, rlx_conv_dw_s1_tail<V>'s copy of the plane's last
 * floats, where the vectors would pass the plane's end), with SW 2 split into its even and odd columns, and for each
 * tap column kw moved d = kw - PW lanes (SW 2: the even columns moved d / 2 lanes for an even d, the odd ones
 * (d - 1) / 2 for an odd one; |d| <= 4: one shuffle each) and multiplied into the output rows it reaches. Inlined
 * with the conv's geometry as constants, the loops unroll whole. (The phase copy, the window over the WQ-wide copy
 * and a store from it: MobileNetV3-small's 5 x 5 convs on 7 x 7 planes spent half their time in the copy and store;
 * a row at a time, every input row shifted again for each output row it reaches, the shuffles bound it.) */
static inline __attribute__((always_inline)) void RLX_CONV_DWS_FN(const float *restrict x, const float *restrict w,
        float bias, const rlx_conv_geom *g, const float *restrict tail, float *restrict out)
{
    const int64_t V = RLX_CONV_TILE_V, HW = g->H * g->W, T = HW < 4 * V ? HW : 4 * V, RW = g->SW * V;
    RLX_CONV_TILE_I lane;
    for (int j = 0; j < RLX_CONV_TILE_V; j++)
        lane[j] = j;
    const RLX_CONV_TILE_I keep = lane < (int)g->W, keep_b = lane + RLX_CONV_TILE_V < (int)g->W;  /* -1 in lanes < W */
    RLX_CONV_TILE_T acc[RLX_CONV_TILE_V];
    #pragma GCC unroll 16
    for (int64_t oh = 0; oh < g->OH; oh++)
        acc[oh] = (RLX_CONV_TILE_T){0.0f} + bias;
    #pragma GCC unroll 32
    for (int64_t ih = 0; ih < g->H; ih++) {
        const float *restrict src = ih * g->W + RW <= HW ? x + ih * g->W : tail + (ih * g->W - (HW - T));
        RLX_CONV_TILE_T even = *(const RLX_CONV_TILE_TU *)src, odd = even;
        even = (RLX_CONV_TILE_T)((RLX_CONV_TILE_I)even & keep);
        if (g->SW == 2) {
            RLX_CONV_TILE_T b = *(const RLX_CONV_TILE_TU *)(src + V);
            b = (RLX_CONV_TILE_T)((RLX_CONV_TILE_I)b & keep_b);
            odd = __builtin_shufflevector(even, b, RLX_CONV_DW2_ODD);
            even = __builtin_shufflevector(even, b, RLX_CONV_DW2_EVEN);
        }
        RLX_CONV_TILE_T sh[9];
        #pragma GCC unroll 9
        for (int64_t kw = 0; kw < g->KW; kw++) {
            const int d = (int)(kw - g->PW);
            sh[kw] = g->SW == 1 ? RLX_CONV_SHIFT_FN(even, d) : RLX_CONV_SHIFT_FN(d & 1 ? odd : even, d >> 1);
        }
        #pragma GCC unroll 9
        for (int64_t kh = 0; kh < g->KH; kh++) {
            const int64_t r = ih + g->PH - kh, oh = r / g->SH;  /* output row oh reads input row ih with tap row kh */
            if (r < 0 || r % g->SH != 0 || oh >= g->OH)
                continue;
            #pragma GCC unroll 9
            for (int64_t kw = 0; kw < g->KW; kw++)
                acc[oh] += w[kh * g->KW + kw] * sh[kw];
        }
    }
    #pragma GCC unroll 16
    for (int64_t oh = 0; oh < g->OH; oh++)
        *(RLX_CONV_TILE_TU *)(out + oh * V) = acc[oh];
}

/* The last min(H W, 4 V) floats of a plane x[H, W] then 2 V zeros, into tail: rlx_conv_dw_s1_plane<V>'s rows near
 * the plane's end. */
static inline __attribute__((always_inline)) void RLX_CONV_DWT_FN(const float *restrict x, const rlx_conv_geom *g,
        float *restrict tail)
{
    const int64_t V = RLX_CONV_TILE_V, HW = g->H * g->W, T = HW < 4 * V ? HW : 4 * V;
    for (int64_t i = 0; i < T; i++)
        tail[i] = x[HW - T + i];
    for (int64_t i = T; i < T + 2 * V; i++)
        tail[i] = 0.0f;
}

/* r[i] lane j <- r[j] lane i: a V x V transpose in registers, log2(V) rounds of two-vector shuffles (round s: rows i
 * and i + s of each group of 2 s rows swap their off-diagonal s-lane blocks). */
static inline __attribute__((always_inline)) void RLX_CONV_TRANSPOSE_FN(RLX_CONV_TILE_T *r)
{
    RLX_CONV_TILE_T t[RLX_CONV_TILE_V];
#if RLX_CONV_TILE_V == 16
    #pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[i] = __builtin_shufflevector(r[i], r[i + 8], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
        t[i + 8] = __builtin_shufflevector(r[i], r[i + 8], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
    #pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        if (i % 8 < 4) {
            r[i] = __builtin_shufflevector(t[i], t[i + 4], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
            r[i + 4] = __builtin_shufflevector(t[i], t[i + 4], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
        }
    #pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        if (i % 4 < 2) {
            t[i] = __builtin_shufflevector(r[i], r[i + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
            t[i + 2] = __builtin_shufflevector(r[i], r[i + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
        }
    #pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        r[i] = __builtin_shufflevector(t[i], t[i + 1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
        r[i + 1] = __builtin_shufflevector(t[i], t[i + 1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    }
#else
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[i] = __builtin_shufflevector(r[i], r[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        t[i + 4] = __builtin_shufflevector(r[i], r[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
    #pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        if (i % 4 < 2) {
            r[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            r[i + 2] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    #pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 2, 10, 4, 12, 6, 14);
        t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    }
    #pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        r[i] = t[i];
#endif
}

/* V output channels of R <= V consecutive output pixels of one row of a conv with the output channels in the lanes
 * (`direct` on `nchw_lanes`): out[o * V + p] = bias[o] + the sum over c < C, kh0 <= kh < kh1, J0 <= j < J1 of
 * wt[((c KH + kh) KW + kw) V + o] * x[at + c CS + kh RK + j], j = p SW + kw DW, for p < R (lanes p >= R of each
 * row of out: the bias, never stored). wt: the V channels' block of the weight, [C*KH*KW][V]; at: where the pixels'
 * receptive field starts (input row ih0, column iw0: before the plane where the window passes its edges). The window
 * rows kh < kh0 and kh >= kh1 (runtime) and the columns j < J0 and j >= J1 (constants of each call: the first and
 * last runs of a row) are pads, skipped, so every run reads the input itself, no padded copy. The channels are the
 * lanes: one accumulator a pixel, and each input value of a window row is broadcast once and multiplied by every
 * weight vector of that row it meets (its KW weight vectors in registers: a 7 x 7 stride-2 row, 37 broadcasts and 7
 * loads for 112 multiply-adds, where a broadcast per (pixel, tap) needed 119; a 3 x 3 stride-2 row of 14 pixels, 29
 * and 3 for 42). The accumulators are transposed in registers into rows of pixels, one per output channel. Inlined
 * into each conv with its window and run as constants: the loops over the row's columns and taps unroll whole, which
 * (pixel, tap) a column feeds known at compile time. */
static inline __attribute__((always_inline)) void RLX_CONV_LANES_FN(const float *restrict x, const int64_t at,
        const int64_t RK, const int64_t CS, const int64_t C, const int64_t KH, const int64_t kh0, const int64_t kh1,
        const int64_t KW, const int64_t SW, const int64_t DW, const int64_t R, const int64_t J0, const int64_t J1,
        const float *restrict wt, const float *restrict bias, float *restrict out)
{
    enum { V = RLX_CONV_TILE_V };
    const int64_t TC = (R - 1) * SW + (KW - 1) * DW + 1;  /* input columns the pixels' window rows span */
    RLX_CONV_TILE_T acc[RLX_CONV_TILE_V];
    RLX_CONV_TILE_T b = {0.0f};
    if (bias)
        b = *(const RLX_CONV_TILE_TU *)bias;
    #pragma GCC unroll 16
    for (int p = 0; p < V; p++)
        acc[p] = b;
    for (int64_t c = 0; c < C; c++)
        for (int64_t kh = kh0; kh < kh1; kh++) {
            const int64_t r0 = at + c * CS + kh * RK;  /* the window row's first column (maybe a pad: j < J0) */
            const float *restrict wr = wt + (c * KH + kh) * KW * V;
            RLX_CONV_TILE_T w[16];  /* the row's KW weight vectors (KW <= 16: lanes_fit) */
            #pragma GCC unroll 16
            for (int64_t kw = 0; kw < KW; kw++)
                w[kw] = *(const RLX_CONV_TILE_TU *)(wr + kw * V);
            #pragma GCC unroll 64
            for (int64_t j = 0; j < TC; j++) {
                if (j < J0 || j >= J1)
                    continue;
                const float v = x[r0 + j];
                #pragma GCC unroll 16
                for (int64_t kw = 0; kw < KW; kw++)
                    if (j >= kw * DW && (j - kw * DW) % SW == 0 && (j - kw * DW) / SW < R)
                        acc[(j - kw * DW) / SW] += v * w[kw];
            }
        }
    RLX_CONV_TRANSPOSE_FN(acc);
    #pragma GCC unroll 16
    for (int o = 0; o < V; o++)
        *(RLX_CONV_TILE_TU *)(out + o * V) = acc[o];
}

#undef RLX_CONV_LANES_FN
#undef RLX_POOL_MAX2_FN
#undef RLX_POOL_TAKE_FN
#undef RLX_CONV_TRANSPOSE_FN
#undef RLX_CONV_DWT_FN
#undef RLX_CONV_DWS_FN
#undef RLX_CONV_SHIFT_FN
#undef RLX_CONV_TILE_I
#undef RLX_CONV_DW2_FN
#undef RLX_CONV_S2_TAPS_FN
#undef RLX_CONV_DW2_EVEN
#undef RLX_CONV_DW2_ODD
#undef RLX_CONV_DW2_PREV
#undef RLX_CONV_DW_FN
#undef RLX_CONV_DW_NV
#undef RLX_CONV_DW_G
#undef RLX_CONV_TILE_FN
#undef RLX_CONV_UNIT_FN
#undef RLX_CONV_TILE_PX
#undef RLX_CONV_TILE_V
#undef RLX_CONV_TILE_T
#undef RLX_CONV_TILE_TU
