/* State-space and linear-attention recurrences: Mamba's selective scan, the gated delta rule,
 * and the causal depthwise conv1d they sit next to.
 * A fixed RLX kernel header: no template code; included by generated files that use these ops.
 *
 * Every recurrence is sequential in time and independent across (batch, head): a task owns one
 * batch row and a block of heads/channels, keeps their state in a small local array (registers
 * and L1), and streams the sequence once. Tasks are spread over the OpenMP team. */
#ifndef RLX_KERNELS_SSM_H
#define RLX_KERNELS_SSM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Channels per selective-scan task: their states (RLX_SSM_HB x n floats) stay in L1 for the
 * whole sequence while B_t and C_t, shared by every channel, are read once per step. */
#define RLX_SSM_HB 16
/* Largest state sizes the kernels keep on the stack (the rules refuse larger ones). */
#define RLX_SSM_MAX_N 256
#define RLX_GDN_MAX_N 128

/* Mamba selective scan (ops_ssm.SelectiveScan), f32.
 * x, dt: [B, S, H]; A: [H, N]; Bm, Cm: [B, S, N]; y: [B, S, H].
 *   s[h, :] = exp(dt[t, h] * A[h, :]) * s[h, :] + dt[t, h] * x[t, h] * Bm[t, :]
 *   y[t, h] = <s[h, :], Cm[t, :]>
 * The vector lanes run over a block of RLX_SSM_HB channels (contiguous in x, dt and y), the loop
 * over the state index n: B_t[n] and C_t[n] are broadcasts and y needs no horizontal sum. The
 * state is kept n-major ([N][HB]) next to the block's A, transposed once per task. Lanes past the
 * last channel run with dt = 0 (their state stays 0) and are not stored.
 * state0 (may be NULL: zeros) is the initial state and state1 (may be NULL: not kept) receives the
 * final one, both [B, H, N]; they may be the same buffer (a recurrent cache updated in place): a
 * task reads its rows before the scan and writes the same rows after it. */
static inline __attribute__((always_inline)) void rlx_selective_scan_f32(
    const float *restrict x, const float *restrict dt, const float *restrict A, const float *restrict Bm,
    const float *restrict Cm, const float *state0, float *state1, float *restrict y, int64_t B, int64_t S,
    int64_t H, int64_t N, int nthreads)
{
    const int64_t hblocks = (H + RLX_SSM_HB - 1) / RLX_SSM_HB;
    const int64_t tasks = B * hblocks;
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) if(tasks > 1 && B * S * H * N >= (1 << 14))
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t b = task / hblocks;
        const int64_t h0 = (task % hblocks) * RLX_SSM_HB;
        const int64_t hn = H - h0 < RLX_SSM_HB ? H - h0 : RLX_SSM_HB;
        float st[RLX_SSM_MAX_N][RLX_SSM_HB] __attribute__((aligned(64)));
        float at[RLX_SSM_MAX_N][RLX_SSM_HB] __attribute__((aligned(64)));
        for (int64_t n = 0; n < N; n++)
            for (int64_t hh = 0; hh < RLX_SSM_HB; hh++) {
                st[n][hh] = state0 && hh < hn ? state0[(b * H + h0 + hh) * N + n] : 0.0f;
                at[n][hh] = hh < hn ? A[(h0 + hh) * N + n] : 0.0f;
            }
        for (int64_t t = 0; t < S; t++) {
            const int64_t row = b * S + t;
            const float *restrict bt = Bm + row * N;
            const float *restrict ct = Cm + row * N;
            float d[RLX_SSM_HB] __attribute__((aligned(64)));
            float dx[RLX_SSM_HB] __attribute__((aligned(64)));
            float acc[RLX_SSM_HB] __attribute__((aligned(64)));
            for (int64_t hh = 0; hh < RLX_SSM_HB; hh++) {
                d[hh] = hh < hn ? dt[row * H + h0 + hh] : 0.0f;
                dx[hh] = hh < hn ? d[hh] * x[row * H + h0 + hh] : 0.0f;
                acc[hh] = 0.0f;
            }
            for (int64_t n = 0; n < N; n++) {
                const float bn = bt[n], cn = ct[n];
                float *restrict sn = st[n];
                const float *restrict an = at[n];
                #pragma omp simd aligned(sn, an, d, dx, acc : 64)
                for (int64_t hh = 0; hh < RLX_SSM_HB; hh++) {
                    /* rlx_expf vectorizes (kernels/scalar.h) */
                    const float v = rlx_expf(d[hh] * an[hh]) * sn[hh] + dx[hh] * bn;
                    sn[hh] = v;
                    acc[hh] += v * cn;
                }
            }
            for (int64_t hh = 0; hh < hn; hh++)
                y[row * H + h0 + hh] = acc[hh];
        }
        if (state1)
            for (int64_t hh = 0; hh < hn; hh++)
                for (int64_t n = 0; n < N; n++)
                    state1[(b * H + h0 + hh) * N + n] = st[n][hh];
    }
}

