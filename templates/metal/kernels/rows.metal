/* ── rows: layer / RMS norm, softmax, reductions ───────────────────────── */

/* The value a (fused residual) norm normalizes: x + residual (+ bias). */
template <typename T, bool RES, bool BIAS>
inline float rlx_norm_in(device const T *x, device const T *res, device const T *bias, long row, int n, int j)
{
    float v = rlx_f(x[row * n + j]);
    if (RES) v += rlx_f(res[row * n + j]);
    if (BIAS) v += rlx_f(bias[j]);
    return v;
}

/* One row per threadgroup of `tpr` threads (whole simdgroups): two passes over the row for the mean
 * and the variance (threadgroup sums), a third writes the output. */
template <typename T, bool RMS, bool RES, bool BIAS, typename S>
inline void rlx_norm_row(device const T *x, device const T *res, device const T *bias, device const T *gamma,
                         device const T *beta, device T *out, long row, int n, float eps, S scratch, uint tid,
                         uint tpr, uint lane, uint sg)
{
    float mean = 0.0f;
    if (!RMS) {
        float s = 0.0f;
        for (int j = int(tid); j < n; j += int(tpr)) s += rlx_norm_in<T, RES, BIAS>(x, res, bias, row, n, j);
        mean = rlx_tg_sum(s, scratch, tid, tpr, lane, sg) / float(n);
    }
    float q = 0.0f;
    for (int j = int(tid); j < n; j += int(tpr)) {
        const float d = rlx_norm_in<T, RES, BIAS>(x, res, bias, row, n, j) - mean;
        q += d * d;
    }
    const float rstd = 1.0f / sqrt(rlx_tg_sum(q, scratch, tid, tpr, lane, sg) / float(n) + eps);
    for (int j = int(tid); j < n; j += int(tpr)) {
        float y = (rlx_norm_in<T, RES, BIAS>(x, res, bias, row, n, j) - mean) * rstd * rlx_f(gamma[j]);
        if (!RMS) y += rlx_f(beta[j]);
        out[row * n + j] = rlx_to<T>(y);
    }
}

/* Softmax of one row per threadgroup: threadgroup max, then sum of exp, then the normalized values. */
template <typename T, typename S>
inline void rlx_softmax_row(device const T *x, device T *out, long row, long n, S scratch, uint tid, uint tpr,
                            uint lane, uint sg)
{
    float m = -INFINITY;
    for (long j = tid; j < n; j += tpr) m = rlx_max(m, rlx_f(x[row * n + j]));
    m = rlx_tg_max(m, scratch, tid, tpr, lane, sg);
    float s = 0.0f;
    for (long j = tid; j < n; j += tpr) s += exp(rlx_f(x[row * n + j]) - m);
    s = rlx_tg_sum(s, scratch, tid, tpr, lane, sg);
    for (long j = tid; j < n; j += tpr) out[row * n + j] = rlx_to<T>(exp(rlx_f(x[row * n + j]) - m) / s);
}

/* Softmax along a middle axis: one thread per (outer, inner) column, walking the axis three times. */
template <typename T>
inline void rlx_softmax_col(device const T *x, device T *out, long col, long n, long inner)
{
    const long base = (col / inner) * n * inner + col % inner;
    float m = -INFINITY;
    for (long j = 0; j < n; ++j) m = rlx_max(m, rlx_f(x[base + j * inner]));
    float s = 0.0f;
    for (long j = 0; j < n; ++j) s += exp(rlx_f(x[base + j * inner]) - m);
    for (long j = 0; j < n; ++j) out[base + j * inner] = rlx_to<T>(exp(rlx_f(x[base + j * inner]) - m) / s);
}

enum { RLX_RED_SUM = 0, RLX_RED_MEAN, RLX_RED_MAX, RLX_RED_MIN, RLX_RED_PROD };

template <int FN, typename A> inline A rlx_red_init()
{
    return FN == RLX_RED_PROD ? A(1) : A(0);
}
template <int FN, typename A> inline A rlx_red_step(A acc, A v, bool first)
{
    switch (FN) {
    case RLX_RED_MAX: return first ? v : rlx_max(acc, v);
    case RLX_RED_MIN: return first ? v : rlx_min(acc, v);
    case RLX_RED_PROD: return A(acc * v);
    default: return A(acc + v);
    }
}
