/* sample_top_k (rlx/ir/ops_sample.py): one token id per row of logits x [rows, n], sampled with the row's
 * uniform u in [0, 1) (double) and the run-time settings s = (temperature, top_k, top_p) (double).
 *
 * The top k of a row (k <= RLX_SAMPLE_TOP_K_MAX; value descending, ties by the lower index, NaN above every
 * number) are kept in a binary heap whose root is the worst kept item, so one pass over the vocabulary
 * costs a compare per value and a sift only for the few values that enter; the heap is then sorted in
 * place. The softmax weights, their running sums and the top_p / inverse-CDF comparisons are computed in
 * double in the reference's order (sequential sums), so the token equals the numpy reference's. NaN and
 * infinity are tested on the bits (rlx_isnan_f32 of kernels/argmax.h, included before this header): the result
 * does not depend on floating-point compiler flags. */

#define RLX_SAMPLE_TOP_K_MAX 256

typedef struct {
    float v;
    int32_t i;
} rlx_sample_item;

static inline int rlx_sample_finite(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof(b));
    return (b & 0x7f800000u) != 0x7f800000u;
}

/* a ranks before b: NaN first (lower index first among NaNs), then larger values, then the lower index */
static inline int rlx_sample_before(rlx_sample_item a, rlx_sample_item b) {
    const int an = rlx_isnan_f32(a.v), bn = rlx_isnan_f32(b.v);
    if (an || bn) return an && (!bn || a.i < b.i);
    return a.v > b.v || (a.v == b.v && a.i < b.i);
}

/* restore the heap below slot `at` (every parent ranks after its children: the root is the worst kept) */
static void rlx_sample_sift(rlx_sample_item *h, int64_t len, int64_t at) {
    for (;;) {
        int64_t worst = at;
        const int64_t l = 2 * at + 1, r = l + 1;
        if (l < len && rlx_sample_before(h[worst], h[l])) worst = l;
        if (r < len && rlx_sample_before(h[worst], h[r])) worst = r;
        if (worst == at) return;
        const rlx_sample_item t = h[at];
        h[at] = h[worst];
        h[worst] = t;
        at = worst;
    }
}

/* NULL when the settings and every u are valid, else `msg` filled with what is wrong */
static const char *rlx_sample_check(const double *s, const double *u, int64_t rows, char *msg, size_t cap) {
    const double t = s[0], k = s[1], p = s[2];
    if (!isfinite(t) || !(t >= 0.0))
        snprintf(msg, cap, "temperature must be a finite number >= 0, got %g", t);
    else if (!isfinite(k) || k != floor(k) || !(k >= 1.0))
        snprintf(msg, cap, "top_k must be an integer >= 1, got %g", k);
    else if (k > (double)RLX_SAMPLE_TOP_K_MAX)
        snprintf(msg, cap, "top_k %g is above the op's cap %d (sample on the host from the logits instead)",
                 k, RLX_SAMPLE_TOP_K_MAX);
    else if (!(p > 0.0 && p <= 1.0))
        snprintf(msg, cap, "top_p must be in (0, 1], got %g", p);
    else {
        for (int64_t r = 0; r < rows; r++)
            if (!(u[r] >= 0.0 && u[r] < 1.0)) {
                snprintf(msg, cap, "u must be in [0, 1), got %.17g (row %lld)", u[r], (long long)r);
                return msg;
            }
        return NULL;
    }
    return msg;
}

static int32_t rlx_sample_row_f32(const float *restrict x, int64_t n, double u, double temp, int64_t k,
                                  double top_p) {
    if (k > n) k = n;
    if (temp == 0.0 || k == 1) /* the argmax: first index on ties, the first NaN wins (kernels/argmax.h) */
        return (int32_t)rlx_argmax_row_f32(x, n);
    rlx_sample_item h[RLX_SAMPLE_TOP_K_MAX];
    for (int64_t j = 0; j < k; j++) h[j] = (rlx_sample_item){x[j], (int32_t)j};
    for (int64_t j = k / 2 - 1; j >= 0; j--) rlx_sample_sift(h, k, j);
    /* a later index never beats an equal kept value: one compare with the root rejects most of the row */
    for (int64_t j = k; j < n; j++) {
        const rlx_sample_item c = {x[j], (int32_t)j};
        if (rlx_sample_before(c, h[0])) {
            h[0] = c;
            rlx_sample_sift(h, k, 0);
        }
    }
    /* heap sort: the worst goes last, leaving h[0..k) best first */
    for (int64_t len = k - 1; len > 0; len--) {
        const rlx_sample_item t = h[0];
        h[0] = h[len];
        h[len] = t;
        rlx_sample_sift(h, len, 0);
    }
    if (!rlx_sample_finite(h[0].v)) return h[0].i; /* NaN or +-inf on top: it takes the row */
    double c[RLX_SAMPLE_TOP_K_MAX];
    const double top = (double)h[0].v;
    double run = 0.0;
    for (int64_t j = 0; j < k; j++) {
        run += exp(((double)h[j].v - top) / temp);
        c[j] = run;
    }
    int64_t m = k;
    if (top_p < 1.0) { /* the smallest prefix whose mass reaches top_p */
        const double want = top_p * c[k - 1];
        m = 0;
        while (m < k - 1 && !(c[m] >= want)) m++;
        m++;
    }
    const double target = u * c[m - 1];
    int64_t j = 0;
    while (j < m - 1 && !(c[j] > target)) j++;
    return h[j].i;
}

static void rlx_sample_top_k_f32(const float *restrict x, const double *restrict u, const double *restrict s,
                                 int32_t *restrict y, int64_t rows, int64_t n, int nt) {
    (void)nt;
    const double temp = s[0], top_p = s[2];
    const int64_t k = (int64_t)s[1];
    _Pragma("omp parallel for num_threads(nt) schedule(static) if(rows > 1 && rows * n >= 262144)")
    for (int64_t r = 0; r < rows; r++)
        y[r] = rlx_sample_row_f32(x + r * n, n, u[r], temp, k, top_p);
}
