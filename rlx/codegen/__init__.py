"""rlx.codegen"""

# CPU rules kept in their own modules register into table("cpu") here, so that importing any
# codegen module (the toolchain imports rlx.codegen.c directly) leaves the table complete; doing
# it from c.py would make an import cycle (these modules build on c's emitter helpers).
import rlx.codegen.c_collectives  # noqa: F401  (collectives and the transport ABI)
from rlx.codegen import (  # noqa: F401
    c_control,
    c_conv,
    c_decoder,
    c_int8,
    c_lora,
    c_moe,
    c_quant,
    c_sample,
    c_scan,
    c_select,
    c_ssm,
    c_user_op,
)
