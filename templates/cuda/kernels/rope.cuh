/* Rotary embedding on [B, S, H*HD]; one thread per rotated pair, the unrotated tail copied through. */
template <typename T, bool NEOX>
__global__ void rlx_rope(const T *__restrict__ x, const T *__restrict__ cosb, const T *__restrict__ sinb,
                         T *__restrict__ out, int64_t rows_bs, int64_t seq, int heads, int hd, int rot) {
    int half = rot / 2;
    int per_head = half + (hd - rot);
    int64_t n = rows_bs * heads * per_head;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int p = (int)(i % per_head);
        int64_t t = i / per_head;
        int h = (int)(t % heads);
        int64_t row = t / heads;
        int64_t s = row % seq;
        int64_t base = row * (int64_t)heads * hd + (int64_t)h * hd;
        if (p >= half) {
            int d = rot + (p - half);
            out[base + d] = x[base + d];
            continue;
        }
        int i1 = NEOX ? p : 2 * p;
        int i2 = NEOX ? p + half : 2 * p + 1;
        float c = rlx_f(cosb[s * half + p]), sn = rlx_f(sinb[s * half + p]);
        float a = rlx_f(x[base + i1]), b = rlx_f(x[base + i2]);
        out[base + i1] = rlx_to<T>(a * c - b * sn);
        out[base + i2] = rlx_to<T>(b * c + a * sn);
    }
}
template <bool NEOX>
__global__ void rlx_rope_f64(const double *__restrict__ x, const double *__restrict__ cosb,
                             const double *__restrict__ sinb, double *__restrict__ out, int64_t rows_bs,
                             int64_t seq, int heads, int hd, int rot) {
    int half = rot / 2;
    int per_head = half + (hd - rot);
    int64_t n = rows_bs * heads * per_head;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int p = (int)(i % per_head);
        int64_t t = i / per_head;
        int h = (int)(t % heads);
        int64_t row = t / heads;
        int64_t s = row % seq;
        int64_t base = row * (int64_t)heads * hd + (int64_t)h * hd;
        if (p >= half) {
            int d = rot + (p - half);
            out[base + d] = x[base + d];
            continue;
        }
        int i1 = NEOX ? p : 2 * p;
        int i2 = NEOX ? p + half : 2 * p + 1;
        double c = cosb[s * half + p], sn = sinb[s * half + p];
        double a = x[base + i1], b = x[base + i2];
        out[base + i1] = a * c - b * sn;
        out[base + i2] = b * c + a * sn;
    }
}
