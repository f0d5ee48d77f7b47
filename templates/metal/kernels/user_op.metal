
/* ── user-defined ops (rlx.custom_op; rlx/ir/ops_user.py) ─────────────────── */
/* The calling convention of a user op's Metal function: an MSL function in the user's header,
 *     int fn(thread const rlx_user_tensor *inputs, int n_inputs, thread const rlx_user_tensor *output, long i);
 * called by one GPU thread per element of the output, with that element's row-major index `i`: it writes
 * output element i (it may read any element of any input) and returns 0, or a nonzero status, which fails
 * the run. Tensors are row-major and contiguous in the program buffer; `data` points at the first byte
 * (cast it to the element type `dtype` names, e.g. `(device const float *)inputs[0].data`). */
#define RLX_USER_MAX_RANK 8
enum { RLX_USER_F32 = 1, RLX_USER_F64 = 2, RLX_USER_F16 = 3, RLX_USER_BF16 = 4, RLX_USER_I8 = 5,
       RLX_USER_I32 = 6, RLX_USER_I64 = 7, RLX_USER_U8 = 8, RLX_USER_BOOL = 9 };

struct rlx_user_tensor {
    device uchar *data;
    int dtype; /* one of RLX_USER_* */
    int rank;
    long numel;
    long dims[RLX_USER_MAX_RANK];
};
