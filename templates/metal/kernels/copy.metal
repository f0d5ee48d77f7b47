/* ── data movement: strided n-d copy, gather, rotary embedding ─────────── */

/* Element offsets of flat index `i` in an n-d space: source and destination strides per dim. */
struct RlxOffsets { long src; long dst; };
inline RlxOffsets rlx_nd_offsets(long i, int rank, thread const long *dims, thread const long *is,
                                 thread const long *os)
{
    RlxOffsets o = {0, 0};
    for (int d = rank - 1; d >= 0; --d) {
        const long c = i % dims[d];
        i /= dims[d];
        o.src += c * is[d];
        o.dst += c * os[d];
    }
    return o;
}

/* out[i] = table[outer, index[r], inner] for i = (outer, r, inner); an index outside [0, rows) sets the
 * error flag (the host raises) and writes zero. */
template <typename T, typename I>
inline void rlx_gather(device const T *table, device const I *index, device T *out, device int *flag, long i,
                       long rows, long nidx, long inner)
{
    const long c = i % inner;
    const long r = (i / inner) % nidx;
    const long o = i / (inner * nidx);
    const long k = long(index[r]);
    if (k < 0 || k >= rows) {
        *flag = 1;
        out[i] = T(0);
        return;
    }
    out[i] = table[(o * rows + k) * inner + c];
}

/* Rotary embedding of element i of x[B, S, width]: heads of `hd` dims, the first `rot` rotated in pairs
 * (neox: d with d + rot/2; interleaved: 2p with 2p+1); cos/sin are [S, rot/2] or per row [B, S, rot/2]. */
template <typename T, bool NEOX, bool PER_ROW>
inline void rlx_rope(device const T *x, device const T *cs, device const T *sn, device T *out, long i, long seq,
                     int width, int hd, int rot)
{
    const long row = i / width;           /* b * S + s */
    const int col = int(i % width);
    const int d = col % hd;
    if (d >= rot) {
        out[i] = x[i];
        return;
    }
    const int half_rot = rot / 2;
    const long trow = PER_ROW ? row : row % seq;
    int p, partner;
    float sign;
    if (NEOX) {
        p = d < half_rot ? d : d - half_rot;
        partner = d < half_rot ? d + half_rot : d - half_rot;
        sign = d < half_rot ? -1.0f : 1.0f;
    } else {
        p = d / 2;
        partner = (d % 2 == 0) ? d + 1 : d - 1;
        sign = (d % 2 == 0) ? -1.0f : 1.0f;
    }
    const float c = rlx_f(cs[trow * half_rot + p]), s = rlx_f(sn[trow * half_rot + p]);
    const float v = rlx_f(x[i]) * c + sign * rlx_f(x[i - d + partner]) * s;
    out[i] = rlx_to<T>(v);
}
