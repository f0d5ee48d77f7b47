/* ── attention: one simdgroup per (query row, head, batch), online softmax ── */
/* Flash-style: the scores are never stored. Lane l holds dims l, l + 32, ... of the query row and of
 * the output accumulator; each key's score is a simd_sum of the lanes' partial dot products, and the
 * running max / sum rescale the accumulator as keys stream by. A fully masked row gives zeros (as the
 * reference does). GQA: query head h reads kv head h / (H / Hkv). */

/* CACHED (cached_attention): k and v are KV caches of Skv rows per batch row; `mask` holds each batch
 * row's position p, and query i sees keys 0 .. p + i. */
enum { RLX_MASK_NONE = 0, RLX_MASK_CAUSAL, RLX_MASK_PADDING, RLX_MASK_BIAS, RLX_MASK_CACHED };

template <typename T, typename MT, int D, int H, int HKV, int MASK>
inline void rlx_attention_row(device const T *q, device const T *k, device const T *v, device const MT *mask,
                              device T *out, long b, int h, long i, long Sq, long Skv, float scale, long bs0,
                              long bs1, long bs2, long bs3, uint lane)
{
    constexpr int DPL = (D + 31) / 32;  /* dims per lane */
    const int hk = h / (H / HKV);
    device const T *qrow = q + (b * Sq + i) * (H * D) + h * D;
    float qv[DPL], acc[DPL];
    for (int t = 0; t < DPL; ++t) {
        const int d = int(lane) + 32 * t;
        qv[t] = d < D ? rlx_f(qrow[d]) * scale : 0.0f;
        acc[t] = 0.0f;
    }
    long last = Skv;
    if (MASK == RLX_MASK_CAUSAL) last = i + (Skv - Sq) + 1 < Skv ? i + (Skv - Sq) + 1 : Skv;  /* j <= i + Skv - Sq */
    if (MASK == RLX_MASK_CACHED) {
        const long p = long(mask[b]);
        last = p < 0 ? 0 : (p + i + 1 < Skv ? p + i + 1 : Skv);  /* out of range: the append raised the flag */
    }
    float m = -INFINITY, l = 0.0f;
    for (long j = 0; j < last; ++j) {
        if (MASK == RLX_MASK_PADDING && mask[b * Skv + j] == MT(0)) continue;
        device const T *krow = k + (b * Skv + j) * (HKV * D) + hk * D;
        float part = 0.0f;
        for (int t = 0; t < DPL; ++t) {
            const int d = int(lane) + 32 * t;
            if (d < D) part += qv[t] * rlx_f(krow[d]);
        }
        float s = simd_sum(part);
        if (MASK == RLX_MASK_BIAS) s += rlx_f(mask[b * bs0 + h * bs1 + i * bs2 + j * bs3]);
        if (s == -INFINITY) continue;
        const float m_new = rlx_max(m, s);
        const float corr = exp(m - m_new), p = exp(s - m_new);
        l = l * corr + p;
        device const T *vrow = v + (b * Skv + j) * (HKV * D) + hk * D;
        for (int t = 0; t < DPL; ++t) {
            const int d = int(lane) + 32 * t;
            acc[t] = acc[t] * corr + (d < D ? p * rlx_f(vrow[d]) : 0.0f);
        }
        m = m_new;
    }
    device T *orow = out + (b * Sq + i) * (H * D) + h * D;
    for (int t = 0; t < DPL; ++t) {
        const int d = int(lane) + 32 * t;
        if (d < D) orow[d] = rlx_to<T>(l > 0.0f ? acc[t] / l : 0.0f);
    }
}

/* cached_attention's append: element e of this step's k (or v) [B, S, W] goes to cache row
 * positions[b] + s; a position outside [0, T - S] sets the error flag (3) and writes nothing. */
template <typename T>
inline void rlx_cache_append(device const T *k, device const T *v, device T *kc, device T *vc, device const int *pos,
                             device int *flag, long e, long S, long T_cap, int W)
{
    const long b = e / (S * W), s = (e / W) % S, c = e % W;
    const long p = long(pos[b]);
    if (p < 0 || p + S > T_cap) {
        *flag = 3;
        return;
    }
    kc[(b * T_cap + p + s) * W + c] = k[e];
    vc[(b * T_cap + p + s) * W + c] = v[e];
}