/* Gated delta rule (ops_ssm.GatedDeltaNet), f32.
 * q, k, v, o: [B, S, H, N]; g, beta: [B, S, H]; state0 (may be NULL: zeros) and state1 (may be NULL:
 * not kept): [B, H, N, N], S[i, j] with i the key index and j the value index. Per step:
 *   S *= exp(g);  u = beta * (v - S^T k);  S += k u^T;  o = S^T (scale * q)                    */
/* One (batch row, head) of the gated delta rule over the whole sequence. Inlined with N a constant
 * for the common state sizes (see the dispatch below), so the j loops vectorize with known trips. */
static inline __attribute__((always_inline)) void rlx_gdn_task(
    const float *restrict q, const float *restrict k, const float *restrict v, const float *restrict g,
    const float *restrict beta, const float *state0, float *state1, float *restrict o, int64_t task, int64_t S,
    int64_t H, const int64_t N, float scale)
{
    const int64_t b = task / H, h = task % H;
    /* the state lives in this task's stack frame: N*N floats (16 KiB at N=64) stay in L1 */
    float st[RLX_GDN_MAX_N * RLX_GDN_MAX_N] __attribute__((aligned(64)));
    float u[RLX_GDN_MAX_N] __attribute__((aligned(64)));
    float acc[RLX_GDN_MAX_N] __attribute__((aligned(64)));
    if (state0)
        memcpy(st, state0 + task * N * N, sizeof(float) * (size_t)(N * N));
    else
        memset(st, 0, sizeof(float) * (size_t)(N * N));
    for (int64_t t = 0; t < S; t++) {
        const int64_t off = ((b * S + t) * H + h) * N;
        const int64_t goff = (b * S + t) * H + h;
        const float *restrict qt = q + off, *restrict kt = k + off, *restrict vt = v + off;
        const float decay = rlx_expf(g[goff]), bt = beta[goff];
        /* pass 1: decay the state and read S^T k from it */
        for (int64_t j = 0; j < N; j++)
            u[j] = 0.0f;
        for (int64_t i = 0; i < N; i++) {
            float *restrict row = st + i * N;
            const float ki = kt[i];
            #pragma omp simd
            for (int64_t j = 0; j < N; j++) {
                row[j] *= decay;
                u[j] += row[j] * ki;
            }
        }
        #pragma omp simd
        for (int64_t j = 0; j < N; j++)
            u[j] = bt * (vt[j] - u[j]);
        /* pass 2: rank-1 update, and the output read from the updated state */
        for (int64_t j = 0; j < N; j++)
            acc[j] = 0.0f;
        for (int64_t i = 0; i < N; i++) {
            float *restrict row = st + i * N;
            const float ki = kt[i], qi = qt[i] * scale;
            #pragma omp simd
            for (int64_t j = 0; j < N; j++) {
                row[j] += ki * u[j];
                acc[j] += row[j] * qi;
            }
        }
        memcpy(o + off, acc, sizeof(float) * (size_t)N);
    }
    if (state1)
        memcpy(state1 + task * N * N, st, sizeof(float) * (size_t)(N * N));
}

