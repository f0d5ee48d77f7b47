/* ── GGUF block formats: one value of a quantized row, dequantized exactly as GGUF defines it ─────── */
/* The block layouts are documented in rlx/ir/quant.py (the reference). Every product and sum below is
 * the same float32 operation in the same order as there; bytes are read one at a time (blocks are not
 * aligned for wider loads), f16 scales through as_type<half>. */

enum { RLX_Q8_0 = 0, RLX_Q4_0, RLX_Q4_1, RLX_Q5_0, RLX_Q5_1, RLX_Q4_K, RLX_Q6_K };

inline float rlx_q_f16(device const uchar *p)
{
    return float(as_type<half>(ushort(ushort(p[0]) | (ushort(p[1]) << 8))));
}
inline uint rlx_q_u32(device const uchar *p)
{
    return uint(p[0]) | (uint(p[1]) << 8) | (uint(p[2]) << 16) | (uint(p[3]) << 24);
}
/* value j (0..31) of 16 bytes of nibbles: low nibbles are values 0..15, high nibbles 16..31 */
inline uint rlx_q_nibble(device const uchar *qs, int j)
{
    return j < 16 ? uint(qs[j] & 15) : uint(qs[j - 16] >> 4);
}

/* Value k of a row of blocks (format FMT). */
template <int FMT> inline float rlx_dequant(device const uchar *row, int k)
{
    if (FMT == RLX_Q8_0) {
        device const uchar *b = row + (k / 32) * 34;
        return float(as_type<char>(b[2 + k % 32])) * rlx_q_f16(b);
    } else if (FMT == RLX_Q4_0) {
        device const uchar *b = row + (k / 32) * 18;
        return rlx_q_f16(b) * (float(rlx_q_nibble(b + 2, k % 32)) - 8.0f);
    } else if (FMT == RLX_Q4_1) {
        device const uchar *b = row + (k / 32) * 20;
        return rlx_q_f16(b) * float(rlx_q_nibble(b + 4, k % 32)) + rlx_q_f16(b + 2);
    } else if (FMT == RLX_Q5_0) {
        device const uchar *b = row + (k / 32) * 22;
        const int j = k % 32;
        const uint q = rlx_q_nibble(b + 6, j) | (((rlx_q_u32(b + 2) >> j) & 1u) << 4);
        return rlx_q_f16(b) * (float(q) - 16.0f);
    } else if (FMT == RLX_Q5_1) {
        device const uchar *b = row + (k / 32) * 24;
        const int j = k % 32;
        const uint q = rlx_q_nibble(b + 8, j) | (((rlx_q_u32(b + 4) >> j) & 1u) << 4);
        return rlx_q_f16(b) * float(q) + rlx_q_f16(b + 2);
    } else if (FMT == RLX_Q4_K) {
        device const uchar *b = row + (k / 256) * 144;
        const int j = k % 256, s = j / 32, i = j % 32;
        device const uchar *sc = b + 4;
        uint scale, mn;
        if (s < 4) {
            scale = sc[s] & 63;
            mn = sc[s + 4] & 63;
        } else {
            scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
            mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
        }
        const uint q = (b[16 + (s / 2) * 32 + i] >> (4 * (s & 1))) & 15;
        const float ds = rlx_q_f16(b) * float(scale), dm = rlx_q_f16(b + 2) * float(mn);
        return ds * float(q) - dm;
    } else {  /* RLX_Q6_K */
        device const uchar *b = row + (k / 256) * 210;
        const int j = k % 256, h = j / 128, g = (j % 128) / 32, i = j % 32;
        device const uchar *ql = b + h * 64 + (g & 1) * 32;
        const uint lo = (g < 2) ? uint(ql[i] & 15) : uint(ql[i] >> 4);
        const uint hi = (uint(b[128 + h * 32 + i]) >> (2 * g)) & 3;
        const int q = int(as_type<char>(uchar(lo | (hi << 4)))) - 32;
        const float ds = rlx_q_f16(b + 208) * float(as_type<char>(b[192 + j / 16]));
        return ds * float(q);
    }
}

/* y[m, n] = sum_k x[m, k] w[n, k]: one simdgroup per output, lanes striding over K, then simd_sum. */
template <int FMT>
inline void rlx_dequant_dot(device const float *x, device const uchar *w, device float *y, long m, long n, long N,
                            int K, int row_bytes, uint lane)
{
    device const float *xr = x + m * K;
    device const uchar *wr = w + n * row_bytes;
    float acc = 0.0f;
    for (int k = int(lane); k < K; k += 32) acc += xr[k] * rlx_dequant<FMT>(wr, k);
    acc = simd_sum(acc);
    if (lane == 0) y[m * N + n] = acc;
}
