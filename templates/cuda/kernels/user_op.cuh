/* The calling convention of user-defined ops on CUDA (rlx.custom_op; rlx/ir/ops_user.py): a user op's function is
 *     int fn(const rlx_user_tensor *inputs, int32_t n_inputs, rlx_user_tensor *output, cudaStream_t stream);
 * a host function that launches its kernels on `stream` (no synchronization, no allocation: runs are captured as
 * CUDA Graphs) and returns 0, or a status the run reports as an error naming the op. Device tensors, row-major and
 * contiguous, in the session's device precision (`dtype`). */
#ifndef RLX_USER_OP_CUH
#define RLX_USER_OP_CUH
#include <stdint.h>

#define RLX_USER_MAX_RANK 8
enum { RLX_USER_F32 = 1, RLX_USER_F64 = 2, RLX_USER_F16 = 3, RLX_USER_BF16 = 4, RLX_USER_I8 = 5,
       RLX_USER_I32 = 6, RLX_USER_I64 = 7, RLX_USER_U8 = 8, RLX_USER_BOOL = 9 };

typedef struct rlx_user_tensor {
    void *data;
    int32_t dtype; /* one of RLX_USER_* */
    int32_t rank;
    int64_t numel;
    int64_t dims[RLX_USER_MAX_RANK];
} rlx_user_tensor;
#endif