static inline __attribute__((always_inline)) void rlx_gated_delta_net_f32(
    const float *restrict q, const float *restrict k, const float *restrict v, const float *restrict g,
    const float *restrict beta, const float *state0, float *state1, float *restrict o, int64_t B, int64_t S,
    int64_t H, int64_t N, float scale, int nthreads)
{
    const int64_t tasks = B * H;
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) if(tasks > 1 && S * N * N >= (1 << 12))
    for (int64_t task = 0; task < tasks; task++) {
        switch (N) {
        case 16: rlx_gdn_task(q, k, v, g, beta, state0, state1, o, task, S, H, 16, scale); break;
        case 32: rlx_gdn_task(q, k, v, g, beta, state0, state1, o, task, S, H, 32, scale); break;
        case 64: rlx_gdn_task(q, k, v, g, beta, state0, state1, o, task, S, H, 64, scale); break;
        case 128: rlx_gdn_task(q, k, v, g, beta, state0, state1, o, task, S, H, 128, scale); break;
        default: rlx_gdn_task(q, k, v, g, beta, state0, state1, o, task, S, H, N, scale); break;
        }
    }
}

/* Causal depthwise conv1d (ops_ssm.DepthwiseConv1dCausal), f32.
 * x, y: [B, S, C]; w: [C, K]; pad (may be NULL: zeros): [B, K-1, C].
 *   y[b, t, c] = sum_j w[c, j] * xp[b, t + j, c],  xp = pad ++ x along the sequence
 *   reverse:     sum_j w[c, j] * x[b, t + K-1 - j, c], zero past the end (the transpose) */
static void rlx_dwconv1d_causal_f32(const float *restrict x, const float *restrict w, const float *pad,
                                    float *restrict y, int64_t B, int64_t S, int64_t C, int64_t K, int reverse,
                                    int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static) if(B * S * C * K >= (1 << 15))
    for (int64_t r = 0; r < B * S; r++) {
        const int64_t b = r / S, t = r % S;
        float *restrict yr = y + r * C;
        for (int64_t c = 0; c < C; c++)
            yr[c] = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            /* causal: tap j reads row t + j - (K-1) (< 0: a row of the left pad);
             * reverse (the transpose): row t + (K-1) - j (>= S: zero) */
            const int64_t src = reverse ? t + (K - 1) - j : t + j - (K - 1);
            const float *restrict xr;
            if (reverse && src >= S)
                continue;
            if (src >= 0)
                xr = x + (b * S + src) * C;
            else if (pad)
                xr = pad + (b * (K - 1) + (K - 1) + src) * C;
            else
                continue;
            #pragma omp simd
            for (int64_t c = 0; c < C; c++)
                yr[c] += w[c * K + j] * xr[c];
        }
    }
}

/* The conv state after a carried depthwise conv (ops_ssm.DepthwiseConv1dCausal, carry_state):
 * state [B, K-1, C] becomes, per row, the last K-1 rows of (state, x[b, :lengths[b]]) — run after
 * the conv read the old state. Rows are shifted in ascending order, so a kept state row is read
 * before it is overwritten. Returns the first row whose length is outside [0, S] (-1: none; such
 * a row is left as it was). */
static int64_t rlx_conv_state_update_f32(const float *restrict x, float *restrict state,
                                         const int32_t *restrict lengths, int64_t B, int64_t S, int64_t C,
                                         int64_t K)
{
    int64_t bad = -1;
    const int64_t keep = K - 1;
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = lengths[b];
        if (len < 0 || len > S) {
            if (bad < 0)
                bad = b;
            continue;
        }
        float *restrict st = state + b * keep * C;
        for (int64_t j = 0; j < keep; j++) {
            const int64_t src = j + len; /* index into (state rows 0..keep-1, then x rows) */
            const float *restrict from = src < keep ? st + src * C : x + (b * S + src - keep) * C;
            if (from != st + j * C)
                memmove(st + j * C, from, (size_t)C * sizeof(float));
        }
    }
    return bad;
}

#endif /* RLX_KERNELS_SSM_H */
