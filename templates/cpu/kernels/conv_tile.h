/* The direct conv's register tile and work unit for one vector width (kernels/conv.h includes this file once per
 * width). A fixed RLX kernel header: no template code.
 *
 * Before each inclusion conv.h defines RLX_CONV_TILE_V (floats per vector: 8 or 16, ConvPlan.vector),
 * RLX_CONV_TILE_T (a GCC/Clang vector type of that many floats) and RLX_CONV_TILE_TU (the same at any float's
 * address); this file defines, for V = RLX_CONV_TILE_V (a tile and panel: 2 V pixels, RLX_CONV_PX<V>),
 *   rlx_conv_direct_tile<V>  RLX_CONV_OR output channels x 2 V pixels accumulated in 12 vector registers;
 *   rlx_conv_direct_unit<V>  a block of output channels over a run of panels, RLX_CONV_CB input channels at a time;
 *   rlx_conv_dw_plane<V>     a depthwise window over one plane, RLX_DW_VEC outputs at a time;
 * and undefines the three parameters. No include guard: each inclusion is another width. */

#define RLX_CONV_CAT_(a, b) a##b
#define RLX_CONV_CAT(a, b) RLX_CONV_CAT_(a, b)
#define RLX_CONV_TILE_FN RLX_CONV_CAT(rlx_conv_direct_tile, RLX_CONV_TILE_V)
#define RLX_CONV_UNIT_FN RLX_CONV_CAT(rlx_conv_direct_unit, RLX_CONV_TILE_V)
#define RLX_CONV_TILE_PX (2 * RLX_CONV_TILE_V)
#define RLX_CONV_DW_FN RLX_CONV_CAT(rlx_conv_dw_plane, RLX_CONV_TILE_V)
#define RLX_CONV_DW_NV (RLX_DW_VEC / RLX_CONV_TILE_V)  /* vectors of a run of RLX_DW_VEC outputs: 4 or 2 */
#define RLX_CONV_DW_G (8 / RLX_CONV_DW_NV)  /* groups of taps summed apart: 8 independent chains of multiply-adds */

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

#undef RLX_CONV_DW_FN
#undef RLX_CONV_DW_NV
#undef RLX_CONV_DW_G
#undef RLX_CONV_TILE_FN
#undef RLX_CONV_UNIT_FN
#undef RLX_CONV_TILE_PX
#undef RLX_CONV_TILE_V
#undef RLX_CONV_TILE_T
#undef RLX_CONV_TILE_TU
